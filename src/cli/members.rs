//! `redrive members`: the fleet's members seen recently.

use super::output::outln;
use super::table;
use crate::operations::Operations;

/// Prints the live members, as a table or the list envelope in JSON.
pub async fn print(operations: &Operations, json: bool) -> anyhow::Result<()> {
    let page = operations.members().await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = page
        .items
        .iter()
        .map(|m| {
            vec![
                m.id.clone(),
                m.host.clone(),
                m.version.clone(),
                m.roles.join(","),
                m.handlers.join(","),
                m.started_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                m.last_seen.format("%H:%M:%S").to_string(),
            ]
        })
        .collect();
    table::print(
        &[
            "MEMBER", "HOST", "VERSION", "ROLES", "HANDLERS", "STARTED", "SEEN",
        ],
        &rows,
    );
    Ok(())
}

//! `redrive members`: the fleet's members seen recently.

use super::table;
use crate::operations::Operations;

/// Prints the live members, as a table or the list envelope in JSON.
pub async fn print(operations: &Operations, json: bool) -> anyhow::Result<()> {
    let page = operations.members().await?;
    let header = [
        "MEMBER", "HOST", "VERSION", "ROLES", "HANDLERS", "STARTED", "SEEN",
    ];
    table::print_page(&page, json, &header, "no member seen recently", |m| {
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
}

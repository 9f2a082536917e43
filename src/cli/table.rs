//! Plain text tables for the operator verbs.

use serde::Serialize;

use super::output::{errln, out, outln};
use crate::operations::Page;

/// Prints a list verb's `page`: with `json`, the list envelope as the API answers it;
/// else one `row` per item under `header` (or `nothing` when it is empty), then the
/// option that shows the next page, if there is one (an empty page of a bounded search
/// has one: older tasks were not searched yet).
pub fn print_page<T: Serialize>(
    page: &Page<T>,
    json: bool,
    header: &[&str],
    nothing: &str,
    row: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(page)?);
        return Ok(());
    }
    if page.items.is_empty() {
        errln!("{nothing}");
    } else {
        let rows: Vec<Vec<String>> = page.items.iter().map(row).collect();
        print(header, &rows);
    }
    if let Some(cursor) = page.next_cursor {
        errln!("more: --after {cursor}");
    }
    Ok(())
}

/// Prints `rows` under `header`, each column as wide as its widest cell (cells are cut
/// to `MAX_CELL` characters).
pub fn print(header: &[&str], rows: &[Vec<String>]) {
    out!("{}", render(header, rows));
}

/// Longest cell shown.
const MAX_CELL: usize = 60;

/// The table as text.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let cut = |cell: &str| -> String {
        // Text from messages, downstreams and operators: no terminal escape obeyed.
        let cell = crate::readable::visible(cell);
        if cell.chars().count() > MAX_CELL {
            let mut short: String = cell.chars().take(MAX_CELL - 1).collect();
            short.push('…');
            short
        } else {
            cell.into_owned()
        }
    };
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|c| cut(c)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let mut out = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_long_cells_are_cut() {
        let long = "x".repeat(100);
        let text = render(
            &["ID", "STATUS"],
            &[
                vec!["1".into(), "failed".into()],
                vec!["12345".into(), long],
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "ID     STATUS");
        assert_eq!(lines[1], "1      failed");
        assert!(lines[2].ends_with('…') && lines[2].chars().count() == 7 + MAX_CELL);
    }
}

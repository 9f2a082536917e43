//! Plain text tables for the operator verbs.

use serde::Serialize;
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

use crate::operations::Page;
use crate::output::{errln, out, outln};

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
/// to [`MAX_CELL`] terminal columns).
pub fn print(header: &[&str], rows: &[Vec<String>]) {
    out!("{}", render(header, rows));
}

/// Widest cell shown, in terminal columns.
const MAX_CELL: usize = 60;

/// Columns `text` takes on a terminal (a CJK character two, a combining mark none).
fn columns(text: &str) -> usize {
    UnicodeWidthStr::width(text)
}

/// A cell as one line a terminal shows as it is: no escape obeyed ([`visible`]), a line
/// break or a tab written `\n` or `\t`, cut with `…` to [`MAX_CELL`] columns.
///
/// [`visible`]: crate::readable::visible
fn cell(text: &str) -> String {
    let text = crate::readable::visible(text)
        .replace('\n', "\\n")
        .replace('\t', "\\t");
    if columns(&text) <= MAX_CELL {
        return text;
    }
    let mut short = String::new();
    let mut width = 0;
    for c in text.chars() {
        let wide = UnicodeWidthChar::width(c).unwrap_or(0);
        if width + wide > MAX_CELL - 1 {
            break;
        }
        width += wide;
        short.push(c);
    }
    short.push('…');
    short
}

/// The table as text, each column as wide as its widest cell in terminal columns.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|c| cell(c)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| columns(h)).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(columns(cell));
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let mut out = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            out.push_str(cell);
            if i + 1 < cells.len() {
                out.push_str(&" ".repeat(width - columns(cell) + 2));
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

    /// Columns in terminal cells: a wide (CJK) character takes two, a tab or a line
    /// break in a cell is shown escaped and cannot move the columns after it.
    #[test]
    fn wide_characters_and_tabs_keep_the_columns() {
        let text = render(
            &["KEY", "STATUS"],
            &[
                vec!["注文".into(), "failed".into()],
                vec!["a\tb\nc".into(), "failed".into()],
                vec!["abc".into(), "failed".into()],
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        let status_column = |line: &str| {
            let head = &line[..line.find("STATUS").or(line.find("failed")).unwrap()];
            unicode_width::UnicodeWidthStr::width(head)
        };
        assert!(!text.contains('\t'), "a tab reached the terminal: {text:?}");
        assert!(lines[2].starts_with("a\\tb\\nc"), "{text:?}");
        let columns: Vec<usize> = lines.iter().map(|l| status_column(l)).collect();
        assert!(
            columns.iter().all(|c| *c == columns[0]),
            "{columns:?} in\n{text}"
        );
    }

    #[test]
    fn a_wide_cell_is_cut_to_the_cell_limit_in_columns() {
        let text = render(&["KEY"], &[vec!["注".repeat(100)]]);
        let row = text.lines().nth(1).unwrap();
        assert!(row.ends_with('…'), "{row}");
        assert!(
            unicode_width::UnicodeWidthStr::width(row) <= MAX_CELL,
            "{row}"
        );
    }
}

//! Plain text tables for the operator verbs.

use super::output::out;

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
        if cell.chars().count() > MAX_CELL {
            let mut short: String = cell.chars().take(MAX_CELL - 1).collect();
            short.push('…');
            short
        } else {
            cell.to_owned()
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

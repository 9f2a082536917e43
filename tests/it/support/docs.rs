//! The documentation as the tests read it: a file of the repository, a section of a
//! page, and the code blocks a section shows.

use std::path::{Path, PathBuf};

/// A path of the repository.
pub fn repository(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The text of a file of the repository (`README.md`, `docs/kafka.md`).
pub fn read(file: &str) -> String {
    std::fs::read_to_string(repository(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The section `## title` of `file`, from its heading to the next `## ` heading.
pub fn section(file: &str, title: &str) -> String {
    let text = read(file);
    let start = text
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("{file} has a section {title:?}"));
    let body = &text[start + 1..];
    let end = body[3..].find("\n## ").map_or(body.len(), |at| at + 3);
    body[..end].to_owned()
}

/// The code blocks of the section `## title` of `file` fenced as ```` ```lang ````.
pub fn blocks(file: &str, title: &str, lang: &str) -> Vec<String> {
    section(file, title)
        .split(&format!("```{lang}\n"))
        .skip(1)
        .map(|block| block.split("```").next().unwrap().to_owned())
        .collect()
}

/// The first ```` ```lang ```` block of the section `## title` of `file`.
pub fn block(file: &str, title: &str, lang: &str) -> String {
    (blocks(file, title, lang).into_iter().next())
        .unwrap_or_else(|| panic!("{file}: {title} shows {lang}"))
}

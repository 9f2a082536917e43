//! Every `redrive ...` command the README and the docs show inline parses as the CLI
//! parses it: an operator at 3 a.m. pastes them (a review found the runbook's
//! `tasks groups --watch 10s` refused).

use clap::Parser;

use super::Cli;

/// What the docs write for a value the reader fills in, and a value that stands for it.
const PLACEHOLDERS: [(&str, &str); 4] = [
    ("ID", "42"),
    ("IDS", "42 43"),
    ("TASK", "42"),
    ("S", "failed"),
];

/// The inline code spans of `text` (between single backticks, across line breaks) that
/// start with `redrive `, outside fenced blocks; not synopses (`[--for D]`, `list|show`,
/// `VERB`) nor pipelines.
fn commands(text: &str) -> Vec<String> {
    let mut prose = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            prose.push_str(line);
            prose.push(' ');
        }
    }
    (prose.split('`').skip(1).step_by(2))
        .map(|span| span.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|span| span.starts_with("redrive ") && !span.contains("..."))
        .filter(|span| !span.contains(['[', '|', '>']) && !span.contains("VERB"))
        .collect()
}

#[test]
fn every_command_the_docs_show_parses() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut pages = vec![format!("{root}/README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(format!("{root}/docs"))
        .expect("docs/")
        .filter_map(|entry| Some(entry.ok()?.path().display().to_string()))
        .filter(|path| path.ends_with(".md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut checked = 0;
    let mut refused = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("a page");
        for command in commands(&text) {
            let words: Vec<String> = shlex::split(&command)
                .unwrap_or_default()
                .iter()
                .flat_map(
                    |word| match PLACEHOLDERS.iter().find(|(name, _)| name == word) {
                        Some((_, value)) => value.split(' ').map(str::to_owned).collect(),
                        None => vec![word.clone()],
                    },
                )
                .collect();
            checked += 1;
            if let Err(error) = Cli::try_parse_from(&words) {
                // An option named in a sentence, its value left to the reader.
                let named = words.last().is_some_and(|word| word.starts_with("--"))
                    && error.kind() == clap::error::ErrorKind::InvalidValue;
                if !named
                    && !matches!(
                        error.kind(),
                        clap::error::ErrorKind::DisplayHelp
                            | clap::error::ErrorKind::DisplayVersion
                            | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                            | clap::error::ErrorKind::MissingRequiredArgument
                            | clap::error::ErrorKind::MissingSubcommand
                    )
                {
                    refused.push(format!("{page}: `{command}`: {}", error.kind()));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} commands found in {pages:?}");
    assert!(
        refused.is_empty(),
        "documented commands the CLI refuses:\n{}",
        refused.join("\n")
    );
}

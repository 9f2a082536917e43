//! Errors of the `config` crate (file and environment) as [`ConfigError`]s that name
//! the key and never show a value that may be secret.

use super::ConfigError;

/// Turns the `config` crate's error into one that names the key, without showing a
/// value that may be secret (see [`sanitized`]).
pub(super) fn from_config_error(err: config::ConfigError) -> ConfigError {
    let key = match &err {
        config::ConfigError::Type { key: Some(key), .. }
        | config::ConfigError::At { key: Some(key), .. } => key.clone(),
        _ => "config".to_owned(),
    };
    // The config crate writes array keys as `routes[0]mode`, and repeats the key at the
    // end of its message (` for key `routes[0]mode``): the error names it once, as written.
    let written = key
        .replace("]", "].")
        .replace("]..", "].")
        .trim_end_matches('.')
        .to_owned();
    let message = sanitized(&err, &written).replace(&format!(" for key `{key}`"), "");
    ConfigError::new(written, message)
}

/// The message of `err` about `key`. A string where `[database]`, `[kafka]` or
/// `[webhooks]` (or anything in them) belongs may hold a password, a Kafka secret or a
/// webhook credential, so it is described, not quoted; a TOML syntax error keeps its position and reason but not the
/// quoted line of the file, which may hold a secret.
fn sanitized(err: &config::ConfigError, key: &str) -> String {
    match err {
        config::ConfigError::FileParse { uri, cause } => {
            let text = cause.to_string();
            let lines: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !is_quoted_source(line))
                .collect();
            let file = uri.as_deref().unwrap_or("the configuration file");
            format!("{file}: {}", lines.join(": "))
        }
        other => {
            let text = other.to_string();
            // serde and the config crate write `invalid type: string "...", expected X`.
            match text.rfind(", expected ") {
                Some(at) if is_secret_key(key) && text.contains("invalid type: string") => {
                    format!("invalid type: a string{}", &text[at..])
                }
                _ => text,
            }
        }
    }
}

/// Keys whose values may be secrets: the database URL, Kafka properties and webhook
/// URLs and headers (or the tables above them, where a misplaced value lands).
fn is_secret_key(key: &str) -> bool {
    ["database", "kafka", "webhooks"]
        .iter()
        .any(|root| key == *root || key.starts_with(&format!("{root}.")))
}

/// A line of a TOML error that quotes the file: `12 | text` or a `|` marker line.
fn is_quoted_source(line: &str) -> bool {
    let before_bar = line.split('|').next().unwrap_or(line);
    line.contains('|') && before_bar.trim().chars().all(|c| c.is_ascii_digit())
}

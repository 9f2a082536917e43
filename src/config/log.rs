//! `[log]`: how a member writes its log lines.

use serde::Deserialize;

use super::ConfigError;

/// `[log]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// `text` (for people), `json` (one object per line, for collectors), or `auto`:
    /// text on a terminal, JSON otherwise.
    pub format: LogFormat,
    /// Level or filter directives (`info`, `redrive=debug,sqlx=warn`); `RUST_LOG`
    /// overrides it.
    pub level: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            format: LogFormat::Auto,
            level: "info".into(),
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Text on a terminal, JSON otherwise.
    Auto,
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl LogSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        tracing_subscriber::EnvFilter::try_new(&self.level)
            .map(|_| ())
            .map_err(|e| ConfigError::new("log.level", format!("not a level or filter: {e}")))
    }
}

//! Command-line filters and ids: which tasks an operator's verb is about.

use anyhow::bail;
use chrono::{DateTime, Utc};
use clap::Args;

use crate::config::parse_duration;
use crate::store::{Selection, TaskFilter};
use crate::task::{Status, TaskId};

/// Filter options shared by the task verbs.
#[derive(Debug, Clone, Default, Args)]
pub struct FilterArgs {
    /// Status: failed, resolved, permanent_failure, discarded (repeat or comma-separate).
    #[arg(long, value_delimiter = ',', value_parser = parse_status)]
    pub status: Vec<Status>,
    /// Handler name.
    #[arg(long)]
    pub handler: Option<String>,
    /// Ingest route name.
    #[arg(long)]
    pub route: Option<String>,
    /// Topic the failure was consumed from.
    #[arg(long)]
    pub topic: Option<String>,
    /// Message key, exactly.
    #[arg(long, conflicts_with = "key_prefix")]
    pub key: Option<String>,
    /// Message key prefix.
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// Text in the error (case-insensitive).
    #[arg(long)]
    pub error: Option<String>,
    /// Created at or after: RFC 3339 time, or a duration meaning that long ago ("2h").
    #[arg(long, value_parser = parse_time)]
    pub created_after: Option<DateTime<Utc>>,
    /// Created before: RFC 3339 time or a duration ago.
    #[arg(long, value_parser = parse_time)]
    pub created_before: Option<DateTime<Utc>>,
    /// Last changed at or after: RFC 3339 time or a duration ago.
    #[arg(long, value_parser = parse_time)]
    pub updated_after: Option<DateTime<Utc>>,
    /// Last changed before: RFC 3339 time or a duration ago.
    #[arg(long, value_parser = parse_time)]
    pub updated_before: Option<DateTime<Utc>>,
    /// Generation exactly: 1 for first failures, N for a message redrive produced that
    /// failed N-1 times again.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub generation: Option<i32>,
    /// Generation at least (2: every re-failure).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub min_generation: Option<i32>,
    /// The re-failures of this task (the tasks that came from it).
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub previous_task: Option<i64>,
}

impl FilterArgs {
    /// The filter these options describe, checked.
    pub fn filter(&self) -> anyhow::Result<TaskFilter> {
        let filter = TaskFilter {
            status: self.status.clone(),
            handler: self.handler.clone(),
            route: self.route.clone(),
            topic: self.topic.clone(),
            key: self.key.clone(),
            key_prefix: self.key_prefix.clone(),
            error: self.error.clone(),
            created_after: self.created_after,
            created_before: self.created_before,
            updated_after: self.updated_after,
            updated_before: self.updated_before,
            generation: self.generation,
            min_generation: self.min_generation,
            previous_task: self.previous_task.map(TaskId),
        };
        if let Err(reason) = filter.validate() {
            bail!("invalid filter: {reason}");
        }
        Ok(filter)
    }
}

/// Ids or a filter, for the bulk verbs.
#[derive(Debug, Clone, Args)]
pub struct SelectionArgs {
    /// Task ids; give these or filter options, not both.
    pub ids: Vec<i64>,
    /// Which tasks, when no ids are given.
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Act on every task (in a status the verb applies to): required when no id and
    /// no filter option is given.
    #[arg(long)]
    pub all: bool,
}

impl SelectionArgs {
    /// The selection, refusing ids with a filter, and a filter of everything without
    /// `--all`.
    pub fn selection(&self) -> anyhow::Result<Selection> {
        let filter = self.filter()?;
        if !self.ids.is_empty() {
            if !filter.is_everything() || self.all {
                bail!("give task ids or filter options (or --all), not both");
            }
            return Ok(Selection::Ids(
                self.ids.iter().copied().map(TaskId).collect(),
            ));
        }
        if filter.is_everything() && !self.all {
            bail!(
                "no task ids and no filter: this would select every task; \
                 pass --all if that is what you mean"
            );
        }
        Ok(Selection::Filter(filter))
    }

    fn filter(&self) -> anyhow::Result<TaskFilter> {
        self.filter.filter()
    }
}

/// A status by its stored name.
pub fn parse_status(text: &str) -> Result<Status, String> {
    text.parse().map_err(|_| {
        format!("unknown status {text:?} (failed, resolved, permanent_failure, discarded)")
    })
}

/// An RFC 3339 time, or a duration meaning that long before now.
pub fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.with_timezone(&Utc));
    }
    let ago = parse_duration(text)
        .map_err(|_| format!("{text:?} is neither an RFC 3339 time nor a duration like \"2h\""))?;
    chrono::TimeDelta::from_std(ago)
        .ok()
        .and_then(|ago| Utc::now().checked_sub_signed(ago))
        .ok_or_else(|| format!("{text:?} is too long ago"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_or_durations_ago() {
        let at = parse_time("2026-01-02T03:04:05Z").unwrap();
        assert_eq!(at.to_rfc3339(), "2026-01-02T03:04:05+00:00");
        let ago = Utc::now() - parse_time("2h").unwrap();
        assert!((ago.num_seconds() - 7200).abs() < 5, "{ago}");
        assert!(parse_time("yesterday").unwrap_err().contains("RFC 3339"));
        assert!(parse_time("100000000years").is_err());
    }

    #[test]
    fn statuses_are_named_as_stored() {
        assert_eq!(
            parse_status("permanent_failure"),
            Ok(Status::PermanentFailure)
        );
        assert!(parse_status("done").unwrap_err().contains("unknown status"));
    }
}

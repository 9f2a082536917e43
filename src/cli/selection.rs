//! Command-line filters and ids: which tasks an operator's verb is about, read as
//! written and handed to the operations layer, which reads them as the API does.

use clap::Args;

use crate::operations::{FilterParams, StatusNames};

/// Filter options shared by the task verbs.
#[derive(Debug, Clone, Default, Args)]
pub struct FilterArgs {
    /// Status: failed, resolved, permanent_failure, discarded (repeat or comma-separate).
    #[arg(long, value_delimiter = ',')]
    pub status: Vec<String>,
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
    #[arg(long)]
    pub key: Option<String>,
    /// Message key prefix.
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// Text in the error a task shows: its last attempt's, or before any attempt failed
    /// the one it was reported with (case-insensitive).
    #[arg(long)]
    pub error: Option<String>,
    /// Text in the error a task was first reported with: its dead letter's or its
    /// failed inline attempt's, whatever its attempts said since (case-insensitive).
    #[arg(long)]
    pub first_error: Option<String>,
    /// How its dead letter was given up: rejected or delivery_count_exceeded (a Kafka
    /// share group's).
    #[arg(long)]
    pub disposition: Option<String>,
    /// Created at or after: a time (RFC 3339, or `2026-12-03 10:15` / `2026-12-03` as
    /// UTC), or a duration meaning that long ago ("2h").
    #[arg(long)]
    pub created_after: Option<String>,
    /// Created before: a time or a duration ago, as for `--created-after`.
    #[arg(long)]
    pub created_before: Option<String>,
    /// Last changed at or after: a time or a duration ago, as for `--created-after`.
    #[arg(long)]
    pub updated_after: Option<String>,
    /// Last changed before: a time or a duration ago, as for `--created-after`.
    #[arg(long)]
    pub updated_before: Option<String>,
    /// Last failed (by its report or an attempt) at or after: a time or a duration ago,
    /// as for `--created-after`; what `tasks groups --since` counts.
    #[arg(long)]
    pub failed_after: Option<String>,
    /// Generation exactly: 1 for first failures, N for a message redrive produced that
    /// failed N-1 times again.
    #[arg(long)]
    pub generation: Option<i32>,
    /// Generation at least (2: every re-failure).
    #[arg(long)]
    pub min_generation: Option<i32>,
    /// The re-failures of this task (the tasks that came from it).
    #[arg(long)]
    pub previous_task: Option<i64>,
    /// What broke: the tasks of this cause (an id `tasks groups` prints); without
    /// `--status`, those not done (failed, permanent_failure), as the groups count them.
    #[arg(long)]
    pub cause: Option<i64>,
    /// Text in the key, the value or the headers (exact bytes, case-sensitive), looked
    /// for among the newest 100,000 tasks the rest of the filter selects (`tasks list`
    /// only; act on what it found by id).
    #[arg(long)]
    pub search: Option<String>,
}

impl FilterArgs {
    /// The filter as written, if any option was given, for the operations layer to read.
    pub fn given(&self) -> Option<FilterParams> {
        Some(self.params()).filter(|params| !params.is_empty())
    }

    /// The filter as written, for the operations layer to read.
    pub fn params(&self) -> FilterParams {
        FilterParams {
            status: (!self.status.is_empty()).then(|| StatusNames(self.status.clone())),
            handler: self.handler.clone(),
            route: self.route.clone(),
            topic: self.topic.clone(),
            key: self.key.clone(),
            key_prefix: self.key_prefix.clone(),
            error: self.error.clone(),
            first_error: self.first_error.clone(),
            disposition: self.disposition.clone(),
            created_after: self.created_after.clone(),
            created_before: self.created_before.clone(),
            updated_after: self.updated_after.clone(),
            updated_before: self.updated_before.clone(),
            failed_after: self.failed_after.clone(),
            generation: self.generation,
            min_generation: self.min_generation,
            previous_task: self.previous_task,
            cause: self.cause,
            search: self.search.clone(),
        }
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

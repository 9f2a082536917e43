//! Which tasks an operator means: a filter, as one fixed SQL condition whose parts are
//! switched on by their parameters (no SQL is ever built from a filter's text).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::Postgres;

use crate::task::{Status, TaskId};

/// Tasks selected by their fields; every field left out matches every task.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TaskFilter {
    /// Any of these statuses.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub status: Vec<Status>,
    /// Handler name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
    /// Ingest route name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// Topic the failure was consumed from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Message key, exactly (its UTF-8 bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Message key starting with these UTF-8 bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// Text in the error a task shows, case-insensitive: its last attempt's error, or,
    /// before any attempt failed, the error it was reported with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Text in the error a task was first reported with (the dead letter's, or the
    /// failed inline attempt's), case-insensitive, whatever its attempts said since.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// How its dead letter was given up (a Kafka share group's: `rejected` by the
    /// consumer, or `delivery_count_exceeded`), exactly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disposition: Option<String>,
    /// Created at or after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_after: Option<DateTime<Utc>>,
    /// Created before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_before: Option<DateTime<Utc>>,
    /// Last changed at or after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_after: Option<DateTime<Utc>>,
    /// Last changed before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_before: Option<DateTime<Utc>>,
    /// Last failed (its cause set, by its report or an attempt) at or after: the window
    /// of `tasks groups --since`, so that a group's count and its list agree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_after: Option<DateTime<Utc>>,
    /// Generation exactly: 1 for first failures, 2 and up for re-failures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i32>,
    /// Generation at least (2: every re-failure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_generation: Option<i32>,
    /// Re-failures of this task: the tasks that came from it.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<i64>)]
    pub previous_task: Option<TaskId>,
    /// What broke: tasks whose cause is this one (an id of `redrive tasks groups`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<i64>,
    /// Text in the key, the value or the headers (their bytes, case-sensitive), looked
    /// for among the newest [`SEARCH_SCAN`] tasks the rest of the filter selects: for
    /// lists only (an action on what a search found acts on ticked ids).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search: Option<String>,
    /// These tasks only (a replay of tasks ticked by id); empty: every task the rest
    /// of the filter selects.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<TaskId>,
}

/// Most tasks one page of a search reads, newest first: a search answers within a
/// bound an operator can predict, and says when older tasks were left unsearched.
pub const SEARCH_SCAN: i64 = 100_000;

/// Longest search text, in bytes.
pub const SEARCH_MAX_BYTES: usize = 256;

impl TaskFilter {
    /// The filter as named values, each as the API's query, the console's links and
    /// the CLI's options (`_` read as `-`) take it: statuses one pair each, times in
    /// RFC 3339 to the microsecond. Without `ids`, which no query names.
    pub fn named_values(&self) -> Vec<(&'static str, String)> {
        let mut pairs: Vec<(&'static str, String)> = self
            .status
            .iter()
            .map(|s| ("status", s.as_str().to_owned()))
            .collect();
        let texts = self.texts();
        pairs.extend(texts.into_iter().filter_map(|(n, v)| Some((n, v.clone()?))));
        let times = [
            ("created_after", self.created_after),
            ("created_before", self.created_before),
            ("updated_after", self.updated_after),
            ("updated_before", self.updated_before),
            ("failed_after", self.failed_after),
        ];
        pairs.extend(times.into_iter().filter_map(|(n, t)| {
            Some((n, t?.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)))
        }));
        let numbers = [
            ("generation", self.generation.map(i64::from)),
            ("min_generation", self.min_generation.map(i64::from)),
            ("previous_task", self.previous_task.map(|id| id.0)),
            ("cause", self.cause),
        ];
        pairs.extend(
            numbers
                .into_iter()
                .filter_map(|(n, v)| Some((n, v?.to_string()))),
        );
        pairs
    }

    /// The text parts, by name.
    fn texts(&self) -> [(&'static str, &Option<String>); 9] {
        [
            ("handler", &self.handler),
            ("route", &self.route),
            ("topic", &self.topic),
            ("key", &self.key),
            ("key_prefix", &self.key_prefix),
            ("error", &self.error),
            ("first_error", &self.first_error),
            ("disposition", &self.disposition),
            ("search", &self.search),
        ]
    }

    /// Whether the filter selects every task (bulk actions ask for `--all` then).
    pub fn is_everything(&self) -> bool {
        *self == TaskFilter::default()
    }

    /// Checks values the database would otherwise refuse or misread.
    pub fn validate(&self) -> Result<(), String> {
        let texts = self.texts();
        for (name, value) in texts {
            if value.as_deref().is_some_and(|v| v.contains('\0')) {
                return Err(format!("{name} must not contain a NUL character"));
            }
        }
        for (name, generation) in [
            ("generation", self.generation),
            ("min_generation", self.min_generation),
        ] {
            if generation.is_some_and(|g| g < 1) {
                return Err(format!("{name} must be at least 1 (1 is a first failure)"));
            }
        }
        if let Some(disposition) = &self.disposition {
            if !DISPOSITIONS.contains(&disposition.as_str()) {
                return Err(format!(
                    "unknown disposition {disposition:?} ({})",
                    DISPOSITIONS.join(", ")
                ));
            }
        }
        if self.search.as_ref().is_some_and(|s| s.contains('\u{fffd}')) {
            return Err(
                "search must be valid UTF-8 text (it is looked for as its UTF-8 bytes; \
                 a percent-encoded byte that is not UTF-8 reads as U+FFFD)"
                    .into(),
            );
        }
        if self
            .search
            .as_ref()
            .is_some_and(|s| s.len() > SEARCH_MAX_BYTES)
        {
            return Err(format!("search must be at most {SEARCH_MAX_BYTES} bytes"));
        }
        if self.cause.is_some_and(|id| id < 1) {
            return Err("cause must be a cause id (a positive integer)".into());
        }
        if self.previous_task.is_some_and(|id| id.0 < 1) {
            return Err("previous_task must be a task id (a positive integer)".into());
        }
        if self.key.is_some() && self.key_prefix.is_some() {
            return Err("give key or key_prefix, not both".into());
        }
        for (name, after, before) in [
            ("created", self.created_after, self.created_before),
            ("updated", self.updated_after, self.updated_before),
        ] {
            if let (Some(after), Some(before)) = (after, before) {
                if after >= before {
                    return Err(format!("{name}_after must be earlier than {name}_before"));
                }
            }
        }
        Ok(())
    }
}

/// The dispositions a task may have ([`crate::kafka::dlt::Disposition`]).
const DISPOSITIONS: [&str; 3] = ["rejected", "delivery_count_exceeded", "unknown"];

/// Which tasks an action applies to: listed ids, or every task a filter selects.
// One per operator request, never held in bulk: boxing the filter would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// These tasks.
    Ids(Vec<TaskId>),
    /// The tasks this filter selects when each batch is read.
    Filter(TaskFilter),
}

/// The condition over `recovery_task` (no alias) for parameters `$1` to `$19`, bound by
/// [`bind_selection`]; a statement's own parameters start at `$20`. Each part is off
/// when its parameter is NULL. The key filters test each task's own key: a list by a
/// narrow key finds its tasks first through the key heads ([`KEY_HEADS`]). Statuses (at
/// most four distinct ones) are compared one by one with `=`, not with `= ANY`: planned
/// for their values, the comparisons fold to `status = 'a' OR status = 'b'`, whose arms
/// the partial indexes of each status serve (one status: in id order, no sort needed).
pub(crate) const CONDITION: &str = "\
    ($1::text[] IS NULL OR (cardinality($1) >= 1 AND status = $1[1]) \
        OR (cardinality($1) >= 2 AND status = $1[2]) OR (cardinality($1) >= 3 AND status = $1[3]) \
        OR (cardinality($1) >= 4 AND status = $1[4]) OR (cardinality($1) > 4 AND status = ANY($1))) \
    AND ($2::text IS NULL OR handler = $2) \
    AND ($3::text IS NULL OR route = $3) \
    AND ($4::text IS NULL OR source_topic = $4) \
    AND ($5::bytea IS NULL OR msg_key = $5) \
    AND ($6::bytea IS NULL OR substring(msg_key FROM 1 FOR length($6)) = $6) \
    AND ($7::text IS NULL OR strpos(lower(coalesce(last_error, error_message, '')), lower($7)) > 0) \
    AND ($8::timestamptz IS NULL OR created_at >= $8) \
    AND ($9::timestamptz IS NULL OR created_at < $9) \
    AND ($10::timestamptz IS NULL OR updated_at >= $10) \
    AND ($11::timestamptz IS NULL OR updated_at < $11) \
    AND ($12::bigint[] IS NULL OR id = ANY($12)) \
    AND ($13::int IS NULL OR generation = $13) \
    AND ($14::int IS NULL OR generation >= $14) \
    AND ($15::bigint IS NULL OR previous_task_id = $15) \
    AND ($16::text IS NULL OR strpos(lower(coalesce(error_message, '')), lower($16)) > 0) \
    AND ($17::text IS NULL OR disposition = $17) \
    AND ($18::bigint IS NULL OR cause_id = $18) \
    AND ($19::timestamptz IS NULL OR cause_at >= $19)";

/// The key heads (`recovery_task_key_head`, the first 64 bytes of each stored task's key,
/// recorded once when it is stored) that the key `$5` or the prefix `$6` of [`CONDITION`]
/// selects: every key that starts with a prefix `p` of at most 64 bytes has a head between
/// `p` and `p` padded to 64 bytes with 0xff. The exact test of [`CONDITION`] decides.
pub(crate) const KEY_HEADS: &str = "\
    recovery_task_key_head \
    WHERE ($5::bytea IS NULL OR key_head = substring($5 FROM 1 FOR 64)) \
      AND ($6::bytea IS NULL OR key_head \
            BETWEEN substring($6 FROM 1 FOR 64) AND substring($6 FROM 1 FOR 64) \
                || decode(repeat('ff', 64 - length(substring($6 FROM 1 FOR 64))), 'hex'))";

/// Binds `$1`..`$19` of [`CONDITION`] for `selection`.
pub(crate) fn bind_selection<'q>(
    query: Query<'q, Postgres, PgArguments>,
    selection: &'q Selection,
) -> Query<'q, Postgres, PgArguments> {
    let empty = TaskFilter::default();
    let (filter, ids) = match selection {
        Selection::Ids(ids) => (&empty, Some(ids.iter().map(|id| id.0).collect::<Vec<_>>())),
        Selection::Filter(filter) => (
            filter,
            (!filter.ids.is_empty()).then(|| filter.ids.iter().map(|id| id.0).collect()),
        ),
    };
    let statuses = (!filter.status.is_empty()).then(|| {
        filter
            .status
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect::<Vec<_>>()
    });
    query
        .bind(statuses)
        .bind(filter.handler.clone())
        .bind(filter.route.clone())
        .bind(filter.topic.clone())
        .bind(filter.key.as_ref().map(|k| k.as_bytes().to_vec()))
        .bind(filter.key_prefix.as_ref().map(|k| k.as_bytes().to_vec()))
        .bind(filter.error.clone())
        .bind(filter.created_after)
        .bind(filter.created_before)
        .bind(filter.updated_after)
        .bind(filter.updated_before)
        .bind(ids)
        .bind(filter.generation)
        .bind(filter.min_generation)
        .bind(filter.previous_task.map(|id| id.0))
        .bind(filter.first_error.clone())
        .bind(filter.disposition.clone())
        .bind(filter.cause)
        .bind(filter.failed_after)
}

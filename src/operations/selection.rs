//! Which tasks an operator means, read the same way from every face: a filter as written
//! (statuses by name, times as RFC 3339 or a duration ago), ids, and the rules that
//! join them (ids or a filter, not both; every task only when asked for with `all`).

use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, NaiveTime, Utc};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::fmt;

use super::error::{OperationError, Result};
use crate::config::parse_duration;
use crate::store::{Selection, TaskFilter};
use crate::task::{Status, TaskId};

/// Most task ids one request may name (a filter selects more).
pub const MAX_IDS: usize = 10_000;

/// Statuses by their stored names: a list, or one comma-separated text (as a query
/// string or the command line carries them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StatusNames(pub Vec<String>);

impl<'de> Deserialize<'de> for StatusNames {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StatusNamesVisitor)
    }
}

struct StatusNamesVisitor;

impl<'de> Visitor<'de> for StatusNamesVisitor {
    type Value = StatusNames;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("status names: a list, or a comma-separated text")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<StatusNames, E> {
        Ok(StatusNames(text.split(',').map(str::to_owned).collect()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StatusNames, A::Error> {
        let mut names = Vec::new();
        while let Some(name) = seq.next_element::<String>()? {
            names.push(name);
        }
        Ok(StatusNames(names))
    }
}

/// A filter as an operator writes it; every field left out matches every task.
/// [`FilterParams::filter`] reads it into the store's [`TaskFilter`], times resolved.
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema, utoipa::IntoParams,
)]
#[serde(default, deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FilterParams {
    /// Statuses: failed, resolved, permanent_failure, discarded (a list, or
    /// comma-separated).
    #[schema(value_type = Option<Vec<String>>)]
    #[param(value_type = Option<String>)]
    pub status: Option<StatusNames>,
    /// Handler name.
    pub handler: Option<String>,
    /// Ingest route name.
    pub route: Option<String>,
    /// Topic the failure was consumed from.
    pub topic: Option<String>,
    /// Message key, exactly.
    pub key: Option<String>,
    /// Message key prefix.
    pub key_prefix: Option<String>,
    /// Text in the error a task shows (its last attempt's, or before any attempt
    /// failed the one it was reported with), case-insensitive.
    pub error: Option<String>,
    /// Text in the error a task was first reported with (its dead letter's, or its
    /// failed inline attempt's), case-insensitive.
    pub first_error: Option<String>,
    /// How its dead letter was given up: `rejected` or `delivery_count_exceeded` (a
    /// Kafka share group's).
    pub disposition: Option<String>,
    /// Created at or after: a time (RFC 3339, or `2026-12-03 10:15` / `2026-12-03` as
    /// UTC), or a duration meaning that long ago ("2h").
    pub created_after: Option<String>,
    /// Created before: a time or a duration ago, as for created_after.
    pub created_before: Option<String>,
    /// Last changed at or after: a time or a duration ago, as for created_after.
    pub updated_after: Option<String>,
    /// Last changed before: a time or a duration ago, as for created_after.
    pub updated_before: Option<String>,
    /// Last failed (by its report or an attempt) at or after: a time or a duration ago,
    /// as for created_after; what the groups' `since` counts.
    pub failed_after: Option<String>,
    /// Generation exactly: 1 for first failures, 2 and up for re-failures.
    pub generation: Option<i32>,
    /// Generation at least (2: every re-failure).
    pub min_generation: Option<i32>,
    /// The re-failures of this task (the tasks that came from it).
    pub previous_task: Option<i64>,
    /// What broke: the tasks of this cause (an id from the groups). Without `status`,
    /// the tasks not done (failed, permanent_failure), as the groups count them: a
    /// replay by cause never re-sends what already succeeded.
    pub cause: Option<i64>,
    /// Text in the key, the value or the headers (exact bytes, case-sensitive), looked
    /// for among the newest 100,000 tasks the rest of the filter selects (lists only).
    pub search: Option<String>,
}

impl FilterParams {
    /// Whether it selects every task.
    pub fn is_empty(&self) -> bool {
        *self == FilterParams::default()
    }

    /// The store's filter: statuses known, times resolved against now, checked.
    pub fn filter(&self) -> Result<TaskFilter> {
        self.filter_at(Utc::now())
    }

    /// [`FilterParams::filter`], durations ago counted back from `now`.
    pub fn filter_at(&self, now: DateTime<Utc>) -> Result<TaskFilter> {
        let status = match &self.status {
            None if self.cause.is_some() => vec![Status::Failed, Status::PermanentFailure],
            None => Vec::new(),
            Some(StatusNames(names)) => {
                let mut statuses = Vec::new();
                for name in names {
                    let status = parse_status(name.trim()).map_err(OperationError::BadRequest)?;
                    if !statuses.contains(&status) {
                        statuses.push(status);
                    }
                }
                statuses
            }
        };
        let time = |name: &str, text: &Option<String>| {
            text.as_deref()
                .map(|text| parse_time_at(text, now).map_err(|e| format!("{name}: {e}")))
                .transpose()
                .map_err(OperationError::BadRequest)
        };
        let filter = TaskFilter {
            status,
            handler: name("handler", &self.handler)?,
            route: name("route", &self.route)?,
            topic: name("topic", &self.topic)?,
            key: self.key.clone(),
            key_prefix: not_empty("key_prefix", &self.key_prefix)?,
            error: not_empty("error", &self.error)?,
            first_error: not_empty("first_error", &self.first_error)?,
            disposition: name("disposition", &self.disposition)?,
            created_after: time("created_after", &self.created_after)?,
            created_before: time("created_before", &self.created_before)?,
            updated_after: time("updated_after", &self.updated_after)?,
            updated_before: time("updated_before", &self.updated_before)?,
            failed_after: time("failed_after", &self.failed_after)?,
            generation: self.generation,
            min_generation: self.min_generation,
            previous_task: self.previous_task.map(TaskId),
            cause: self.cause,
            search: not_empty("search", &self.search)?,
            ids: Vec::new(),
        };
        filter.validate().map_err(OperationError::BadRequest)?;
        Ok(filter)
    }
}

/// A name (handler, route, topic) as written, around spaces trimmed.
fn name(field: &str, value: &Option<String>) -> Result<Option<String>> {
    let trimmed = value.as_deref().map(|v| v.trim().to_owned());
    not_empty(field, &trimmed)
}

/// `value`, refused when given empty: an empty prefix or text matches every task, and
/// selecting every task takes `all` (a script's empty variable must not mean all).
fn not_empty(field: &str, value: &Option<String>) -> Result<Option<String>> {
    match value.as_deref() {
        Some("") => Err(OperationError::bad_request(format!(
            "{field} is empty: leave it out to match any task"
        ))),
        _ => Ok(value.clone()),
    }
}

/// A status by its stored name.
pub fn parse_status(text: &str) -> std::result::Result<Status, String> {
    text.parse().map_err(|_| {
        format!("unknown status {text:?} (failed, resolved, permanent_failure, discarded)")
    })
}

/// A time as an operator writes it: RFC 3339; a date and time without a zone
/// (`2026-12-03 10:15`, taken as UTC); a date (midnight UTC); or a duration meaning
/// that long before now (`1h`: an hour ago).
pub fn parse_time(text: &str) -> std::result::Result<DateTime<Utc>, String> {
    parse_time_at(text, Utc::now())
}

/// [`parse_time`], durations counted back from `now`.
pub fn parse_time_at(text: &str, now: DateTime<Utc>) -> std::result::Result<DateTime<Utc>, String> {
    let out_of_range = || format!("{text:?} is outside the years 1 to 9999");
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        let time = time.with_timezone(&Utc);
        return Some(time).filter(storable).ok_or_else(out_of_range);
    }
    for format in [
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%dT%H:%M",
    ] {
        if let Ok(time) = NaiveDateTime::parse_from_str(text, format) {
            return Some(time.and_utc())
                .filter(storable)
                .ok_or_else(out_of_range);
        }
    }
    if let Ok(day) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        let midnight = day.and_time(NaiveTime::MIN).and_utc();
        return Some(midnight).filter(storable).ok_or_else(out_of_range);
    }
    let ago = parse_duration(text).map_err(|_| {
        format!(
            "{text:?} is neither a time (2026-12-03T10:15:00Z; 2026-12-03 10:15 or \
             2026-12-03, as UTC) nor a duration like \"2h\" (that long ago)"
        )
    })?;
    chrono::TimeDelta::from_std(ago)
        .ok()
        .and_then(|ago| now.checked_sub_signed(ago))
        .filter(storable)
        .ok_or_else(|| format!("{text:?} is too long ago"))
}

/// Whether PostgreSQL can compare a task's times with `time`: years 1 to 9999 are
/// taken, as an operator could mean them.
fn storable(time: &DateTime<Utc>) -> bool {
    (1..=9999).contains(&time.year())
}

/// What a bulk verb acts on: `ids`, or the tasks `filter` selects (a filter given, even
/// an empty one, and ids are refused together); a filter of every task only with `all`.
pub fn select(ids: &[i64], filter: Option<&FilterParams>, all: bool) -> Result<Selection> {
    if ids.is_empty() {
        return Ok(Selection::Filter(select_filter(filter, all)?));
    }
    if filter.is_some() || all {
        return Err(OperationError::bad_request(
            "give task ids or a filter (or all), not both",
        ));
    }
    if ids.len() > MAX_IDS {
        return Err(OperationError::bad_request(format!(
            "at most {MAX_IDS} task ids at once (got {}); use a filter for more",
            ids.len()
        )));
    }
    if let Some(bad) = ids.iter().find(|&&id| id < 1) {
        return Err(OperationError::bad_request(format!(
            "task ids are positive integers (got {bad})"
        )));
    }
    Ok(Selection::Ids(ids.iter().copied().map(TaskId).collect()))
}

/// The tasks `filter` selects; every task only with `all`.
pub fn select_filter(filter: Option<&FilterParams>, all: bool) -> Result<TaskFilter> {
    let filter = match filter {
        Some(filter) => filter.filter()?,
        None => TaskFilter::default(),
    };
    if filter.search.is_some() {
        return Err(OperationError::bad_request(
            "search finds tasks to look at among the newest ones only; act on what it \
             found by their ids, or by a filter without search",
        ));
    }
    if filter.is_everything() && !all {
        return Err(OperationError::bad_request(
            "no task ids and no filter: this would select every task; pass --all \
             (\"all\": true over HTTP) if that is what you mean",
        ));
    }
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(outcome: Result<impl fmt::Debug>) -> String {
        outcome.unwrap_err().to_string()
    }

    #[test]
    fn times_are_utc_times_dates_or_durations_ago() {
        let now = DateTime::parse_from_rfc3339("2026-12-03T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        for (written, meant) in [
            ("2026-01-02T03:04:05Z", "2026-01-02T03:04:05+00:00"),
            ("2026-01-02T05:04:05+02:00", "2026-01-02T03:04:05+00:00"),
            ("2026-01-02 03:04:05", "2026-01-02T03:04:05+00:00"),
            ("2026-01-02T03:04", "2026-01-02T03:04:00+00:00"),
            ("2026-01-02 03:04", "2026-01-02T03:04:00+00:00"),
            ("2026-01-02", "2026-01-02T00:00:00+00:00"),
            ("2h", "2026-12-03T10:00:00+00:00"),
            ("90m", "2026-12-03T10:30:00+00:00"),
        ] {
            assert_eq!(
                parse_time_at(written, now).unwrap().to_rfc3339(),
                meant,
                "{written}"
            );
        }
        let ago = Utc::now() - parse_time("2h").unwrap();
        assert!((ago.num_seconds() - 7200).abs() < 5, "{ago}");
        for wrong in [
            "yesterday",
            "2026-13-01",
            "2026-01-02 25:00",
            "-1h",
            "1e-20s",
            "",
        ] {
            let refused = parse_time_at(wrong, now).unwrap_err();
            assert!(refused.contains("neither a time"), "{wrong}: {refused}");
        }
        assert!(parse_time("100000000years").is_err());
        // Found by the issue 16 attack: PostgreSQL refused these (a 500).
        for far in ["10000years", "2100years", "0000-06-01T00:00:00Z"] {
            assert!(parse_time_at(far, now).is_err(), "{far}");
        }
    }

    /// Found by the issue 16 attack: `--key-prefix "$EMPTY"` selected every task with a
    /// key, past the rule that every task takes `all`.
    #[test]
    fn an_empty_text_is_refused_and_names_are_trimmed() {
        for field in ["handler", "route", "topic", "key_prefix", "error"] {
            let params: FilterParams =
                serde_json::from_value(serde_json::json!({ field: "" })).unwrap();
            let refused = error(params.filter());
            assert!(
                refused.starts_with(&format!("{field} is empty")),
                "{refused}"
            );
        }
        let blank: FilterParams =
            serde_json::from_value(serde_json::json!({"handler": "  "})).unwrap();
        assert!(error(blank.filter()).contains("handler is empty"));
        let spaced: FilterParams =
            serde_json::from_value(serde_json::json!({"handler": " billing ", "key": ""})).unwrap();
        let filter = spaced.filter().unwrap();
        assert_eq!(filter.handler.as_deref(), Some("billing"));
        assert_eq!(filter.key.as_deref(), Some(""), "an empty key is a key");
    }

    #[test]
    fn statuses_are_named_as_stored_in_a_list_or_one_text() {
        assert_eq!(
            parse_status("permanent_failure"),
            Ok(Status::PermanentFailure)
        );
        assert!(parse_status("done").unwrap_err().contains("unknown status"));
        let listed: FilterParams =
            serde_json::from_value(serde_json::json!({"status": ["failed", "resolved"]})).unwrap();
        let written: FilterParams =
            serde_json::from_value(serde_json::json!({"status": "failed, resolved"})).unwrap();
        assert_eq!(listed.filter().unwrap(), written.filter().unwrap());
        assert_eq!(
            listed.filter().unwrap().status,
            [Status::Failed, Status::Resolved]
        );
        let twice: FilterParams =
            serde_json::from_value(serde_json::json!({"status": "failed,resolved,failed"}))
                .unwrap();
        assert_eq!(twice.filter().unwrap(), listed.filter().unwrap());
    }

    #[test]
    fn a_filter_names_the_field_it_refuses() {
        let filter = |json| serde_json::from_value::<FilterParams>(json).unwrap();
        let bad = filter(serde_json::json!({"created_after": "yesterday"}));
        assert!(error(bad.filter()).starts_with("created_after: "));
        let both = filter(serde_json::json!({"key": "a", "key_prefix": "b"}));
        assert!(error(both.filter()).contains("not both"));
        let hour = filter(serde_json::json!({"updated_before": "1h"}))
            .filter()
            .unwrap();
        assert!(hour.updated_before.unwrap() < Utc::now());
    }

    #[test]
    fn ids_or_a_filter_and_every_task_only_with_all() {
        let handler = FilterParams {
            handler: Some("billing".into()),
            ..FilterParams::default()
        };
        assert_eq!(
            select(&[3, 4], None, false).unwrap(),
            Selection::Ids(vec![TaskId(3), TaskId(4)])
        );
        assert!(matches!(
            select(&[], Some(&handler), false).unwrap(),
            Selection::Filter(f) if f.handler.as_deref() == Some("billing")
        ));
        assert!(error(select(&[3], Some(&handler), false)).contains("not both"));
        assert!(error(select(&[3], None, true)).contains("not both"));
        let empty = FilterParams::default();
        assert!(error(select(&[3], Some(&empty), false)).contains("not both"));
        for nothing in [None, Some(&FilterParams::default())] {
            let refused = error(select(&[], nothing, false));
            assert!(refused.contains("every task") && refused.contains("--all"));
            assert_eq!(
                select(&[], nothing, true).unwrap(),
                Selection::Filter(TaskFilter::default())
            );
        }
        assert!(error(select(&[0], None, false)).contains("positive"));
        let many: Vec<i64> = (1..=MAX_IDS as i64 + 1).collect();
        assert!(error(select(&many, None, false)).contains("at most"));
    }
}

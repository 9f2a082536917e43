//! Re-failures that do not loop. A message redrive produced carries `redrive-task-id`
//! (republish and replay write it); when its consumer fails it again, a dead-letter
//! topic brings it back with that header copied. A capture route links the new task to
//! the task the header names when that task is this fleet's: it exists in this store,
//! and it was captured by the same route or its message came from the same original
//! topic. The new task's generation is the previous one's + 1; beyond the route's
//! `max_generations` it is stored PERMANENT_FAILURE ("failed again after N redrives"),
//! and parked, instead of being redriven once more.
//!
//! Anything else in the header (not a number, out of range, a task that does not exist
//! or that does not match) makes a first failure, with an ingest note saying why.

use crate::config::RouteSettings;
use crate::headers::Header;
use crate::kafka::dlt::{clean_text, own};
use crate::store::Ancestor;
use crate::task::{NewTask, Status, TaskId};

use super::mapping::append_note;

/// Longest part of a header value quoted in a note.
const QUOTED_BYTES: usize = 64;

/// The task a captured message names in its (last) `redrive-task-id` header: none
/// without the header, else the id or why the value is not one.
pub(crate) fn named_task(headers: &[Header]) -> Option<Result<TaskId, String>> {
    let header = headers.iter().rev().find(|h| h.name_is(own::TASK_ID))?;
    let value = header.value.as_deref().unwrap_or_default();
    let id = std::str::from_utf8(value)
        .ok()
        .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|text| text.parse::<i64>().ok())
        .filter(|&id| id > 0);
    Some(id.map(TaskId).ok_or_else(|| {
        let quoted = clean_text(&value[..value.len().min(QUOTED_BYTES)]);
        format!(
            "{} {quoted:?} is not a task id; stored as a first failure",
            own::TASK_ID
        )
    }))
}

/// Links `task`, captured by `route`, to `ancestor` (the stored task `named`, if it
/// exists), or notes why it stays a first failure.
pub(crate) fn link(
    task: &mut NewTask,
    route: &RouteSettings,
    named: TaskId,
    ancestor: Option<&Ancestor>,
) {
    let Some(ancestor) = ancestor else {
        note(
            task,
            &format!(
                "{} {named}: no such task in this store; stored as a first failure",
                own::TASK_ID
            ),
        );
        return;
    };
    let failure = &task.failure;
    let same_route = ancestor.route.is_some() && ancestor.route == failure.route;
    let original_topic = failure.original.as_ref().map(|o| o.topic.as_str());
    let same_topic =
        ancestor.original_topic.is_some() && ancestor.original_topic.as_deref() == original_topic;
    if !(same_route || same_topic) {
        let reason = format!(
            "{} {named} names a task of route {:?} from topic {:?}, not of this message's \
             route {:?} or topic {:?}; stored as a first failure",
            own::TASK_ID,
            ancestor.route.as_deref().unwrap_or(""),
            ancestor.original_topic.as_deref().unwrap_or(""),
            route.name,
            original_topic.unwrap_or(""),
        );
        note(task, &reason);
        return;
    }
    let generation = ancestor.generation.saturating_add(1);
    task.failure.generation = generation;
    task.failure.previous_task = Some(named);
    task.failure.previous_error = ancestor.error.clone();
    if u32::try_from(generation).is_ok_and(|g| g > route.generation_limit()) {
        task.status = Status::PermanentFailure;
        task.final_error = Some(format!("failed again after {} redrives", generation - 1));
    }
}

/// Whether `task` was stopped by its route's `max_generations`.
pub(crate) fn loop_stopped(task: &NewTask) -> bool {
    task.failure.previous_task.is_some() && task.status == Status::PermanentFailure
}

fn note(task: &mut NewTask, note: &str) {
    task.failure.ingest_note = Some(append_note(task.failure.ingest_note.take(), note));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouteMode;
    use crate::task::SourceCoordinates;

    fn header(value: &[u8]) -> Vec<Header> {
        vec![Header::new(own::TASK_ID, value.to_vec())]
    }

    #[test]
    fn only_a_positive_decimal_that_fits_names_a_task() {
        assert_eq!(named_task(&[]), None);
        assert_eq!(named_task(&header(b"42")), Some(Ok(TaskId(42))));
        let two = [header(b"1"), header(b"7")].concat();
        assert_eq!(named_task(&two), Some(Ok(TaskId(7))), "the last one counts");
        for forged in [
            &b"abc"[..],
            b"",
            b"0",
            b"-3",
            b" 5",
            b"+5",
            b"99999999999999999999999",
            b"\xff\xfe",
        ] {
            let named = named_task(&header(forged));
            assert!(
                matches!(&named, Some(Err(reason)) if reason.contains("not a task id")),
                "{forged:?}: {named:?}"
            );
        }
        let none = vec![Header {
            name: own::TASK_ID.into(),
            value: None,
        }];
        assert!(matches!(named_task(&none), Some(Err(_))));
    }

    fn captured(route: &RouteSettings, original: &str) -> NewTask {
        let mut task = NewTask::new("republish", b"v".to_vec());
        task.failure.route = Some(route.name.clone());
        task.failure.original = Some(
            SourceCoordinates {
                topic: original.into(),
                partition: 0,
                offset: 9,
            }
            .into(),
        );
        task.failure.error_message = Some("still broken".into());
        task
    }

    fn ancestor(generation: i32, route: &str, original: &str) -> Ancestor {
        Ancestor {
            id: TaskId(5),
            generation,
            route: Some(route.into()),
            original_topic: Some(original.into()),
            error: Some("broken".into()),
        }
    }

    #[test]
    fn a_matching_ancestor_links_and_the_generation_past_the_limit_stops() {
        let mut route = RouteSettings::new(&["orders.dlt"], RouteMode::Capture, "republish");
        route.name = "orders".into();
        let mut task = captured(&route, "orders");
        link(
            &mut task,
            &route,
            TaskId(5),
            Some(&ancestor(1, "orders", "x")),
        );
        assert_eq!(task.failure.generation, 2);
        assert_eq!(task.failure.previous_task, Some(TaskId(5)));
        assert_eq!(task.failure.previous_error.as_deref(), Some("broken"));
        assert_eq!(task.status, Status::Failed);

        let mut task = captured(&route, "orders");
        link(
            &mut task,
            &route,
            TaskId(5),
            Some(&ancestor(3, "other", "orders")),
        );
        assert_eq!(task.failure.generation, 4, "the original topic matches");
        assert_eq!(task.status, Status::PermanentFailure);
        assert_eq!(
            task.final_error.as_deref(),
            Some("failed again after 3 redrives")
        );
        assert!(loop_stopped(&task));

        let mut task = captured(&route, "orders");
        link(
            &mut task,
            &route,
            TaskId(5),
            Some(&ancestor(i32::MAX, "orders", "orders")),
        );
        assert_eq!(
            task.failure.generation,
            i32::MAX,
            "saturates, never overflows"
        );
    }

    #[test]
    fn a_missing_or_foreign_ancestor_leaves_a_first_failure_with_a_note() {
        let mut route = RouteSettings::new(&["orders.dlt"], RouteMode::Capture, "republish");
        route.name = "orders".into();
        let mut task = captured(&route, "orders");
        link(&mut task, &route, TaskId(77), None);
        assert_eq!(task.failure.generation, 1);
        assert_eq!(task.failure.previous_task, None);
        assert!(task.failure.ingest_note.unwrap().contains("no such task"));

        let mut task = captured(&route, "orders");
        link(
            &mut task,
            &route,
            TaskId(5),
            Some(&ancestor(1, "payments", "payments")),
        );
        assert_eq!(task.failure.previous_task, None);
        assert_eq!(task.status, Status::Failed);
        assert!(task
            .failure
            .ingest_note
            .unwrap()
            .contains("route \"payments\""));
    }
}

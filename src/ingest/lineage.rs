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
//! or that does not match) makes a first failure, with an ingest note saying why. Of
//! two copies of the header the first counts, as for every dead-letter header, and the
//! note says when they disagree.

use crate::config::RouteSettings;
use crate::headers::Header;
use crate::kafka::dlt::{self, own};
use crate::store::Ancestor;
use crate::task::{NewTask, Status, TaskId};

use super::mapping::append_note;

/// What a captured message's `redrive-task-id` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Named {
    /// The task id of its first copy ([`dlt::first_copy`]), or why that is not one.
    pub(crate) task: Result<TaskId, String>,
    /// A later copy that disagrees, quoted.
    pub(crate) disagreement: Option<String>,
}

/// The task a captured message names in its `redrive-task-id` header: none without the
/// header, else the id of the first copy (read by [`dlt::number`], and positive) or why
/// it is not one.
pub(crate) fn named_task(headers: &[Header]) -> Option<Named> {
    let (header, disagreement) = dlt::first_copy(headers, own::TASK_ID)?;
    let value = header.value.as_deref();
    let id = value
        .and_then(|v| dlt::number(v, false))
        .filter(|&id| id > 0);
    let task = id.map(TaskId).ok_or_else(|| {
        format!(
            "{} {} is not a task id; stored as a first failure",
            own::TASK_ID,
            dlt::quoted(value)
        )
    });
    Some(Named { task, disagreement })
}

/// Links `task`, captured by `route`, to `ancestor` (the stored task `named`, if it
/// exists), or notes why it stays a first failure; `newest` is the newest id the store
/// had drawn when it was looked for.
pub(crate) fn link(
    task: &mut NewTask,
    route: &RouteSettings,
    named: TaskId,
    ancestor: Option<&Ancestor>,
    newest: Option<TaskId>,
) {
    let Some(ancestor) = ancestor else {
        note(task, &missing(named, newest));
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

/// Why no stored task has the id `named`. A task's id is drawn from the id sequence as
/// its batch is stored (or reserved for a process-mode inline attempt, before its
/// handler runs), so no record can carry the id of a task of its own ingest batch: the
/// lookup before the batch is stored misses nothing that could be linked. What a miss
/// can be is told from the newest id drawn.
fn missing(named: TaskId, newest: Option<TaskId>) -> String {
    match newest {
        Some(newest) if named.0 <= newest.0 => format!(
            "{} {named} names no stored task: it was deleted (retention), or the id was \
             reserved for a process-mode inline attempt that succeeded (nothing was stored) \
             or whose batch is still being stored; stored as a first failure",
            own::TASK_ID
        ),
        _ => format!(
            "{} {named} names no task: this store has drawn no id that high yet (newest: \
             {}); an id is drawn as its task is stored, so no message can name a task of \
             its own batch: this one comes from another store, or was made up; stored as a \
             first failure",
            own::TASK_ID,
            newest.map_or_else(|| "none".to_owned(), |id| id.to_string())
        ),
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

    fn task_of(headers: &[Header]) -> Option<Result<TaskId, String>> {
        named_task(headers).map(|named| named.task)
    }

    #[test]
    fn only_a_positive_decimal_that_fits_names_a_task() {
        assert_eq!(named_task(&[]), None);
        assert_eq!(task_of(&header(b"42")), Some(Ok(TaskId(42))));
        let two = [header(b"1"), header(b"7")].concat();
        assert_eq!(
            named_task(&two),
            Some(Named {
                task: Ok(TaskId(1)),
                disagreement: Some(
                    "two redrive-task-id headers disagree (\"1\", then \"7\"): the first is taken"
                        .into()
                ),
            }),
            "the first one counts"
        );
        let same = [header(b"7"), header(b"7")].concat();
        assert_eq!(named_task(&same).unwrap().disagreement, None);
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
            let named = task_of(&header(forged));
            assert!(
                matches!(&named, Some(Err(reason)) if reason.contains("not a task id")),
                "{forged:?}: {named:?}"
            );
        }
        let none = vec![Header {
            name: own::TASK_ID.into(),
            value: None,
        }];
        assert!(matches!(task_of(&none), Some(Err(_))));
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
            None,
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
            None,
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
            None,
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
        link(&mut task, &route, TaskId(77), None, Some(TaskId(76)));
        assert_eq!(task.failure.generation, 1);
        assert_eq!(task.failure.previous_task, None);
        let note = task.failure.ingest_note.unwrap();
        assert!(
            note.contains("names no task: this store has drawn no id that high yet (newest: 76)"),
            "{note}"
        );
        let mut task = captured(&route, "orders");
        link(&mut task, &route, TaskId(77), None, None);
        assert!(task.failure.ingest_note.unwrap().contains("(newest: none)"));
        let mut task = captured(&route, "orders");
        link(&mut task, &route, TaskId(77), None, Some(TaskId(77)));
        let note = task.failure.ingest_note.unwrap();
        assert!(
            note.contains("77 names no stored task: it was deleted (retention)"),
            "{note}"
        );

        let mut task = captured(&route, "orders");
        link(
            &mut task,
            &route,
            TaskId(5),
            Some(&ancestor(1, "payments", "payments")),
            None,
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

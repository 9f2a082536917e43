//! The last words of a captured task's ingest note: what happens to the task next, by
//! the configuration of the member that stores it. Every other remark (incomplete
//! headers, an original fetched or unavailable, a lineage header) says what was read;
//! this one says what comes of it, so a note never promises a republish that will not
//! happen.
//!
//! It is written when the note has something else to say, when the task is stored
//! PERMANENT_FAILURE, and when the `republish` handler will refuse it (a loop, no
//! topic, an unfit topic, or no payload stored): the cases where a reader would
//! otherwise have to guess.

use crate::config::{RouteSettings, Targets};
use crate::task::{NewTask, Status};

use super::mapping::append_note;

/// The name the built-in republish handler is registered under.
const REPUBLISH: &str = "republish";

/// Ends the ingest note of `task`, captured by `route`, with what happens to it next.
pub(crate) fn settle_note(task: &mut NewTask, route: &RouteSettings, targets: &Targets) {
    let route_name = Some(route.name.as_str());
    let original = task.failure.original.as_ref().map(|o| o.topic.as_str());
    let republish = (route.handler == REPUBLISH && task.status == Status::Failed)
        .then(|| targets.republish_target(route_name, original));
    let not_stored = republish.is_some() && !task.failure.payload_stored;
    let refused = matches!(republish, Some(Err(_))) || not_stored;
    if task.failure.ingest_note.is_none() && task.status == Status::Failed && !refused {
        return;
    }
    let parked = || match targets.parking_topic(route_name) {
        Some(topic) => format!("parked to {topic:?}"),
        None => "not parked (no parking topic applies)".to_owned(),
    };
    let outcome = match republish {
        _ if task.status == Status::PermanentFailure => {
            let why = (task.final_error.as_deref()).map_or_else(String::new, |e| format!(" ({e})"));
            format!(
                "stored PERMANENT_FAILURE{why}, never attempted; {}",
                parked()
            )
        }
        // The republish handler refuses it before any target (see `RepublishHandler`).
        Some(_) if not_stored => format!(
            "the payload was not stored, so republish will end it PERMANENT_FAILURE at its \
             first attempt, producing nothing; {}",
            parked()
        ),
        Some(Ok(target)) => format!("to be republished to {:?} ({})", target.topic, target.from),
        Some(Err(refused)) => format!(
            "{refused}; republish will end it PERMANENT_FAILURE at its first attempt, \
             producing nothing; {}",
            parked()
        ),
        None => format!("to be retried by handler {:?}", route.handler),
    };
    task.failure.ingest_note = Some(append_note(task.failure.ingest_note.take(), &outcome));
}

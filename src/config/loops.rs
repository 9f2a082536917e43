//! Loops one line of configuration could make: redrive producing to a topic its own
//! routes consume, so that what it produces comes back as new work, forever.
//!
//! - `republish.target_topic` consumed by a capture route (each republished message
//!   becomes a new task), or by a process route whose handler is `republish` (which
//!   produces it again);
//! - `parking.topic` consumed by any route (a parked failure is captured, or run again
//!   and, failing again, parked again);
//! - a replay's topic consumed by a capture route (each replayed message becomes a new
//!   task, which the same selection replays again).
//!
//! A route consumes a topic it lists or one its pattern matches as a whole name, which
//! is what librdkafka's anchored subscription delivers (see [`super::pattern`]).

use super::{pattern, ConfigError, RouteMode, RouteSettings, Settings};

/// Refuses a republish target or a parking topic that a route consumes, naming both keys.
pub(crate) fn refuse_loops(settings: &Settings) -> Result<(), ConfigError> {
    let routes = &settings.routes;
    if let Some(topic) = &settings.republish.target_topic {
        let feeds_back =
            |r: &RouteSettings| r.mode == RouteMode::Capture || r.handler == "republish";
        if let Some(route) = consumer(routes, topic, feeds_back) {
            return Err(ConfigError::new(
                "republish.target_topic",
                format!(
                    "{topic:?} is consumed by {route}: every republished message would come \
                     back to be handled again, an endless loop"
                ),
            ));
        }
    }
    if let Some(topic) = &settings.parking.topic {
        if let Some(route) = consumer(routes, topic, |_| true) {
            return Err(ConfigError::new(
                "parking.topic",
                format!(
                    "{topic:?} is consumed by {route}: every parked failure would come back \
                     as a new task and could be parked again, an endless loop"
                ),
            ));
        }
    }
    Ok(())
}

/// Why replaying to `topic` would loop, if a capture route of `routes` consumes it.
pub fn replay_loop(routes: &[RouteSettings], topic: &str) -> Option<String> {
    let route = consumer(routes, topic, |r| r.mode == RouteMode::Capture)?;
    Some(format!(
        "topic {topic:?} is consumed by {route}: every replayed message would come back as a \
         new task, an endless loop; replay to the topic the failures came from"
    ))
}

/// The first route that consumes `topic` and `feeds_back`, described by its key:
/// `capture route routes[0].topics ("orders.dlt")`.
fn consumer(
    routes: &[RouteSettings],
    topic: &str,
    feeds_back: impl Fn(&RouteSettings) -> bool,
) -> Option<String> {
    routes.iter().enumerate().find_map(|(i, route)| {
        if !feeds_back(route) {
            return None;
        }
        let mode = match route.mode {
            RouteMode::Capture => "capture",
            RouteMode::Process => "process",
        };
        if route.topics.iter().any(|t| t == topic) {
            return Some(format!("{mode} route routes[{i}].topics ({topic:?})"));
        }
        let pattern = route.pattern.as_deref()?;
        pattern::matches(pattern, topic)
            .then(|| format!("{mode} route routes[{i}].pattern ({pattern:?})"))
    })
}

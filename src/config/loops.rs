//! Loops one line of configuration could make: redrive producing to a topic its own
//! routes consume, so that what it produces comes back as new work, forever.
//!
//! - `republish.target_topic` consumed by a capture route (each republished message
//!   becomes a new task), or by a process route whose handler is `republish` (which
//!   produces it again);
//! - the same for a route's own `republish_topic`;
//! - `parking.topic` (or a route's `parking_topic`) consumed by any route (a parked failure is captured, or run again
//!   and, failing again, parked again);
//! - a replay's topic consumed by a capture route (each replayed message becomes a new
//!   task, which the same selection replays again);
//! - a task's original topic taken back by a route like a republish target: checked
//!   when the task is republished, not at start-up ([`republish_loop`], used by
//!   [`super::Targets::republish_target`]).
//!
//! The same lookup tells which topics are this fleet's dead-letter topics, whose records
//! are never fetched as a dead letter's original ([`capture_consumer`]).
//!
//! A route consumes a topic it lists or one its pattern matches as a whole name, which
//! is what librdkafka's anchored subscription delivers (see [`super::pattern`]).

use super::{pattern, ConfigError, RouteMode, RouteSettings, Settings};

/// Refuses a republish target or a parking topic (global or a route's own) that a route
/// consumes, naming both keys.
pub(crate) fn refuse_loops(settings: &Settings) -> Result<(), ConfigError> {
    let routes = &settings.routes;
    let mut republish = vec![(
        "republish.target_topic".to_owned(),
        &settings.republish.target_topic,
    )];
    let mut parking = vec![("parking.topic".to_owned(), &settings.parking.topic)];
    for (i, route) in routes.iter().enumerate() {
        republish.push((
            format!("routes[{i}].republish_topic"),
            &route.republish_topic,
        ));
        parking.push((format!("routes[{i}].parking_topic"), &route.parking_topic));
    }
    for (key, topic) in republish {
        let Some(topic) = topic else { continue };
        if let Some(route) = consumer(routes, topic, takes_republished_back) {
            return Err(ConfigError::new(
                key,
                format!(
                    "{topic:?} is consumed by {route}: every republished message would come \
                     back to be handled again, an endless loop"
                ),
            ));
        }
    }
    for (key, topic) in parking {
        let Some(topic) = topic else { continue };
        if let Some(route) = consumer(routes, topic, |_| true) {
            return Err(ConfigError::new(
                key,
                format!(
                    "{topic:?} is consumed by {route}: every parked failure would come back \
                     as a new task and could be parked again, an endless loop"
                ),
            ));
        }
    }
    Ok(())
}

/// Whether what is republished to a topic `route` consumes comes back to be republished
/// again: each message becomes a new task (capture), or is produced again (a process
/// route whose handler is `republish`).
fn takes_republished_back(route: &RouteSettings) -> bool {
    route.mode == RouteMode::Capture || route.handler == "republish"
}

/// The route of `routes` that would take a message republished to `topic` back as new
/// work ([`takes_republished_back`]), named with its key: `capture route "orders"
/// (routes[0].topics)`, or `(routes[0].pattern ("orders.*"))`.
pub(crate) fn republish_loop(routes: &[RouteSettings], topic: &str) -> Option<String> {
    routes.iter().enumerate().find_map(|(i, route)| {
        if !takes_republished_back(route) {
            return None;
        }
        let key = if route.topics.iter().any(|t| t == topic) {
            format!("routes[{i}].topics")
        } else {
            let pattern = route.pattern.as_deref()?;
            pattern::matches(pattern, topic)
                .then(|| format!("routes[{i}].pattern ({pattern:?})"))?
        };
        Some(format!(
            "{} route {:?} ({key})",
            mode_name(route.mode),
            route.effective_name()
        ))
    })
}

/// Why replaying to `topic` would loop, if a capture route of `routes` consumes it.
pub fn replay_loop(routes: &[RouteSettings], topic: &str) -> Option<String> {
    let route = capture_consumer(routes, topic)?;
    Some(format!(
        "topic {topic:?} is consumed by {route}: every replayed message would come back as a \
         new task, an endless loop; replay to the topic the failures came from"
    ))
}

/// The capture route of `routes` that consumes `topic` (a dead-letter topic of this
/// fleet), described by its key as [`consumer`] does.
pub(crate) fn capture_consumer(routes: &[RouteSettings], topic: &str) -> Option<String> {
    consumer(routes, topic, |r| r.mode == RouteMode::Capture)
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
        let mode = mode_name(route.mode);
        if route.topics.iter().any(|t| t == topic) {
            return Some(format!("{mode} route routes[{i}].topics ({topic:?})"));
        }
        let pattern = route.pattern.as_deref()?;
        pattern::matches(pattern, topic)
            .then(|| format!("{mode} route routes[{i}].pattern ({pattern:?})"))
    })
}

fn mode_name(mode: RouteMode) -> &'static str {
    match mode {
        RouteMode::Capture => "capture",
        RouteMode::Process => "process",
    }
}

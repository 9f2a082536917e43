//! Where a task's messages go: its route's `republish_topic` and `parking_topic`, with
//! `republish.target_topic` and `parking.topic` as defaults. A task whose route is no
//! longer configured (or that came from no route, e.g. `redrive enqueue`) gets the
//! global keys.
//!
//! A republish target that a route of this fleet takes back as new work is refused
//! where the `republish` handler asks for its topic ([`Targets::republish_target`]).

use serde::Serialize;
use std::collections::BTreeMap;

use super::{republish_loop, RouteSettings, Settings};
use crate::task::Task;

/// The name the built-in republish handler is registered under.
const REPUBLISH_HANDLER: &str = "republish";

/// The republish and parking topics of every route, and the global defaults.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    republish: Option<String>,
    parking: Option<String>,
    routes: BTreeMap<String, RouteTargets>,
    /// Every route, for what each consumes.
    consumers: Vec<RouteSettings>,
}

/// One route's own topics.
#[derive(Debug, Clone, Default)]
struct RouteTargets {
    republish: Option<String>,
    parking: Option<String>,
}

/// A topic and the setting it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Target {
    /// The topic.
    pub topic: String,
    /// Where it comes from: `routes.NAME.republish_topic`, `republish.target_topic`,
    /// `the task's original topic`, ...
    pub from: String,
}

/// Why the `republish` handler produces nothing for a task: a permanent failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepublishRefused {
    /// No target is configured and the task has no readable original topic.
    #[error(
        "no topic to republish to: the message carried no readable original topic header \
         (see ingest_note) and neither its route's republish_topic nor republish.target_topic \
         is set"
    )]
    NoTopic,
    /// The topic (a task's original topic, from a message's header) is one Kafka would
    /// refuse as a name or one of Kafka's internal topics.
    #[error("republish to {topic:?} ({from}) refused: {reason}")]
    Unfit {
        /// The topic.
        topic: String,
        /// Where it comes from.
        from: String,
        /// Why it is refused.
        reason: String,
    },
    /// A route of this fleet takes what is produced there back as new work.
    #[error(
        "republish to {topic:?} refused: it is consumed by {consumer}, so the message would \
         come back as a new task and be republished again, an endless loop"
    )]
    Loop {
        /// The topic.
        topic: String,
        /// The route, named with its key.
        consumer: String,
    },
}

/// The targets that apply to one task, as `tasks show` and the API's detail tell them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct AppliedTargets {
    /// Where the republish handler produces the task; absent for a task of another
    /// handler, or with nowhere to go.
    pub republish: Option<Target>,
    /// Where the task is parked if it ends PERMANENT_FAILURE; absent when it is not.
    pub parking: Option<Target>,
}

impl Targets {
    /// The targets `settings` configure.
    pub fn new(settings: &Settings) -> Targets {
        Targets {
            republish: settings.republish.target_topic.clone(),
            parking: settings.parking.topic.clone(),
            routes: settings
                .routes
                .iter()
                .map(|route| {
                    let own = RouteTargets {
                        republish: route.republish_topic.clone(),
                        parking: route.parking_topic.clone(),
                    };
                    (route.effective_name(), own)
                })
                .collect(),
            consumers: settings.routes.clone(),
        }
    }

    /// Where the `republish` handler produces a task of `route` whose original topic is
    /// `original`: the route's `republish_topic`, else `republish.target_topic`, else
    /// the original topic.
    ///
    /// A topic that a route of this fleet takes back as new work (a capture route, or a
    /// process route whose handler is `republish`) is refused: the message would come
    /// back as a new task and be republished again, forever. Start-up already refuses
    /// configured targets like that; a task's original topic comes from a dead letter's
    /// header, so only here can it be checked. The check is made here, where the handler
    /// asks at every attempt, and not once at ingest, because the handler also serves
    /// process-mode inline attempts, pool attempts of tasks stored before a route was
    /// added, and operators' retries after a configuration change; ingest asks the same
    /// question only to say in its note what will happen.
    pub fn republish_target(
        &self,
        route: Option<&str>,
        original: Option<&str>,
    ) -> Result<Target, RepublishRefused> {
        let target = self
            .republish_candidate(route, original)
            .ok_or(RepublishRefused::NoTopic)?;
        // Configured targets were checked at start; an original topic comes from a
        // message's header, which anyone who can produce to a dead-letter topic writes.
        if let Some(reason) = super::target_problem(&target.topic) {
            return Err(RepublishRefused::Unfit {
                topic: target.topic,
                from: target.from,
                reason,
            });
        }
        match republish_loop(&self.consumers, &target.topic) {
            Some(consumer) => Err(RepublishRefused::Loop {
                topic: target.topic,
                consumer,
            }),
            None => Ok(target),
        }
    }

    /// The republish topic of a task of `route` from `original`, and where it comes from,
    /// loop or not.
    fn republish_candidate(&self, route: Option<&str>, original: Option<&str>) -> Option<Target> {
        let own = self.own(route);
        if let Some(topic) = own.and_then(|own| own.republish.clone()) {
            return Some(Target {
                topic,
                from: format!("routes.{}.republish_topic", route.unwrap_or_default()),
            });
        }
        if let Some(topic) = self.republish.clone() {
            return Some(Target {
                topic,
                from: self.fallback(route, "republish.target_topic"),
            });
        }
        original.map(|topic| Target {
            topic: topic.to_owned(),
            from: "the task's original topic".into(),
        })
    }

    /// `key`, said of a task of `route`, a route no longer configured when it has one.
    fn fallback(&self, route: Option<&str>, key: &str) -> String {
        match route {
            Some(route) if self.own(Some(route)).is_none() => {
                format!("{key} (route {route:?} is no longer configured)")
            }
            _ => key.to_owned(),
        }
    }

    /// The parking topic of a task of `route` (the route's own, else the global one);
    /// none means the task is not parked.
    pub fn parking_topic(&self, route: Option<&str>) -> Option<&str> {
        self.own(route)
            .and_then(|own| own.parking.as_deref())
            .or(self.parking.as_deref())
    }

    /// Whether any task may be parked: a parking producer is needed.
    pub fn parks(&self) -> bool {
        self.parking.is_some() || self.routes.values().any(|own| own.parking.is_some())
    }

    /// The targets of `task`, each with the setting it comes from.
    pub fn applied(&self, task: &Task) -> AppliedTargets {
        let route = task.failure.route.as_deref();
        let original = task.failure.original.as_ref().map(|o| o.topic.as_str());
        let republish = (task.handler == REPUBLISH_HANDLER)
            .then(|| self.republish_candidate(route, original))
            .flatten();
        let parking = match self.own(route).and_then(|own| own.parking.clone()) {
            Some(topic) => Some(Target {
                topic,
                from: format!("routes.{}.parking_topic", route.unwrap_or_default()),
            }),
            None => self.parking.clone().map(|topic| Target {
                topic,
                from: self.fallback(route, "parking.topic"),
            }),
        };
        AppliedTargets { republish, parking }
    }

    fn own(&self, route: Option<&str>) -> Option<&RouteTargets> {
        self.routes.get(route?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RouteMode, RouteSettings};
    use crate::task::{NewTask, SourceCoordinates};

    fn settings() -> Settings {
        let mut settings = Settings::default();
        settings.republish.target_topic = Some("all.retry".into());
        settings.parking.topic = Some("all.parking".into());
        let mut payments = RouteSettings::new(&["payments.dlt"], RouteMode::Capture, "republish");
        payments.name = "payments".into();
        payments.republish_topic = Some("payments.retry".into());
        payments.parking_topic = Some("payments.parking".into());
        let mut orders = RouteSettings::new(&["orders.dlt"], RouteMode::Capture, "republish");
        orders.name = "orders".into();
        settings.routes = vec![payments, orders];
        settings
    }

    fn task(route: Option<&str>, handler: &str) -> Task {
        let mut task = NewTask::new(handler, b"v".to_vec()).unsaved();
        task.failure.route = route.map(str::to_owned);
        task.failure.original = Some(
            SourceCoordinates {
                topic: "orders".into(),
                partition: 0,
                offset: 1,
            }
            .into(),
        );
        task
    }

    #[test]
    fn a_routes_own_topics_win_and_the_global_keys_are_defaults() {
        let targets = Targets::new(&settings());
        let republish = |route| targets.republish_target(route, None).map(|t| t.topic);
        assert_eq!(republish(Some("payments")), Ok("payments.retry".into()));
        assert_eq!(
            targets.parking_topic(Some("payments")),
            Some("payments.parking")
        );
        assert_eq!(republish(Some("orders")), Ok("all.retry".into()));
        assert_eq!(targets.parking_topic(Some("orders")), Some("all.parking"));
        assert_eq!(targets.parking_topic(Some("gone")), Some("all.parking"));
        assert_eq!(targets.parking_topic(None), Some("all.parking"));
        assert!(targets.parks());
        assert!(!Targets::new(&Settings::default()).parks());
    }

    /// Found by an attack: a dead letter whose original-topic header named
    /// `__consumer_offsets` was republished there (and an unfit name would have been
    /// tried against the broker at every attempt).
    #[test]
    fn an_original_topic_kafka_keeps_for_itself_or_refuses_is_no_target() {
        let bare = Settings::default();
        let targets = Targets::new(&bare);
        for (topic, reason) in [
            ("__consumer_offsets", "Kafka's internal topic"),
            ("__transaction_state", "Kafka's internal topic"),
            ("a b", "not a topic name"),
            ("..", "not a topic name Kafka accepts"),
        ] {
            let refused = targets.republish_target(None, Some(topic)).unwrap_err();
            let words = refused.to_string();
            assert!(
                matches!(refused, RepublishRefused::Unfit { .. })
                    && words.contains(reason)
                    && words.contains("the task's original topic"),
                "{topic}: {words}"
            );
        }
        assert_eq!(
            targets
                .republish_target(None, Some("orders"))
                .map(|t| t.topic),
            Ok("orders".into())
        );
    }

    #[test]
    fn applied_targets_say_where_they_come_from() {
        let targets = Targets::new(&settings());
        let applied = targets.applied(&task(Some("payments"), "republish"));
        assert_eq!(
            applied.republish.unwrap().from,
            "routes.payments.republish_topic"
        );
        assert_eq!(applied.parking.unwrap().topic, "payments.parking");
        let gone = targets.applied(&task(Some("gone"), "republish"));
        assert_eq!(
            gone.parking.unwrap().from,
            "parking.topic (route \"gone\" is no longer configured)"
        );
        let webhook = targets.applied(&task(Some("orders"), "billing"));
        assert_eq!(
            webhook.republish, None,
            "only republish tasks are republished"
        );

        let bare = Settings {
            routes: settings().routes,
            ..Settings::default()
        };
        let original = Targets::new(&bare).applied(&task(Some("orders"), "republish"));
        assert_eq!(
            original.republish,
            Some(Target {
                topic: "orders".into(),
                from: "the task's original topic".into()
            })
        );
        assert_eq!(original.parking, None);
    }

    /// Regression: a task whose original topic a capture route consumes (its own
    /// dead-letter topic, say) was republished there and came back, forever.
    #[test]
    fn an_original_topic_a_route_takes_back_is_refused_as_a_republish_target() {
        let mut orders = RouteSettings::new(&["orders.dlt"], RouteMode::Capture, "republish");
        orders.name = "orders".into();
        let mut audit = RouteSettings::new(&[], RouteMode::Capture, "log");
        audit.name = "audit".into();
        audit.pattern = Some("audit\\..*".into());
        let mut billing = RouteSettings::new(&["billing"], RouteMode::Process, "billing");
        billing.name = "billing".into();
        let mut again = RouteSettings::new(&["again"], RouteMode::Process, "republish");
        again.name = "again".into();
        let settings = Settings {
            routes: vec![orders, audit, billing, again],
            ..Settings::default()
        };
        let targets = Targets::new(&settings);
        let target = |original| targets.republish_target(Some("orders"), Some(original));
        assert_eq!(
            target("orders.dlt"),
            Err(RepublishRefused::Loop {
                topic: "orders.dlt".into(),
                consumer: "capture route \"orders\" (routes[0].topics)".into()
            })
        );
        assert_eq!(
            target("audit.dlt").unwrap_err().to_string(),
            "republish to \"audit.dlt\" refused: it is consumed by capture route \"audit\" \
             (routes[1].pattern (\"audit\\\\..*\")), so the message would come back as a new \
             task and be republished again, an endless loop"
        );
        assert!(matches!(
            target("again"),
            Err(RepublishRefused::Loop { consumer, .. }) if consumer.starts_with("process route \"again\"")
        ));
        assert_eq!(
            target("billing").map(|t| t.topic),
            Ok("billing".into()),
            "a process route of another handler is the usual way back"
        );
        assert_eq!(
            targets.republish_target(Some("orders"), None),
            Err(RepublishRefused::NoTopic)
        );
    }
}

//! Where a task's messages go: its route's `republish_topic` and `parking_topic`, with
//! `republish.target_topic` and `parking.topic` as defaults. A task whose route is no
//! longer configured (or that came from no route, e.g. `redrive enqueue`) gets the
//! global keys.

use serde::Serialize;
use std::collections::BTreeMap;

use super::Settings;
use crate::task::Task;

/// The name the built-in republish handler is registered under.
const REPUBLISH_HANDLER: &str = "republish";

/// The republish and parking topics of every route, and the global defaults.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    republish: Option<String>,
    parking: Option<String>,
    routes: BTreeMap<String, RouteTargets>,
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
        }
    }

    /// The configured republish target of a task of `route` (the route's own, else the
    /// global one); none means the task's original topic.
    pub fn republish_topic(&self, route: Option<&str>) -> Option<&str> {
        self.own(route)
            .and_then(|own| own.republish.as_deref())
            .or(self.republish.as_deref())
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
        let own = self.own(route);
        let fallback = |key: &str| match route {
            Some(route) if own.is_none() => {
                format!("{key} (route {route:?} is no longer configured)")
            }
            _ => key.to_owned(),
        };
        let from_route = |field: &str| format!("routes.{}.{field}", route.unwrap_or_default());
        let republish = (task.handler == REPUBLISH_HANDLER).then(|| {
            if let Some(topic) = own.and_then(|own| own.republish.clone()) {
                return Some(Target {
                    topic,
                    from: from_route("republish_topic"),
                });
            }
            if let Some(topic) = self.republish.clone() {
                return Some(Target {
                    topic,
                    from: fallback("republish.target_topic"),
                });
            }
            task.failure.original.as_ref().map(|original| Target {
                topic: original.topic.clone(),
                from: "the task's original topic".into(),
            })
        });
        let parking = match own.and_then(|own| own.parking.clone()) {
            Some(topic) => Some(Target {
                topic,
                from: from_route("parking_topic"),
            }),
            None => self.parking.clone().map(|topic| Target {
                topic,
                from: fallback("parking.topic"),
            }),
        };
        AppliedTargets {
            republish: republish.flatten(),
            parking,
        }
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
        assert_eq!(
            targets.republish_topic(Some("payments")),
            Some("payments.retry")
        );
        assert_eq!(
            targets.parking_topic(Some("payments")),
            Some("payments.parking")
        );
        assert_eq!(targets.republish_topic(Some("orders")), Some("all.retry"));
        assert_eq!(targets.parking_topic(Some("orders")), Some("all.parking"));
        assert_eq!(targets.parking_topic(Some("gone")), Some("all.parking"));
        assert_eq!(targets.parking_topic(None), Some("all.parking"));
        assert!(targets.parks());
        assert!(!Targets::new(&Settings::default()).parks());
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
}

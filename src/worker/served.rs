//! The handlers a pool serves, with the policy overrides of the routes their tasks
//! came from.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::config::RouteSettings;
use crate::handlers::Registered;
use crate::task::Task;

/// Handlers by name, and routes by name for their policy overrides.
#[derive(Clone, Default)]
pub(crate) struct Served {
    names: Arc<[String]>,
    handlers: BTreeMap<String, Registered>,
    routes: HashMap<String, RouteSettings>,
}

impl Served {
    /// Serves `handlers` (already selected and validated).
    pub(crate) fn new(handlers: BTreeMap<String, Registered>) -> Served {
        Served {
            names: handlers.keys().cloned().collect(),
            handlers,
            routes: HashMap::new(),
        }
    }

    /// Applies the overrides of `routes` to the tasks they ingested.
    pub(crate) fn with_routes(mut self, routes: &[RouteSettings]) -> Served {
        self.routes = routes.iter().map(|r| (r.name.clone(), r.clone())).collect();
        self
    }

    /// The handler names, as claims filter on them.
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// The names of the handlers that compensate.
    pub(crate) fn compensating(&self) -> Vec<String> {
        self.handlers
            .iter()
            .filter(|(_, registered)| registered.handler.compensates())
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The handler of `task` with the policy of its route. Claims only return tasks of
    /// served handlers.
    pub(crate) fn registered_for(&self, task: &Task) -> Registered {
        let mut registered = self.handlers[&task.handler].clone();
        if let Some(route) = task.failure.route.as_ref().and_then(|r| self.routes.get(r)) {
            registered.policy = registered.policy.for_route(route);
        }
        registered
    }
}

//! Which route a consumed topic belongs to.

use regex::Regex;
use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{pattern, Ordering, RouteSettings};

/// Routes indexed by exact topic, then by pattern.
pub(crate) struct RouteTable {
    routes: Vec<Arc<RouteSettings>>,
    exact: HashMap<String, usize>,
    patterns: Vec<(Regex, usize)>,
}

impl RouteTable {
    /// Indexes validated routes.
    pub(crate) fn new(routes: Vec<RouteSettings>) -> RouteTable {
        let mut exact = HashMap::new();
        let mut patterns = Vec::new();
        for (index, route) in routes.iter().enumerate() {
            for topic in &route.topics {
                exact.insert(topic.clone(), index);
            }
            if let Some(pattern) = &route.pattern {
                // The very string librdkafka subscribes: both engines read it alike.
                let anchored = pattern::anchored(pattern);
                patterns.push((Regex::new(&anchored).expect("validated at start-up"), index));
            }
        }
        RouteTable {
            routes: routes.into_iter().map(Arc::new).collect(),
            exact,
            patterns,
        }
    }

    /// The route of `topic`, exact names first.
    pub(crate) fn route_for(&self, topic: &str) -> Option<&Arc<RouteSettings>> {
        let index = self.exact.get(topic).copied().or_else(|| {
            self.patterns
                .iter()
                .find(|(re, _)| re.is_match(topic))
                .map(|(_, i)| *i)
        })?;
        Some(&self.routes[index])
    }

    /// Whether any route keeps its keys in order (`ordering = "key"`).
    pub(crate) fn any_ordered(&self) -> bool {
        self.all().any(|r| r.ordering == Ordering::Key)
    }

    /// Every route.
    pub(crate) fn all(&self) -> impl Iterator<Item = &RouteSettings> {
        self.routes.iter().map(|r| r.as_ref())
    }

    /// Every subscription string.
    pub(crate) fn subscriptions(&self) -> Vec<String> {
        self.routes
            .iter()
            .flat_map(|route| route.subscriptions())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RouteMode;

    fn route(name: &str, topics: &[&str], pattern: Option<&str>) -> RouteSettings {
        let mut route = RouteSettings::new(topics, RouteMode::Capture, "log");
        route.name = name.into();
        route.pattern = pattern.map(str::to_owned);
        route
    }

    #[test]
    fn exact_topics_win_over_patterns_and_patterns_match_whole_names() {
        let table = RouteTable::new(vec![
            route("all-dlt", &[], Some(r"^.*\.dlt")),
            route("orders", &["orders.dlt"], None),
        ]);
        assert_eq!(table.route_for("orders.dlt").unwrap().name, "orders");
        assert_eq!(table.route_for("payments.dlt").unwrap().name, "all-dlt");
        assert!(table.route_for("payments.dlt.archive").is_none());
        assert!(table.route_for("payments").is_none());
        assert_eq!(
            table.subscriptions(),
            vec![r"^(.*\.dlt)$".to_owned(), "orders.dlt".to_owned()]
        );
    }
}

//! Brakes of routes. Any route's brake may be engaged by an operator (`redrive brakes
//! engage`, audited). A process-mode route with `brake` also engages its own, the
//! bad-deploy brake: each member counts its inline outcomes per route in a sliding
//! window ([`SlidingWindow`], in `resilience/`); when the failure share passes the
//! route's threshold it engages the fleet's brake in PostgreSQL. Every member (following
//! the table every second) pauses an engaged route's partitions until the hold ends or
//! an operator releases it. Paused partitions fetch nothing and commit nothing past what
//! is stored, so resuming loses and repeats nothing.

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::TopicPartitionList;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::context::IngestContext;
use super::routes::RouteTable;
use crate::config::{BrakeSettings, RouteSettings};
use crate::resilience::window::{passes, SlidingWindow};
use crate::store::Store;
use crate::telemetry::Metrics;

/// How often members read the fleet's brakes (and re-pause newly assigned partitions).
pub(crate) const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// The brakes of this member's routes.
pub(crate) struct Brakes {
    store: Store,
    metrics: Metrics,
    member: String,
    /// Every route of this member: each has a brake an operator may engage.
    routes: BTreeSet<String>,
    /// The bad-deploy brakes: the process-mode routes with `brake`, and their windows.
    trips: BTreeMap<String, (BrakeSettings, Mutex<SlidingWindow>)>,
    /// Routes paused now, as last read from the fleet's table or engaged here.
    engaged: Mutex<BTreeSet<String>>,
    /// Poked when `engaged` changes: the consume loop pauses or resumes at once.
    pub(crate) changed: Notify,
}

impl Brakes {
    /// The brakes of `routes`, which trip by themselves where a route has `brake`.
    pub(crate) fn new(
        store: Store,
        metrics: Metrics,
        member: String,
        routes: &[RouteSettings],
    ) -> Brakes {
        let trips = routes
            .iter()
            .filter_map(|r| {
                let settings = r.brake.clone()?;
                let window = Mutex::new(SlidingWindow::new(settings.window));
                Some((r.name.clone(), (settings, window)))
            })
            .collect();
        Brakes {
            store,
            metrics,
            member,
            routes: routes.iter().map(|r| r.name.clone()).collect(),
            trips,
            engaged: Mutex::default(),
            changed: Notify::new(),
        }
    }

    /// Counts one inline outcome of `route`; engages its brake when the window passes
    /// the threshold.
    pub(crate) async fn record(&self, route: &str, failed: bool) {
        let Some((settings, window)) = self.trips.get(route) else {
            return;
        };
        let (failures, total) = {
            let mut window = window.lock().expect("brake window");
            window.record(Instant::now(), failed);
            window.counts(Instant::now())
        };
        if !passes(settings, failures, total) || !self.engage_locally(route) {
            return;
        }
        window.lock().expect("brake window").clear();
        let reason = format!(
            "{failures} of the last {total} messages failed inline within {}",
            humantime::format_duration(settings.window)
        );
        match self
            .store
            .engage_brake(route, settings.cool_down, &self.member, &reason)
            .await
        {
            Ok(true) => {
                self.metrics.brake_trips.with_label_values(&[route]).inc();
                tracing::warn!(route, %reason, cool_down = %humantime::format_duration(settings.cool_down),
                    "brake engaged: the route stops consuming on every member until the cool-down \
                     ends or `redrive brakes release` (a bad deploy?)");
            }
            Ok(false) => {}
            Err(error) => tracing::warn!(route, %error, %reason,
                "brake tripped but could not be recorded; this member pauses the route until it can read the brakes again"),
        }
    }

    /// Marks `route` paused here; false if it already was.
    fn engage_locally(&self, route: &str) -> bool {
        let inserted = self
            .engaged
            .lock()
            .expect("engaged routes")
            .insert(route.to_owned());
        if inserted {
            self.metrics
                .brake_engaged
                .with_label_values(&[route])
                .set(1);
            self.changed.notify_one();
        }
        inserted
    }

    /// The routes paused now.
    pub(crate) fn engaged(&self) -> BTreeSet<String> {
        self.engaged.lock().expect("engaged routes").clone()
    }

    /// Reads the fleet's brakes every [`FOLLOW_EVERY`] until `stop`. A read that fails
    /// leaves the routes as they are.
    pub(crate) async fn follow(&self, stop: CancellationToken) {
        // Every route has its series from the start (alerts see a 0, not nothing).
        for route in &self.routes {
            self.metrics
                .brake_engaged
                .with_label_values(&[route])
                .set(0);
            self.metrics.brake_trips.with_label_values(&[route]);
        }
        loop {
            match self.store.engaged_routes().await {
                Ok(engaged) => self.update(engaged.into_iter().collect()),
                Err(error) => tracing::debug!(%error, "could not read the brakes"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(FOLLOW_EVERY) => {}
            }
        }
    }

    /// Takes the fleet's engaged routes (of this member's) as the truth.
    fn update(&self, fleet: HashSet<String>) {
        let now: BTreeSet<String> = self
            .routes
            .iter()
            .filter(|r| fleet.contains(*r))
            .cloned()
            .collect();
        let before = std::mem::replace(
            &mut *self.engaged.lock().expect("engaged routes"),
            now.clone(),
        );
        if before == now {
            return;
        }
        for route in now.difference(&before) {
            self.metrics
                .brake_engaged
                .with_label_values(&[route])
                .set(1);
            tracing::info!(route, "brake engaged by the fleet: pausing the route");
        }
        for route in before.difference(&now) {
            if let Some((_, window)) = self.trips.get(route) {
                window.lock().expect("brake window").clear();
            }
            self.metrics
                .brake_engaged
                .with_label_values(&[route])
                .set(0);
            tracing::info!(route, "brake released: the route resumes consuming");
        }
        self.changed.notify_one();
    }
}

/// The partitions this member left paused, to resume when their route's brake lets go.
#[derive(Default)]
pub(crate) struct Paused(HashSet<(String, i32)>);

impl Paused {
    /// Pauses the assigned partitions of engaged routes and resumes the others it
    /// paused. Run on every change and every [`FOLLOW_EVERY`] (newly assigned partitions
    /// start unpaused).
    pub(crate) fn apply(
        &mut self,
        consumer: &StreamConsumer<IngestContext>,
        routes: &RouteTable,
        engaged: &BTreeSet<String>,
    ) {
        // Nothing engaged and nothing left paused: nothing to ask the consumer.
        if engaged.is_empty() && self.0.is_empty() {
            return;
        }
        let Ok(assignment) = consumer.assignment() else {
            return;
        };
        let mut pause = TopicPartitionList::new();
        let mut resume = TopicPartitionList::new();
        let mut now_paused = HashSet::new();
        for element in assignment.elements() {
            let (topic, partition) = (element.topic(), element.partition());
            let braked = routes
                .route_for(topic)
                .is_some_and(|r| engaged.contains(&r.name));
            if braked {
                pause.add_partition(topic, partition);
                now_paused.insert((topic.to_owned(), partition));
            } else if self.0.contains(&(topic.to_owned(), partition)) {
                resume.add_partition(topic, partition);
            }
        }
        if pause.count() > 0 {
            if let Err(error) = consumer.pause(&pause) {
                tracing::warn!(%error, "could not pause a braked route's partitions");
            }
        }
        if resume.count() > 0 {
            if let Err(error) = consumer.resume(&resume) {
                tracing::warn!(%error, "could not resume a released route's partitions");
                return;
            }
        }
        self.0 = now_paused;
    }
}

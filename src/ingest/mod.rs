//! Ingest: consume the routes' topics in one consumer group and persist failures as
//! tasks. An offset is committed only after the rows recording its messages are
//! committed; redelivered messages find their task by source coordinates.

mod brake;
mod consume;
mod context;
mod flush;
mod in_flight;
mod lineage;
mod lives;
mod mapping;
mod offsets;
mod originals;
mod outage;
mod outcome;
mod process;
mod routes;

pub use flush::FlushError;

use rdkafka::consumer::{Consumer, StreamConsumer};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use crate::parts::Watch;

use crate::config::{IngestSettings, KafkaSettings, Settings, Targets};
use crate::finals::Finals;
use crate::handlers::breakers::BreakerFollower;
use crate::handlers::Registered;
use crate::kafka::{consumer_config, redact_error};
use crate::store::Store;
use crate::telemetry::Metrics;
use brake::Brakes;
use context::IngestContext;
use flush::Flusher;
use originals::Originals;
use process::ProcessMode;
use routes::RouteTable;

/// Why ingest stopped.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The consumer could not be created or subscribed.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A batch cannot be persisted: neither its offsets nor any later are committed.
    #[error(transparent)]
    Flush(#[from] FlushError),
    /// Writing a batch failed unexpectedly (a bug): later offsets must not be committed.
    #[error("a batch could not be persisted ({0}); no later offset is committed")]
    FlushFailed(String),
    /// The follower of the fleet's brakes panicked (a bug): ingest stopped.
    #[error("a part of ingest panicked: {0}")]
    PartDied(String),
}

/// Ingest progress visible from outside (for the benchmark and the demo).
#[derive(Debug, Default)]
pub struct IngestProgress {
    /// When the first message arrived.
    pub first_consumed: OnceLock<Instant>,
}

/// The consumer of every route of this process.
pub struct Ingest {
    flusher: Flusher,
    kafka: KafkaSettings,
    limits: IngestSettings,
    progress: Arc<IngestProgress>,
}

impl Ingest {
    /// An ingest for the validated routes of `settings`, whose handlers are in
    /// `handlers`; process mode calls them inline while `breakers` (the member's
    /// follower, run by the member) says their breaker is closed.
    pub(crate) fn new(
        store: Store,
        settings: &Settings,
        handlers: Arc<BTreeMap<String, Registered>>,
        metrics: Metrics,
        breakers: Arc<BreakerFollower>,
    ) -> Ingest {
        let kafka = settings.kafka.clone();
        let limits = settings.ingest.clone();
        let routes = settings.routes.clone();
        // Who made an inline attempt, in the attempt history.
        let worker_id = format!("ingest-{}", std::process::id());
        let brakes = Arc::new(Brakes::new(
            store.clone(),
            metrics.clone(),
            worker_id.clone(),
            &routes,
        ));
        let process = ProcessMode {
            store: store.clone(),
            brakes: brakes.clone(),
            breakers,
            handlers,
            limits: limits.clone(),
            metrics: metrics.clone(),
            worker_id,
            lives: lives::Lives::new(kafka.clone(), limits.clone()),
        };
        Ingest {
            flusher: Flusher {
                store,
                brakes,
                routes: Arc::new(RouteTable::new(routes)),
                limits: limits.clone(),
                metrics,
                finals: Finals::default(),
                process: Arc::new(process),
                originals: Originals {
                    kafka: kafka.clone(),
                    limits: limits.clone(),
                    routes: settings.routes.clone().into(),
                },
                targets: Targets::new(settings),
                outage: Arc::default(),
            },
            kafka,
            limits,
            progress: Arc::default(),
        }
    }

    /// Reports process-mode tasks stored as permanent failures (parking).
    pub(crate) fn with_finals(mut self, finals: Finals) -> Ingest {
        self.flusher.finals = finals;
        self
    }

    /// Shared progress of this ingest.
    #[cfg(feature = "bench")]
    pub fn progress(&self) -> Arc<IngestProgress> {
        self.progress.clone()
    }

    /// Consumes until `shutdown` fires; then persists what was consumed and commits it.
    /// A member that cannot store what it consumes gives its partitions to the group
    /// meanwhile ([`outage`]).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), IngestError> {
        let brakes = self.flusher.brakes.clone();
        let stop_following = CancellationToken::new();
        let watch = Watch::default();
        let stop = stop_following.clone();
        let following = watch.spawn("brake follower", async move { brakes.follow(stop).await });
        let stop = watch.stop_on(&shutdown);
        let outcome = loop {
            let consumer = match self.subscribe() {
                Ok(consumer) => consumer,
                Err(error) => break Err(error),
            };
            let ended = consume::consume(
                &consumer,
                &self.flusher,
                &self.limits,
                &self.progress,
                &stop,
            )
            .await;
            let released = matches!(ended, Ok(consume::Ended::Released));
            let metrics = &self.flusher.metrics;
            // Said before the consumer leaves: its partitions may move to another
            // member (which stores their messages) before the close returns.
            if released {
                metrics.ingest_released.set(1);
            }
            // Leaving the group commits what was stored, and only that.
            close(consumer).await;
            if !released {
                break ended.map(|_| ());
            }
            let answered = outage::until_database_answers(&self.flusher.store, &stop).await;
            metrics.ingest_released.set(0);
            if !answered {
                break Ok(());
            }
            tracing::info!(
                "the database answers again: joining the group to take a share of the partitions"
            );
        };
        stop_following.cancel();
        // A panic is in `watch`.
        let _ = following.await;
        let outcome = match (outcome, watch.failure()) {
            (Ok(()), Some(died)) => Err(IngestError::PartDied(died)),
            (outcome, _) => outcome,
        };
        match &outcome {
            Ok(()) => tracing::info!("ingest stopped"),
            Err(error) => {
                tracing::error!(%error, "ingest stopped: nothing after the failed batch is committed")
            }
        }
        outcome
    }

    /// A consumer of the group, subscribed to every route's topics.
    fn subscribe(&self) -> Result<StreamConsumer<IngestContext>, IngestError> {
        let consumer: StreamConsumer<IngestContext> = consumer_config(&self.kafka)
            .create_with_context(IngestContext::new(self.flusher.metrics.clone()))
            .map_err(|e| redact_error(e, &self.kafka))?;
        let subscriptions = self.flusher.routes.subscriptions();
        let topics: Vec<&str> = subscriptions.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        tracing::info!(?topics, group = %self.kafka.group_id, "ingest started");
        Ok(consumer)
    }
}

/// How long a stopping member waits for its consumer to leave the group (the revoke
/// commits what was stored, then the member leaves). Brokers that cannot be reached
/// would hold it forever: librdkafka's synchronous commit and its unsubscribe have no
/// timeout.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Closes `consumer` on a thread of its own, waiting at most [`CLOSE_WAIT`]. Past it the
/// member stops without it (the thread ends with the process): the group moves its
/// partitions after `session.timeout.ms`, and messages whose offsets were not committed
/// are delivered again and deduplicated.
async fn close(consumer: StreamConsumer<IngestContext>) {
    let (closed, closing) = tokio::sync::oneshot::channel();
    let closer = std::thread::Builder::new()
        .name("consumer-close".into())
        .spawn(move || {
            consumer.unsubscribe();
            drop(consumer);
            let _ = closed.send(());
        });
    if let Err(error) = closer {
        tracing::warn!(%error, "could not start a thread to close the consumer; stopping without closing it");
        return;
    }
    if tokio::time::timeout(CLOSE_WAIT, closing).await.is_err() {
        tracing::warn!(
            wait = ?CLOSE_WAIT,
            "the consumer could not leave its group (brokers unreachable?); stopping without \
             it: its partitions move after session.timeout.ms, and messages not committed \
             are delivered again and deduplicated"
        );
    }
}

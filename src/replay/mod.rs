//! Running a redrive job: a replay (produce the stored bytes of the tasks its filter
//! selects to a topic) or a paced retry (make them due again for the fleet's workers), in
//! task id order, batch by batch, at the job's pace, never sending a task twice on resume.
//!
//! - [`produce`]: a replay's batches. Before a batch is produced the job records the
//!   batch's last task id and where each target partition ends (its high watermark).
//!   Every replayed message carries `redrive-replay: <job>:<task id>`, `redrive-job`,
//!   `redrive-task-id` and `redrive-generation`. When the batch is acknowledged, the
//!   cursor moves past it (and, with `mark_resolved`, its tasks are resolved) in one
//!   transaction. A runner that dies between the two leaves the batch pending: whoever
//!   resumes reads the target partitions from the recorded marks, learns which of the
//!   batch's tasks are already there, and produces only the others.
//! - [`retry`]: a retry's batches: each is made due again and the cursor moved past it in
//!   one transaction, so a runner killed at any point neither skips nor repeats a task.
//! - [`pacer`]: the pace (see [`crate::pace`]): the step's rate, the checkpoints, and the
//!   judgement after each batch that pauses the job when what it redrove fails again.

mod pacer;
mod produce;
mod retry;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::{is_internal_topic, replay_loop, KafkaSettings, RouteSettings};
use crate::kafka::reader::{ReadError, Reader};
use crate::store::{NewReplay, ReplayJob, Store, StoreError, REPLAY_STALE_AFTER};
use crate::telemetry::Metrics;

/// How often a runner renews its hold on the job, and so how soon it learns of a
/// cancel: within about this long, the messages in flight then aside.
const BEAT_EVERY: Duration = Duration::from_secs(1);
/// Longest wait for the metadata of a replay's topics before it is recorded: an
/// operator waits for the answer (an unreachable cluster is told within this).
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a replay could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The database.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Kafka refused or could not be reached.
    #[error("kafka: {0}")]
    Kafka(String),
    /// A target topic does not exist.
    #[error("topic {0:?} does not exist (nothing was produced)")]
    UnknownTopic(String),
    /// The request itself is wrong.
    #[error("{0}")]
    Invalid(String),
}

impl From<ReadError> for ReplayError {
    fn from(error: ReadError) -> Self {
        match error {
            ReadError::Kafka(why) => ReplayError::Kafka(why),
            ReadError::UnknownTopic(topic) => ReplayError::UnknownTopic(topic),
        }
    }
}

/// Checks a replay before it is recorded: [`replay_topics`], and every topic it would
/// produce to exists. Nothing is produced.
pub async fn check_replay(
    store: &Store,
    kafka: &KafkaSettings,
    routes: &[RouteSettings],
    replay: &NewReplay,
) -> Result<(), ReplayError> {
    let topics = replay_topics(store, routes, replay).await?;
    let kafka = kafka.clone();
    tokio::task::spawn_blocking(move || {
        let reader = Reader::new(&kafka)?;
        for topic in topics {
            // Bounded: an operator waits. Who could not be asked, and what failed.
            reader
                .partitions_within(&topic, CHECK_TIMEOUT)
                .map_err(|error| match error {
                    ReadError::Kafka(why) => ReplayError::Kafka(format!(
                        "cannot check topic {topic:?} with the bootstrap servers {} within \
                         {}s: {why}; nothing was recorded or produced",
                        kafka.bootstrap_servers,
                        CHECK_TIMEOUT.as_secs()
                    )),
                    other => other.into(),
                })?;
        }
        Ok(())
    })
    .await
    .expect("the topic check does not panic")
}

/// The topics a replay would produce to, after the checks that need no Kafka client: a
/// valid rate and target name, a valid filter, and no topic consumed by one of
/// `routes`' capture routes (an endless loop, see [`crate::config::replay_loop`]).
pub async fn replay_topics(
    store: &Store,
    routes: &[RouteSettings],
    replay: &NewReplay,
) -> Result<Vec<String>, ReplayError> {
    if let Some(rate) = replay.rate {
        if let Some(refusal) = crate::rate::refusal(rate) {
            return Err(ReplayError::Invalid(format!("rate {refusal}")));
        }
    }
    if let Some(topic) = &replay.target_topic {
        // The rules of the configured targets: a name Kafka accepts, not an internal one.
        if let Err(refused) = crate::config::target_topic("the target topic", topic) {
            let reason = refused.reason;
            return Err(ReplayError::Invalid(format!("the target topic {reason}")));
        }
    }
    replay.filter.validate().map_err(ReplayError::Invalid)?;
    refuse_loop(
        store,
        routes,
        &replay.filter,
        replay.target_topic.as_deref(),
    )
    .await
}

/// The topics a replay of `filter` produces to (`target`, or the selected tasks'
/// original topics), unless one of `routes`' capture routes consumes one of them (an
/// endless loop, see [`crate::config::replay_loop`]).
async fn refuse_loop(
    store: &Store,
    routes: &[RouteSettings],
    filter: &crate::store::TaskFilter,
    target: Option<&str>,
) -> Result<Vec<String>, ReplayError> {
    let topics = match target {
        Some(topic) => vec![topic.to_owned()],
        None => store.original_topics(filter).await?,
    };
    // An original topic comes from a dead letter's header: it may name one of Kafka's
    // internal topics, which a replay never produces to.
    if let Some(internal) = topics.iter().find(|t| is_internal_topic(t)) {
        return Err(ReplayError::Invalid(format!(
            "tasks of the filter have {internal:?}, Kafka's internal topic, as their original \
             topic, which a replay never produces to; narrow the filter or give a target topic"
        )));
    }
    match topics.iter().find_map(|t| replay_loop(routes, t)) {
        Some(why) => Err(ReplayError::Invalid(why)),
        None => Ok(topics),
    }
}

/// How far a running job is, told at its start and after each batch: the tasks it has
/// handled (produced or skipped) and its total. A CLI draws a bar with it; a fleet
/// member, running jobs in the background, tells no one.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Send + Sync);

/// Runs replay jobs for one runner (a CLI or a fleet member).
pub struct Replayer {
    store: Store,
    kafka: KafkaSettings,
    max_message_bytes: u32,
    runner: String,
    /// The routes of the configuration it runs with: a job whose topic one of them
    /// consumes is refused, however the job was recorded.
    routes: Vec<RouteSettings>,
    metrics: Metrics,
}

impl Replayer {
    /// A runner named `runner` producing with the cluster of `kafka`, refusing jobs
    /// that would produce to a topic one of `routes` captures.
    pub fn new(
        store: Store,
        kafka: KafkaSettings,
        max_message_bytes: u32,
        runner: String,
        routes: Vec<RouteSettings>,
    ) -> Self {
        Replayer {
            store,
            kafka,
            max_message_bytes,
            runner,
            routes,
            metrics: Metrics::new(),
        }
    }

    /// Counts what it produces in `metrics` (`redrive_produced_messages_total`).
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// This runner's name.
    pub fn runner(&self) -> &str {
        &self.runner
    }

    /// Runs `job` (already taken by this runner) until it is done, paused, cancelled, taken
    /// over, `stop` fires, or an error stops it (recorded on the job as `failed`, to be
    /// resumed). Tells `progress` how far it is (see [`Progress`]). Answers the job as it
    /// is afterwards.
    pub async fn run(
        &self,
        job: ReplayJob,
        progress: Progress<'_>,
        stop: &CancellationToken,
    ) -> Result<ReplayJob, ReplayError> {
        let id = job.id;
        let lost = stop.child_token();
        let hold = Arc::new(Hold::new());
        let beat = tokio::spawn(keep_hold(
            self.store.clone(),
            id,
            self.runner.clone(),
            lost.clone(),
            hold.clone(),
        ));
        // Checked on every run, not only when the job was recorded: it may have been
        // recorded by a CLI without the fleet's configuration, or before the route.
        let outcome = match job.kind.as_str() {
            "retry" => self.retry_all(job, progress, &lost).await,
            _ => match refuse_loop(
                &self.store,
                &self.routes,
                &job.filter,
                job.target_topic.as_deref(),
            )
            .await
            {
                Ok(_) => self.produce_all(job, progress, &lost, &hold).await,
                Err(refused) => Err(refused),
            },
        };
        beat.abort();
        if let Err(error) = &outcome {
            tracing::warn!(job = id, %error, "replay stopped; resume it with `redrive replays resume`");
            let text = error.to_string();
            self.store
                .finish_replay(id, &self.runner, Some(&text))
                .await?;
        }
        // Stopped, or paused by an operator (what it had in flight now delivered or
        // failed): a resume may hand it to another runner from here.
        self.store.release_replay(id, &self.runner).await?;
        outcome?;
        let job = self.store.replay(id).await?.ok_or(StoreError::Replay(
            crate::store::ReplayRowError::Unknown(id),
        ))?;
        Ok(job)
    }
}

/// A runner's hold on its job as the runner knows it: when it last renewed it. Once
/// [`TRUST_HOLD_FOR`] has passed since (the process was frozen, or the database out of
/// reach), another runner may have taken the job over, so this one sends nothing more.
struct Hold {
    renewed: Mutex<Instant>,
}

/// How long a runner trusts its hold after renewing it: less than the
/// [`REPLAY_STALE_AFTER`] after which another runner may take the job, by the time a
/// renewal takes to come back.
const TRUST_HOLD_FOR: Duration = Duration::from_secs(REPLAY_STALE_AFTER.as_secs() - 5);

impl Hold {
    /// A hold renewed now (the job was just taken).
    fn new() -> Hold {
        Hold {
            renewed: Mutex::new(Instant::now()),
        }
    }

    fn renew(&self) {
        *self.renewed.lock().expect("the hold's lock") = Instant::now();
    }

    /// Whether the runner may still act on the job.
    fn trusted(&self) -> bool {
        self.renewed.lock().expect("the hold's lock").elapsed() < TRUST_HOLD_FOR
    }
}

/// Renews the runner's hold every few seconds; cancels `lost` when the job was
/// cancelled, paused or taken over.
async fn keep_hold(
    store: Store,
    id: i64,
    runner: String,
    lost: CancellationToken,
    hold: Arc<Hold>,
) {
    loop {
        tokio::select! {
            _ = lost.cancelled() => return,
            _ = tokio::time::sleep(BEAT_EVERY) => {}
        }
        match store.beat_replay(id, &runner).await {
            Ok(true) => hold.renew(),
            Ok(false) => {
                tracing::info!(job = id, "replay cancelled or taken over; stopping");
                lost.cancel();
                return;
            }
            Err(error) => tracing::warn!(job = id, %error, "cannot renew the replay's hold"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_hold_not_renewed_for_most_of_the_stale_time_is_not_trusted() {
        let hold = Hold::new();
        assert!(hold.trusted());
        tokio::time::advance(TRUST_HOLD_FOR - Duration::from_millis(1)).await;
        assert!(hold.trusted(), "just within");
        tokio::time::advance(Duration::from_millis(2)).await;
        assert!(!hold.trusted(), "a frozen runner wakes past its hold");
        hold.renew();
        assert!(hold.trusted(), "renewed");
        assert!(
            TRUST_HOLD_FOR < REPLAY_STALE_AFTER,
            "it stops trusting its hold before another runner may take the job"
        );
    }
}

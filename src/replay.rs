//! Running a replay job: produce the stored bytes of the tasks its filter selects, in
//! task id order, batch by batch, without ever producing a message twice on resume.
//!
//! Before a batch is produced the job records the batch's last task id and where each
//! target partition ends (its high watermark). Every replayed message carries
//! `redrive-replay: <job>:<task id>`. When the batch is acknowledged, the cursor moves
//! past it (and, with `mark_resolved`, its tasks are resolved) in one transaction. A
//! runner that dies between the two leaves the batch pending: whoever resumes reads the
//! target partitions from the recorded marks, learns which of the batch's tasks are
//! already there, and produces only the others.

use rdkafka::producer::FutureProducer;
use std::collections::{BTreeSet, HashSet};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::config::{is_internal_topic, replay_loop, KafkaSettings, RouteSettings};
use crate::kafka::context::QuietContext;
use crate::kafka::dlt::own;
use crate::kafka::produce::{is_permanent, produce_task};
use crate::kafka::reader::{ReadError, Reader};
use crate::kafka::{producer_config, redact_error};
use crate::store::{apply_batch, Action, Marks, NewReplay, Operator, ReplayJob, Store, StoreError};
use crate::task::{Task, TaskId};
use crate::telemetry::Metrics;

/// Tasks per batch at most.
const REPLAY_BATCH: i64 = 200;
/// Payload bytes per batch at most (a larger single task goes alone).
const REPLAY_BATCH_BYTES: i64 = 16 * 1024 * 1024;
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

    /// Runs `job` (already taken by this runner) until it is done, cancelled, taken
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
        let beat = tokio::spawn(keep_hold(
            self.store.clone(),
            id,
            self.runner.clone(),
            lost.clone(),
        ));
        // Checked on every run, not only when the job was recorded: it may have been
        // recorded by a CLI without the fleet's configuration, or before the route.
        let outcome = match refuse_loop(
            &self.store,
            &self.routes,
            &job.filter,
            job.target_topic.as_deref(),
        )
        .await
        {
            Ok(_) => self.produce_all(job, progress, &lost).await,
            Err(refused) => Err(refused),
        };
        beat.abort();
        if let Err(error) = &outcome {
            tracing::warn!(job = id, %error, "replay stopped; resume it with `redrive replays resume`");
            let text = error.to_string();
            self.store
                .finish_replay(id, &self.runner, Some(&text))
                .await?;
        }
        outcome?;
        if stop.is_cancelled() {
            self.store.release_replay(id, &self.runner).await?;
        }
        let job = self.store.replay(id).await?.ok_or(StoreError::Replay(
            crate::store::ReplayRowError::Unknown(id),
        ))?;
        Ok(job)
    }

    async fn produce_all(
        &self,
        job: ReplayJob,
        progress: Progress<'_>,
        lost: &CancellationToken,
    ) -> Result<(), ReplayError> {
        let producer: FutureProducer<QuietContext> =
            producer_config(&self.kafka, self.max_message_bytes)
                .create_with_context(QuietContext::default())
                .map_err(|e| ReplayError::Kafka(redact_error(e, &self.kafka).to_string()))?;
        let limiter = job.rate.map(|rate| crate::rate::limiter(rate, 1));
        let total = job.total.unwrap_or(0).max(0) as u64;
        let mut done = (job.produced + job.skipped).max(0) as u64;
        progress(done, total);
        let operator = Operator {
            actor: job.actor.clone(),
            reason: Some(format!("replayed by job {}", job.id)),
        };
        let mut cursor = job.cursor;
        // A batch a stopped runner left pending: what of it is already on the topics.
        let mut pending = match (job.pending_upto, &job.pending_marks) {
            (Some(upto), Some(marks)) => {
                let kafka = self.kafka.clone();
                let marks = marks.clone();
                let done = tokio::task::spawn_blocking(move || {
                    Reader::new(&kafka)?.replayed_since(job.id, &marks)
                })
                .await
                .expect("the read-back does not panic")?;
                tracing::info!(job = job.id, found = done.len(), "resuming a replay batch");
                Some((upto, done))
            }
            _ => None,
        };
        loop {
            if lost.is_cancelled() {
                return Ok(());
            }
            let upto = pending.as_ref().map(|(upto, _)| *upto);
            let page = self
                .store
                .replay_batch(&job.filter, cursor, upto, REPLAY_BATCH, REPLAY_BATCH_BYTES)
                .await?;
            let tasks = page.tasks;
            let Some(last) = page.last else {
                if let Some((upto, _)) = pending.take() {
                    // The pending batch's tasks no longer match: move past it.
                    self.commit(&job, &operator, upto, &[], 0, false).await?;
                    cursor = upto;
                    continue;
                }
                self.store.finish_replay(job.id, &self.runner, None).await?;
                progress(done.max(total), done.max(total));
                return Ok(());
            };
            let already: HashSet<i64> = match &pending {
                Some((_, done)) => done.clone(),
                None => {
                    let marks = self.marks_for(&job, &tasks).await?;
                    if !self
                        .store
                        .begin_replay_batch(job.id, &self.runner, last, &marks)
                        .await?
                    {
                        return Ok(());
                    }
                    HashSet::new()
                }
            };
            // A pending batch is re-read in pages up to its end: its selection may have
            // grown since it was begun (tasks failing meanwhile), and a page that stops
            // short of the end moves the cursor only as far as the page went.
            let (upto, rest) = match pending.take() {
                Some((upto, done)) if last < upto => (last, Some((upto, done))),
                Some((upto, _)) => (upto, None),
                None => (last, None),
            };
            let mut sent = Vec::new();
            let mut skipped = 0;
            let mut sends = Vec::new();
            // The last task of the batch handled (produced, skipped or found produced).
            let mut handled_upto = None;
            for task in &tasks {
                if let Some(limiter) = &limiter {
                    // A slow rate must not hold up a cancel or a shutdown: what was
                    // produced so far is recorded below.
                    tokio::select! {
                        _ = lost.cancelled() => break,
                        _ = limiter.until_ready() => {}
                    }
                } else if lost.is_cancelled() {
                    break;
                }
                handled_upto = Some(task.id.0);
                let Some(topic) = target_of(&job, task) else {
                    skipped += 1;
                    continue;
                };
                sent.push(task.id);
                if already.contains(&task.id.0) {
                    continue;
                }
                let extra = [
                    (own::TASK_ID, task.id.to_string()),
                    (own::REPLAY, format!("{}:{}", job.id, task.id)),
                ];
                // Spawned, so each message leaves when the limiter admits it.
                let (producer, task, topic) = (producer.clone(), task.clone(), topic.to_owned());
                sends.push(tokio::spawn(async move {
                    produce_task(&producer, &topic, &task, &extra)
                        .await
                        .map_err(|error| (topic, error))
                }));
            }
            for result in futures::future::join_all(sends).await {
                let result = result.expect("producing does not panic");
                self.metrics.count_produced("replay", result.is_ok());
                if let Err((topic, error)) = result {
                    let error = redact_error(error, &self.kafka);
                    let kind = if is_permanent(&error) {
                        "refused"
                    } else {
                        "failed"
                    };
                    return Err(ReplayError::Kafka(format!(
                        "producing to {topic} {kind}: {error}"
                    )));
                }
            }
            let whole = handled_upto == tasks.last().map(|task| task.id.0);
            let (upto, skipped, rest) = match handled_upto {
                // Every task of the batch handled: past its end (and its unreadable rows).
                _ if whole => (upto, skipped + page.unreadable, rest),
                // Cancelled or stopping part-way: up to the last task produced, so that
                // the job counts (and with mark_resolved resolves) what reached the
                // topics; the rest of the batch stays pending for a resume to read back.
                Some(partial) => (partial, skipped, Some((upto, HashSet::new()))),
                None => return Ok(()),
            };
            let still_pending = rest.is_some();
            let ours = self.commit(&job, &operator, upto, &sent, skipped, still_pending);
            if !ours.await? || lost.is_cancelled() {
                return Ok(());
            }
            done += (sent.len() + skipped as usize) as u64;
            progress(done, total);
            cursor = upto;
            pending = rest;
        }
    }

    /// Moves the job past the batch up to `upto`: counts, and with `mark_resolved` the
    /// replayed tasks resolved, in one transaction. `still_pending`: `upto` is inside the
    /// pending batch, whose end and marks stay recorded. False when the job is no longer
    /// ours.
    async fn commit(
        &self,
        job: &ReplayJob,
        operator: &Operator,
        upto: i64,
        sent: &[TaskId],
        skipped: i64,
        still_pending: bool,
    ) -> Result<bool, ReplayError> {
        let mut tx = self
            .store
            .pool()
            .begin_with(crate::store::ORDERED_WALK)
            .await
            .map_err(StoreError::from)?;
        if job.mark_resolved && !sent.is_empty() {
            let selection = crate::store::Selection::Ids(sent.to_vec());
            // Replaying is the operator's deliberate redo: what it produced is resolved,
            // over a compensation too.
            let resolve = Action::Resolve { force: true };
            apply_batch(&mut tx, operator, &resolve, &selection, 0, None).await?;
        }
        let ours = Store::end_replay_batch(
            &mut tx,
            job.id,
            &self.runner,
            upto,
            sent.len() as i64,
            skipped,
            still_pending,
        )
        .await?;
        if ours {
            tx.commit().await.map_err(StoreError::from)?;
        }
        Ok(ours)
    }

    /// The high watermarks of every partition of the batch's target topics.
    async fn marks_for(&self, job: &ReplayJob, tasks: &[Task]) -> Result<Marks, ReplayError> {
        let topics: BTreeSet<String> = tasks
            .iter()
            .filter_map(|t| target_of(job, t).map(str::to_owned))
            .collect();
        let kafka = self.kafka.clone();
        tokio::task::spawn_blocking(move || {
            let reader = Reader::new(&kafka)?;
            let mut marks = Marks::new();
            for topic in topics {
                let mut ends = std::collections::BTreeMap::new();
                for partition in reader.partitions(&topic)? {
                    ends.insert(partition, reader.high_watermark(&topic, partition)?);
                }
                marks.insert(topic, ends);
            }
            Ok(marks)
        })
        .await
        .expect("reading watermarks does not panic")
    }
}

/// Where `task` is replayed to, or none when it cannot be (no topic known, or its
/// payload was not stored: producing it would write an empty record).
fn target_of<'a>(job: &'a ReplayJob, task: &'a Task) -> Option<&'a str> {
    if !task.failure.payload_stored {
        return None;
    }
    job.target_topic
        .as_deref()
        .or(task.failure.original.as_ref().map(|o| o.topic.as_str()))
        // Refused before the job starts; a task whose original topic changed since is
        // skipped.
        .filter(|topic| !is_internal_topic(topic))
}

/// Renews the runner's hold every few seconds; cancels `lost` when the job was
/// cancelled or taken over.
async fn keep_hold(store: Store, id: i64, runner: String, lost: CancellationToken) {
    loop {
        tokio::select! {
            _ = lost.cancelled() => return,
            _ = tokio::time::sleep(BEAT_EVERY) => {}
        }
        match store.beat_replay(id, &runner).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(job = id, "replay cancelled or taken over; stopping");
                lost.cancel();
                return;
            }
            Err(error) => tracing::warn!(job = id, %error, "cannot renew the replay's hold"),
        }
    }
}

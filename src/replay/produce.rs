//! Producing a replay job's messages, batch by batch, without ever producing one twice
//! on resume (see the module doc of [`super`]).

use rdkafka::producer::FutureProducer;
use std::collections::{BTreeSet, HashSet};
use tokio_util::sync::CancellationToken;

use super::pacer::{BatchDone, Next, Pacer};
use super::{Hold, Progress, ReplayError, Replayer};
use crate::config::is_internal_topic;
use crate::kafka::context::QuietContext;
use crate::kafka::dlt::own;
use crate::kafka::produce::{is_permanent, produce_task};
use crate::kafka::reader::Reader;
use crate::kafka::{producer_config, redact_error};
use crate::store::{apply_batch, Action, Marks, Operator, ReplayJob, Store, StoreError, Walk};
use crate::task::{Task, TaskId};

/// Payload bytes per batch at most (a larger single task goes alone).
const REPLAY_BATCH_BYTES: i64 = 16 * 1024 * 1024;

impl Replayer {
    /// Produces replay `job`'s messages from where it stands to its end, at its pace.
    pub(super) async fn produce_all(
        &self,
        job: ReplayJob,
        progress: Progress<'_>,
        lost: &CancellationToken,
        hold: &Hold,
    ) -> Result<(), ReplayError> {
        let producer: FutureProducer<QuietContext> =
            producer_config(&self.kafka, self.max_message_bytes)
                .create_with_context(QuietContext::default())
                .map_err(|e| ReplayError::Kafka(redact_error(e, &self.kafka).to_string()))?;
        let mut pacer = Pacer::new(&job);
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
            // Tasks stored after the job was recorded never join it, and it never
            // handles more than it counted then (and was confirmed or approved for).
            let pending_upto = pending.as_ref().map(|(upto, _)| *upto);
            let upto = match (pending_upto, job.upto_id) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let left = match (&pending, job.upto_id, job.total) {
                (None, Some(_), Some(total)) => total - done as i64,
                _ => i64::MAX,
            };
            let limit = pacer.batch_limit(done as i64).min(left);
            let page = match limit > 0 {
                true => {
                    (self.store)
                        .replay_batch(&job.filter, cursor, upto, limit, REPLAY_BATCH_BYTES)
                        .await?
                }
                false => Default::default(),
            };
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
            // Claimed before they are produced: another job (a replay or a retry) leaves
            // them out from then on, and this one leaves out those another claimed.
            let candidates: Vec<TaskId> = tasks.iter().map(|t| t.id).collect();
            let mine: HashSet<TaskId> = (self.store)
                .claim_for_replay(job.id, &candidates, job.force)
                .await?
                .into_iter()
                .collect();
            let limiter = pacer.limiter(job.rate);
            for task in &tasks {
                if let Some(limiter) = limiter {
                    // A slow rate must not hold up a cancel or a shutdown: what was
                    // produced so far is recorded below.
                    tokio::select! {
                        _ = lost.cancelled() => break,
                        _ = limiter.until_ready() => {}
                    }
                } else if lost.is_cancelled() {
                    break;
                }
                // A runner that could not renew its hold for a while (frozen, or cut off
                // from the database) may have been replaced: it sends nothing more.
                if !hold.trusted() {
                    tracing::warn!(job = job.id, "the hold on the job is not renewed; stopping");
                    lost.cancel();
                    break;
                }
                handled_upto = Some(task.id.0);
                let Some(topic) = target_of(&job, task) else {
                    skipped += 1;
                    continue;
                };
                // Another job's task is not this one's to replay (unless forced).
                if !mine.contains(&task.id) {
                    skipped += 1;
                    continue;
                }
                sent.push(task.id);
                if already.contains(&task.id.0) {
                    continue;
                }
                let extra = [
                    (own::TASK_ID, task.id.to_string()),
                    (own::REPLAY, format!("{}:{}", job.id, task.id)),
                    (own::JOB, job.id.to_string()),
                    (own::GENERATION, task.failure.generation.to_string()),
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
            let before = cursor;
            cursor = upto;
            pending = rest;
            let batch = BatchDone {
                before,
                cursor,
                sent: sent.len() as i64,
                done: done as i64,
            };
            let next = pacer.after_batch(&self.store, &self.runner, batch, lost);
            if next.await? == Next::Stop {
                return Ok(());
            }
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
            apply_batch(&mut tx, operator, &resolve, &selection, Walk::WHOLE, None).await?;
        }
        Store::mark_redriven(&mut tx, job.id, sent, false).await?;
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

//! The consume loop: batch consumed messages, persist batches concurrently, and commit
//! their offsets strictly in consumption order.
//!
//! A batch whose rows are not stored is a barrier: nothing consumed after it is
//! committed. Flushes never give up while the member runs (they retry the insert until
//! it works), so the loop only ever commits the oldest flush, after it stored its rows.
//! At shutdown, flushes get a deadline; the first one that misses it stops every later
//! commit, and the group redelivers from the last committed offsets.

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::brake::{Paused, FOLLOW_EVERY};
use super::context::IngestContext;
use super::flush::{FlushError, Flusher};
use super::in_flight::FlushesInFlight;
use super::offsets::Offsets;
use super::{IngestError, IngestProgress};
use crate::config::{IngestSettings, FLUSHES_IN_FLIGHT};
use crate::kafka::message::Consumed;
use crate::telemetry::Metrics;

/// How often the latest offsets are committed again, so that a refused commit of an
/// idle partition is not the last word.
const RECOMMIT_EVERY: Duration = Duration::from_secs(3);

/// How long flushes still running at shutdown may take before they are abandoned.
const SHUTDOWN_FLUSH_DEADLINE: Duration = Duration::from_secs(10);

/// The batch being filled: it closes at `batch_size` messages, at `batch_bytes`, or when
/// its linger time has passed.
struct Batch {
    messages: Vec<Consumed>,
    bytes: usize,
    linger_until: Option<tokio::time::Instant>,
    max_messages: usize,
    max_bytes: usize,
    linger: Duration,
}

impl Batch {
    fn new(limits: &IngestSettings) -> Batch {
        Batch {
            messages: Vec::new(),
            bytes: 0,
            linger_until: None,
            max_messages: limits.batch_size as usize,
            max_bytes: limits.batch_bytes as usize,
            linger: limits.linger,
        }
    }

    fn push(&mut self, message: Consumed) {
        self.bytes += message.size();
        self.messages.push(message);
        self.linger_until
            .get_or_insert_with(|| tokio::time::Instant::now() + self.linger);
    }

    /// Full by count or by bytes: consume no more until it is flushed.
    fn is_full(&self) -> bool {
        self.messages.len() >= self.max_messages || self.bytes >= self.max_bytes
    }

    /// Ready to be flushed: full, or lingered long enough.
    fn is_ready(&self) -> bool {
        !self.messages.is_empty()
            && (self.is_full()
                || self
                    .linger_until
                    .is_some_and(|at| at <= tokio::time::Instant::now()))
    }

    fn take(&mut self) -> Vec<Consumed> {
        self.bytes = 0;
        self.linger_until = None;
        std::mem::take(&mut self.messages)
    }

    /// Leaves out the messages of partitions given up in a rebalance: uncommitted, they
    /// go to the partitions' next owner.
    fn leave_out(&mut self, given_up: &[(String, i32)]) {
        if given_up.is_empty() {
            return;
        }
        self.messages.retain(|m| {
            let (topic, partition) = (m.message.topic(), m.message.partition());
            !given_up.iter().any(|(t, p)| t == topic && *p == partition)
        });
        self.bytes = self.messages.iter().map(Consumed::size).sum();
        if self.messages.is_empty() {
            self.linger_until = None;
        }
    }
}

/// Starts flushing `messages`, noting which partitions the flush holds until it ends.
fn spawn_flush(
    flusher: &Flusher,
    in_flight: &Arc<FlushesInFlight>,
    messages: Vec<Consumed>,
) -> JoinHandle<Result<Offsets, FlushError>> {
    let mut partitions: Vec<(String, i32)> = messages
        .iter()
        .map(|m| (m.message.topic().to_owned(), m.message.partition()))
        .collect();
    partitions.sort_unstable();
    partitions.dedup();
    let flushing = in_flight.start(partitions.into_iter());
    let flush = flusher.clone().flush(messages);
    tokio::spawn(async move {
        let outcome = flush.await;
        flushing.ended(outcome.as_ref().ok());
        outcome
    })
}

/// Flushes in consumption order.
type Flushes = VecDeque<JoinHandle<Result<Offsets, FlushError>>>;

/// Why consuming ended without an error.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// `shutdown` fired: what was consumed is stored and committed as far as it could be.
    Stopped,
    /// The database has not answered for `ingest.release_partitions_after`: the
    /// batches not stored are given up, for the partitions' next owner to read again.
    Released,
}

/// Consumes `consumer` until `shutdown` fires, a batch cannot be persisted, or the
/// database has not answered for `ingest.release_partitions_after`.
pub(crate) async fn consume(
    consumer: &StreamConsumer<IngestContext>,
    flusher: &Flusher,
    limits: &IngestSettings,
    progress: &IngestProgress,
    shutdown: &CancellationToken,
) -> Result<Ended, IngestError> {
    let metrics = &flusher.metrics;
    let mut batch = Batch::new(limits);
    let mut flushes: Flushes = VecDeque::new();
    let mut errors = ConsumerErrors::default();
    // Ordered routes need each batch stored before the next one looks at its keys.
    let in_flight = if flusher.routes.any_ordered() {
        1
    } else {
        FLUSHES_IN_FLIGHT
    };
    let brakes = flusher.brakes.clone();
    let mut paused = Paused::default();
    let mut follow = tokio::time::interval(FOLLOW_EVERY);
    follow.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let holding = consumer.context().in_flight.clone();
    let mut recommit = tokio::time::interval(RECOMMIT_EVERY);
    recommit.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        batch.leave_out(&holding.take_given_up());
        if batch.is_ready() && flushes.len() < in_flight {
            flushes.push_back(spawn_flush(flusher, &holding, batch.take()));
        }
        // Lingering matters only when a flush could start once it ends: with every flush
        // slot taken, an expired linger would fire on every turn (a busy loop).
        let linger_until = batch.linger_until;
        let may_flush = flushes.len() < in_flight;
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            flushed = oldest(&mut flushes) => {
                flushes.pop_front();
                match flushed {
                    Ok(Ok(offsets)) => commit(consumer, offsets, CommitMode::Async),
                    Ok(Err(error)) => return Err(abandon(flushes, error.into())),
                    Err(panic) => {
                        let error = IngestError::FlushFailed(panic.to_string());
                        return Err(abandon(flushes, error));
                    }
                }
            }
            _ = sleep_until(linger_until), if may_flush && !batch.messages.is_empty() => {}
            // Brakes: pause or resume at once on a change, and re-pause partitions
            // assigned since (they start unpaused).
            _ = brakes.changed.notified() => {
                paused.apply(consumer, &flusher.routes, &brakes.engaged());
            }
            _ = follow.tick() => {
                if flusher.outage.lasted(limits.release_partitions_after) {
                    tracing::warn!(after = ?limits.release_partitions_after,
                        "the database has not answered ingest: giving this member's partitions \
                         to the group, for members that can store; batches not stored are left \
                         to the partitions' next owner");
                    release(flushes).await;
                    flusher.outage.answered();
                    return Ok(Ended::Released);
                }
                paused.apply(consumer, &flusher.routes, &brakes.engaged());
            }
            _ = recommit.tick() => consumer.context().commit_latest_again(consumer),
            received = consumer.recv(), if !batch.is_full() => match received {
                Ok(message) => {
                    // A rebalance in this receive gave partitions up: their earlier
                    // messages go now, before a message of a partition assigned since.
                    batch.leave_out(&holding.take_given_up());
                    progress.first_consumed.get_or_init(Instant::now);
                    errors.recovered();
                    batch.push(Consumed::new(&message));
                }
                Err(error) => errors.seen(&error, metrics),
            },
        }
    }
    finish(consumer, flusher, batch, flushes).await;
    Ok(Ended::Stopped)
}

/// Gives up every flush in progress and waits for each to end: a flush that ends
/// unstored marks its partitions so, and leaving the group commits none of them.
async fn release(flushes: Flushes) {
    for flush in &flushes {
        flush.abort();
    }
    for flush in flushes {
        let _ = flush.await;
    }
}

/// At shutdown: persist what was consumed, committing in order until the first batch
/// that is not stored within the deadline. Nothing here waits on the brokers: the
/// commits are sent as the consumer closes, which [`super::close`] bounds.
async fn finish(
    consumer: &StreamConsumer<IngestContext>,
    flusher: &Flusher,
    mut batch: Batch,
    mut flushes: Flushes,
) {
    // The last batch starts once the others are stored, as ordered routes need.
    batch.leave_out(&consumer.context().in_flight.take_given_up());
    let holding = consumer.context().in_flight.clone();
    let mut last = (!batch.messages.is_empty()).then(|| batch.take());
    let deadline = tokio::time::Instant::now() + SHUTDOWN_FLUSH_DEADLINE;
    loop {
        if flushes.is_empty() {
            let Some(last) = last.take() else { return };
            flushes.push_back(spawn_flush(flusher, &holding, last));
        }
        let flush = flushes.pop_front().expect("one flush at least");
        match tokio::time::timeout_at(deadline, flush).await {
            // Asynchronous: with the brokers gone a synchronous commit waits for a
            // coordinator for ever. The bounded close sends what is outstanding.
            Ok(Ok(Ok(offsets))) => commit(consumer, offsets, CommitMode::Async),
            outcome => {
                let reason = match outcome {
                    Err(_) => "not stored before the shutdown deadline".to_owned(),
                    Ok(Ok(Err(error))) => error.to_string(),
                    Ok(Err(panic)) => panic.to_string(),
                    Ok(Ok(Ok(_))) => unreachable!("matched above"),
                };
                tracing::warn!(%reason, "a consumed batch was not stored; it and every later \
                    batch stay uncommitted and will be redelivered");
                abandon(flushes, IngestError::FlushFailed(reason));
                return;
            }
        }
    }
}

/// Aborts every flush after a failed one: none of their offsets may be committed.
fn abandon(flushes: Flushes, error: IngestError) -> IngestError {
    for flush in flushes {
        flush.abort();
    }
    error
}

/// The oldest flush, or never when there is none.
async fn oldest(
    flushes: &mut Flushes,
) -> Result<Result<Offsets, FlushError>, tokio::task::JoinError> {
    match flushes.front_mut() {
        Some(flush) => flush.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Commits `offsets` for the partitions still assigned to this consumer; offsets of
/// partitions lost in a rebalance are left to their new owner.
fn commit(consumer: &StreamConsumer<IngestContext>, offsets: Offsets, mode: CommitMode) {
    let assignment = match consumer.assignment() {
        Ok(assignment) => assignment,
        Err(error) => {
            tracing::warn!(%error, "cannot read the assignment; not committing");
            return;
        }
    };
    let mut tpl = TopicPartitionList::new();
    for ((topic, partition), next) in offsets {
        if assignment.find_partition(&topic, partition).is_some() {
            if let Err(error) = tpl.add_partition_offset(&topic, partition, Offset::Offset(next)) {
                tracing::warn!(%error, "bad offset");
            }
        }
    }
    if tpl.count() == 0 {
        return;
    }
    // Remembered, to be committed again once a rebalance (which refuses commits) ends.
    consumer.context().committing(&tpl);
    if let Err(error) = consumer.commit(&tpl, mode) {
        tracing::warn!(%error, "offset commit failed; the messages will be redelivered and deduplicated");
    }
}

/// Consumer errors, counted every time and logged once per change of state.
#[derive(Default)]
struct ConsumerErrors {
    current: Option<String>,
}

impl ConsumerErrors {
    fn seen(&mut self, error: &rdkafka::error::KafkaError, metrics: &Metrics) {
        let kind = error
            .rdkafka_error_code()
            .map_or_else(|| "other".to_owned(), |code| format!("{code:?}"));
        metrics.consumer_errors.with_label_values(&[&kind]).inc();
        if self.current.as_deref() != Some(kind.as_str()) {
            tracing::warn!(%error, "consumer error (logged once until it changes; counted in \
                redrive_consumer_errors_total)");
            self.current = Some(kind);
        }
    }

    fn recovered(&mut self) {
        if let Some(kind) = self.current.take() {
            tracing::info!(previous = %kind, "consumer receives messages again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_closes_by_count_or_by_bytes() {
        let limits = IngestSettings {
            batch_size: 3,
            batch_bytes: 1000,
            ..IngestSettings::default()
        };
        let mut batch = Batch::new(&limits);
        assert!(!batch.is_ready(), "an empty batch is never flushed");
        batch.push(Consumed::for_test(400));
        batch.push(Consumed::for_test(400));
        assert!(!batch.is_full());
        batch.push(Consumed::for_test(400));
        assert!(batch.is_full(), "1200 bytes");
        assert!(batch.is_ready());
        assert_eq!(batch.take().len(), 3);
        assert_eq!(batch.bytes, 0);
        for _ in 0..3 {
            batch.push(Consumed::for_test(1));
        }
        assert!(batch.is_full(), "3 messages");
    }
}

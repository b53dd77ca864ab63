//! One batch (claim, publish, mark — in one transaction) and the loops that run
//! batches. The design, and why the claim is a row lock: docs/design.md, "The relay".

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use pg_plumbing::Pool;
use tokio::sync::{Notify, watch};
use uuid::Uuid;

use crate::relay::backoff::Backoff;
use crate::relay::broker::BrokerHealth;
use crate::relay::cursor::ClaimCursor;
use crate::relay::error::{EngineError, error_chain};
use crate::relay::failure::{FailureKind, PublishError};
use crate::relay::gate::{RunningGate, StandbyGate};
use crate::relay::hooks::BatchHealth;
use crate::relay::metrics;
use crate::relay::publish::{MessageSettings, Producers, publish_batch};
use crate::relay::wakeup::WakeupRequest;
use crate::{ClaimTransaction, GateStandbys, PendingEvent, PublishFailure};

/// Time allowed on top of the publish timeout for the claim transaction's own
/// statements (claim, mark, record failures, commit) and scheduling delays.
pub const TRANSACTION_MARGIN: Duration = Duration::from_secs(2);

/// How one relay claims and publishes.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub message: MessageSettings,
    /// Claim only the oldest unpublished event of each aggregate, so that an
    /// aggregate's events reach the topic in commit order (with
    /// [`MessageKey::AggregateId`]: Kafka orders within a partition only).
    ///
    /// [`MessageKey::AggregateId`]: crate::relay::MessageKey::AggregateId
    pub ordered: bool,
    /// Rows claimed, and published concurrently, per transaction.
    pub batch_size: u32,
    /// Upper bound on one batch's delivery (`message.timeout.ms`).
    pub publish_timeout: Duration,
    /// The replication gate: the standbys that must have a batch's WAL before it is
    /// published; `None`: off.
    pub standbys: Option<GateStandbys>,
    /// Rejections (not outages: see [`failure`]) after which a row is set dead.
    ///
    /// [`failure`]: crate::relay::failure
    pub max_attempts: u32,
    /// The retry delay of a row whose publish failed.
    pub backoff: Backoff,
}

impl RelaySettings {
    /// `message` with the defaults the reference relay ships: batches of 500
    /// unordered, a 5 s publish timeout, no gate, dead after 10 rejections, retries
    /// from 1 s doubling to 5 min.
    pub fn new(message: MessageSettings) -> RelaySettings {
        RelaySettings {
            message,
            ordered: false,
            batch_size: 500,
            publish_timeout: Duration::from_secs(5),
            standbys: None,
            max_attempts: 10,
            backoff: Backoff {
                base: Duration::from_secs(1),
                max: Duration::from_secs(300),
            },
        }
    }

    /// How long the batch waits for acknowledgements. `message.timeout.ms` already
    /// resolves every delivery future within `publish_timeout`; this outer bound only
    /// guards against a producer that does not keep its word.
    pub fn publish_deadline(&self) -> Duration {
        self.publish_timeout + TRANSACTION_MARGIN / 2
    }

    /// `idle_in_transaction_session_timeout` and `statement_timeout` of the claim
    /// transaction: above the publish deadline (so a healthy batch is never cut off),
    /// and the server's guarantee that a hung or partitioned relay's transaction — and
    /// so its row locks — ends anyway.
    pub fn transaction_timeout(&self) -> Duration {
        self.publish_timeout + TRANSACTION_MARGIN
    }
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    pub claimed: usize,
    pub published: u64,
    pub failed: usize,
    pub dead: usize,
}

/// The broker's answers for one batch, sorted into what gets marked and what gets
/// recorded as failed.
struct Answers {
    acked: Vec<Uuid>,
    acked_created_at: Vec<DateTime<Utc>>,
    failures: Vec<PublishFailure>,
}

/// One relay process's engine, shared by its batch loops.
pub struct Relay {
    pool: Pool,
    producers: Arc<Producers>,
    settings: RelaySettings,
    health: Arc<BrokerHealth>,
    /// The process's readiness: batches that keep failing make it not ready.
    process: Arc<dyn BatchHealth>,
    /// Shared by the batch loops: where their next claim starts.
    cursor: ClaimCursor,
    /// The replication gate, when on; shared by the batch loops.
    gate: Option<RunningGate>,
}

impl Relay {
    /// The engine over `pool`, publishing through `producers`. `health` is the broker's
    /// availability as this process sees it, shared with the probe that ends an outage
    /// ([`probe_outages`]); `process` is told how the batches fare. Starts the
    /// replication gate's watcher when `settings.standbys` asks for the gate.
    ///
    /// [`probe_outages`]: crate::relay::probe_outages
    pub fn new(
        pool: Pool,
        producers: Arc<Producers>,
        settings: RelaySettings,
        health: Arc<BrokerHealth>,
        process: Arc<dyn BatchHealth>,
    ) -> Relay {
        let gate = settings
            .standbys
            .clone()
            .map(|standbys| StandbyGate::start(pool.clone(), standbys));
        Relay {
            pool,
            producers,
            settings,
            health,
            process,
            cursor: ClaimCursor::default(),
            gate,
        }
    }

    pub fn settings(&self) -> &RelaySettings {
        &self.settings
    }

    pub fn producers(&self) -> &Producers {
        &self.producers
    }

    /// Claims up to `batch_size` rows, publishes them, marks the acknowledged ones
    /// published and records the failures, then commits: two round trips to the
    /// database around the publish. The transaction lives about publish timeout +
    /// [`TRANSACTION_MARGIN`], and the server ends it should the relay hang. If it
    /// fails for any reason nothing is marked, and acknowledged messages are published
    /// again later (at least once).
    pub async fn run_batch(&self) -> Result<BatchOutcome, EngineError> {
        let started = Instant::now();
        let (transaction, events) = self.claim().await?;
        let claimed_at = Instant::now();
        if events.is_empty() {
            transaction.commit(&[], &[]).await?;
            return Ok(BatchOutcome::default());
        }
        if let (Some(running), Some(position)) = (&self.gate, transaction.position()) {
            // Behind: dropping the transaction rolls the claim back, rows untouched.
            running
                .gate
                .wait(position, claimed_at, self.settings.publish_timeout)
                .await?;
        }
        let producer = self.producers.current();
        let results = publish_batch(
            &producer,
            &self.settings.message,
            &events,
            self.settings.publish_deadline(),
            &self.health,
        )
        .await;
        let stuck = results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .find(|e| e.producer_stuck)
            .map(|e| e.message.as_str());
        self.producers.renew_if_stuck(&producer, stuck);
        let answers = self.sort(&events, results);
        self.judge_broker(&answers);
        let published = transaction
            .commit(&answers.acked, &answers.failures)
            .await?;
        let outcome = BatchOutcome {
            claimed: events.len(),
            published,
            failed: answers.failures.len(),
            dead: answers.failures.iter().filter(|f| f.dead).count(),
        };
        self.report(&events, &outcome, &answers, started.elapsed());
        Ok(outcome)
    }

    /// Opens the transaction, bounds it server-side and locks the batch, scanning
    /// from the loops' shared cursor: one round trip (see [`ClaimTransaction`]).
    async fn claim(&self) -> Result<(ClaimTransaction, Vec<PendingEvent>), EngineError> {
        let limit = self.settings.batch_size as usize;
        let client = self.pool.get().await?;
        let (transaction, events) = ClaimTransaction::claim(
            client,
            self.settings.ordered,
            self.settings.transaction_timeout(),
            limit as i64,
            self.cursor.start(),
        )
        .await?;
        self.cursor
            .claimed(events.last().map(|e| e.created_at), events.len() == limit);
        Ok((transaction, events))
    }

    /// A batch in which nothing was acknowledged and every failure was an
    /// availability error declares an outage (see `broker`); one acknowledgement
    /// proves the broker takes messages.
    fn judge_broker(&self, answers: &Answers) {
        if !answers.acked.is_empty() {
            self.health.delivered();
            return;
        }
        let outage = answers.failures.iter().all(|f| !f.rejected);
        if outage && self.health.outage() {
            tracing::warn!(
                error = %answers.failures.first().map_or("", |f| f.error.as_str()),
                rows = answers.failures.len(),
                "broker unavailable: claiming stops, rows stay pending, probing the broker until it answers"
            );
        }
    }

    fn sort(&self, events: &[PendingEvent], results: Vec<Result<(), PublishError>>) -> Answers {
        let mut answers = Answers {
            acked: Vec::with_capacity(events.len()),
            acked_created_at: Vec::with_capacity(events.len()),
            failures: Vec::new(),
        };
        for (event, result) in events.iter().zip(results) {
            match result {
                Ok(()) => {
                    answers.acked.push(event.id);
                    answers.acked_created_at.push(event.created_at);
                }
                Err(error) => answers.failures.push(self.failure(event, error)),
            }
        }
        answers
    }

    /// A failed attempt: its retry delay, and whether it used up the row's
    /// rejections. An availability failure never makes a row dead; while the broker
    /// is unavailable the relay claims nothing anyway, so the row is due again at once
    /// and goes out as soon as the broker is back.
    fn failure(&self, event: &PendingEvent, error: PublishError) -> PublishFailure {
        let attempts = u32::try_from(event.attempts).unwrap_or(0) + 1;
        let rejected = error.kind == FailureKind::Rejected;
        let rejections = u32::try_from(event.rejections).unwrap_or(0) + u32::from(rejected);
        let dead = rejected && rejections >= self.settings.max_attempts;
        let retry_in = if rejected || self.health.is_available() {
            self.settings.backoff.delay(attempts)
        } else {
            Duration::ZERO
        };
        if dead {
            tracing::error!(
                id = %event.id,
                rejections,
                error = %error.message,
                max_attempts = self.settings.max_attempts,
                "outbox row is dead: the broker refused it max_attempts times; the relay's dead-row commands show and requeue it"
            );
        } else {
            tracing::debug!(id = %event.id, attempts, rejections, error = %error.message, "publish failed");
        }
        PublishFailure {
            id: event.id,
            error: error.stored_text(),
            retry_in,
            rejected,
            dead,
        }
    }

    /// `(published, failed, dead)` per topic, for the metrics.
    fn count_by_topic<'a>(
        &'a self,
        events: &[PendingEvent],
        answers: &Answers,
    ) -> std::collections::BTreeMap<&'a str, metrics::TopicCounts> {
        let mut counts = std::collections::BTreeMap::<&str, metrics::TopicCounts>::new();
        for event in events {
            let entry = counts
                .entry(self.settings.message.topic_for(&event.aggregate_type))
                .or_default();
            match answers.failures.iter().find(|f| f.id == event.id) {
                None => entry.published += 1,
                Some(failure) => {
                    entry.failed += 1;
                    entry.dead += u64::from(failure.dead);
                }
            }
        }
        counts
    }

    /// Metrics and logs, once committed: a rolled-back batch is published again later.
    fn report(
        &self,
        events: &[PendingEvent],
        outcome: &BatchOutcome,
        answers: &Answers,
        elapsed: Duration,
    ) {
        let acked_at = Utc::now();
        for created_at in &answers.acked_created_at {
            // Insert time is the database's clock, now is ours: clamp skew at 0.
            metrics::delivered((acked_at - *created_at).to_std().unwrap_or_default());
        }
        for (topic, counts) in self.count_by_topic(events, answers) {
            metrics::published(topic, counts);
        }
        metrics::batch_finished(elapsed);
        if let Some(first) = answers.failures.first() {
            tracing::warn!(
                claimed = outcome.claimed,
                published = outcome.published,
                failed = outcome.failed,
                dead = outcome.dead,
                first_error = %first.error,
                "some outbox rows could not be published; they will be retried"
            );
        } else {
            tracing::debug!(
                claimed = outcome.claimed,
                published = outcome.published,
                "batch published"
            );
        }
    }
}

/// When a batch loop looks for rows without being asked to.
#[derive(Debug, Clone, Copy)]
pub struct Pacing {
    /// Idle: the fallback behind notifications.
    pub poll_interval: Duration,
    /// Busy (the last batch claimed rows, but not a full batch): no notification
    /// comes, so the loop looks again after this pause.
    pub busy_poll_interval: Duration,
}

/// One of a process's batch loops: batch after batch while batches come back full;
/// after a partial batch, the next one after the busy pause; after an empty one, it
/// asks for a notification, looks once more, and waits for the notification, the
/// poll interval or shutdown. Loops share the producer and the pool; `SKIP LOCKED`
/// gives each batch disjoint rows, so while one loop waits for the broker's
/// acknowledgements another claims and marks.
pub async fn batch_loop(
    relay: Arc<Relay>,
    wake: Arc<Notify>,
    wakeup: Arc<WakeupRequest>,
    mut shutdown: watch::Receiver<bool>,
    pacing: Pacing,
) {
    let mut consecutive_errors: u32 = 0;
    let mut asked = false;
    while !*shutdown.borrow() {
        // During an outage: no claim, so no row lock and no UPDATE per row per retry.
        if !relay.health.is_available() {
            tokio::select! {
                () = relay.health.wait_available() => {}
                _ = shutdown.changed() => continue,
            }
        }
        // Never cancelled midway: a batch ends by itself within the publish timeout
        // plus margin, and whatever it did not see acknowledged stays unmarked.
        let wait = match relay.run_batch().await {
            Ok(outcome) => {
                consecutive_errors = 0;
                relay.process.batch_succeeded();
                if outcome.claimed > 0 {
                    wakeup.withdraw().await;
                    asked = false;
                }
                if outcome.claimed == relay.settings().batch_size as usize {
                    continue;
                }
                if outcome.claimed > 0 {
                    pacing.busy_poll_interval
                } else if !asked {
                    wakeup.ask().await;
                    asked = true;
                    continue;
                } else {
                    pacing.poll_interval
                }
            }
            Err(e) => {
                consecutive_errors = consecutive_errors.saturating_add(1);
                if e.is_outage() {
                    tracing::warn!(error = %error_chain(&e), "relay batch failed: the database or its standbys are unavailable");
                } else {
                    tracing::error!(error = %error_chain(&e), "relay batch failed");
                    relay
                        .process
                        .batch_failed(consecutive_errors, error_chain(&e));
                }
                // Back off while the failures last, up to ten poll intervals.
                pacing.poll_interval * consecutive_errors.min(10)
            }
        };
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
        }
    }
}

//! One batch: claim, publish, mark — in one transaction.

use std::time::{Duration, Instant};

use charges_store::{OutboxStore, Pool, PublishFailure};
use rdkafka::producer::FutureProducer;
use uuid::Uuid;

use crate::backoff::Backoff;
use crate::publish::{MessageSettings, publish_batch};
use crate::{RelayError, metrics};

/// Time allowed on top of the publish timeout for the claim transaction's own
/// statements (claim, mark, record failures, commit) and scheduling delays.
pub const TRANSACTION_MARGIN: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub message: MessageSettings,
    pub batch_size: u32,
    pub publish_timeout: Duration,
    pub max_attempts: u32,
    pub backoff: Backoff,
}

impl RelaySettings {
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

pub struct Relay {
    pool: Pool,
    producer: FutureProducer,
    settings: RelaySettings,
}

impl Relay {
    pub fn new(pool: Pool, producer: FutureProducer, settings: RelaySettings) -> Relay {
        Relay {
            pool,
            producer,
            settings,
        }
    }

    pub fn settings(&self) -> &RelaySettings {
        &self.settings
    }

    pub fn producer(&self) -> &FutureProducer {
        &self.producer
    }

    /// Claims up to `batch_size` rows, publishes them, marks the acknowledged ones
    /// published and records the failures, then commits.
    ///
    /// How long the transaction stays open: the claim and the marks are single
    /// statements; in between, `publish_batch` waits at most `publish_deadline()`
    /// (each delivery future is bounded by `message.timeout.ms` = publish timeout, and
    /// the whole wait by `tokio::time::timeout`). So the transaction lives about
    /// publish timeout + [`TRANSACTION_MARGIN`]; should the relay hang anyway (a
    /// stuck process, a network partition), the server ends the transaction through
    /// the `SET LOCAL` `idle_in_transaction_session_timeout`/`statement_timeout`, and
    /// the rows are claimable again. If the transaction fails for any reason nothing
    /// is marked, and acknowledged messages are published again later (at least once).
    pub async fn run_batch(&self) -> Result<BatchOutcome, RelayError> {
        let started = Instant::now();
        let mut client = self.pool.get().await?;
        let transaction = client.transaction().await?;
        let bound = self.settings.transaction_timeout();
        OutboxStore::set_claim_timeouts(&transaction, bound, bound).await?;
        let events =
            OutboxStore::claim_pending(&transaction, i64::from(self.settings.batch_size)).await?;
        if events.is_empty() {
            transaction.commit().await?;
            return Ok(BatchOutcome::default());
        }

        let results = publish_batch(
            &self.producer,
            &self.settings.message,
            &events,
            self.settings.publish_deadline(),
        )
        .await;

        let mut acked: Vec<Uuid> = Vec::with_capacity(events.len());
        let mut acked_created_at = Vec::with_capacity(events.len());
        let mut failures: Vec<PublishFailure> = Vec::new();
        for (event, result) in events.iter().zip(results) {
            match result {
                Ok(()) => {
                    acked.push(event.id);
                    acked_created_at.push(event.created_at);
                }
                Err(error) => {
                    let failures_so_far = u32::try_from(event.attempts).unwrap_or(0) + 1;
                    let dead = failures_so_far >= self.settings.max_attempts;
                    if dead {
                        tracing::error!(
                            id = %event.id,
                            attempts = failures_so_far,
                            error = %error,
                            "outbox row is dead: giving up until `charges-relay dead requeue`"
                        );
                    } else {
                        tracing::debug!(id = %event.id, attempts = failures_so_far, error = %error, "publish failed");
                    }
                    failures.push(PublishFailure {
                        id: event.id,
                        error,
                        retry_in: self.settings.backoff.delay(failures_so_far),
                        dead,
                    });
                }
            }
        }

        let published = OutboxStore::mark_published(&transaction, &acked).await?;
        OutboxStore::record_failures(&transaction, &failures).await?;
        transaction.commit().await?;
        // Counted once committed: a rolled-back batch is published again later.
        let acked_at = chrono::Utc::now();
        for created_at in acked_created_at {
            // Insert time is the database's clock, now is ours: clamp skew at 0.
            let lag = (acked_at - created_at).to_std().unwrap_or_default();
            metrics::delivered(lag);
        }

        let outcome = BatchOutcome {
            claimed: events.len(),
            published,
            failed: failures.len(),
            dead: failures.iter().filter(|f| f.dead).count(),
        };
        metrics::batch_finished(
            &self.settings.message.topic,
            outcome.published,
            outcome.failed,
            outcome.dead,
            started.elapsed(),
        );
        if let Some(first) = failures.first() {
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
        Ok(outcome)
    }
}

//! Retention: deletes published outbox rows older than `--published-retention` and
//! expired `COMPLETED` idempotency keys, in small batches, one runner at a time per
//! table.

use std::time::Duration;

use charges_store::{OutboxStore, Pool, idempotency_keys};
use tokio::sync::watch;

use crate::RelayError;
use crate::metrics;

/// Rows per DELETE statement (and per transaction): short locks, small WAL bursts.
pub const DELETE_BATCH: i64 = 1000;

/// What one retention job deletes. Both share [`cleanup_once`]'s shape: per batch a
/// transaction that first takes the job's transaction-scoped advisory lock.
#[derive(Debug, Clone, Copy)]
pub enum Retention {
    /// Published outbox rows published more than this long ago. Pending and dead
    /// rows are never deleted.
    PublishedOutbox(Duration),
    /// `COMPLETED` idempotency keys past their `expires_at`. `STARTED` rows are never
    /// deleted (see the README's Operations section).
    ExpiredIdempotencyKeys,
}

impl Retention {
    /// The table, for logs and the `table` metric label.
    pub fn table(self) -> &'static str {
        match self {
            Retention::PublishedOutbox(_) => "outbox",
            Retention::ExpiredIdempotencyKeys => "idempotency_keys",
        }
    }

    async fn try_lock(
        self,
        transaction: &charges_store::Transaction<'_>,
    ) -> Result<bool, RelayError> {
        Ok(match self {
            Retention::PublishedOutbox(_) => OutboxStore::try_cleanup_lock(transaction).await?,
            Retention::ExpiredIdempotencyKeys => {
                idempotency_keys::try_purge_lock(transaction).await?
            }
        })
    }

    async fn delete_batch(
        self,
        transaction: &charges_store::Transaction<'_>,
    ) -> Result<u64, RelayError> {
        Ok(match self {
            Retention::PublishedOutbox(retention) => {
                OutboxStore::delete_published(transaction, retention, DELETE_BATCH).await?
            }
            Retention::ExpiredIdempotencyKeys => {
                idempotency_keys::delete_expired(transaction, DELETE_BATCH).await?
            }
        })
    }
}

/// Deletes what `job` covers in batches of [`DELETE_BATCH`], each in its own
/// transaction that first takes the job's advisory lock: when another runner holds
/// it, this one skips the round. Returns the number of rows deleted.
pub async fn cleanup_once(
    pool: &Pool,
    job: Retention,
    shutdown: &watch::Receiver<bool>,
) -> Result<u64, RelayError> {
    let mut deleted = 0;
    loop {
        let mut client = pool.get().await?;
        let transaction = client.transaction().await?;
        if !job.try_lock(&transaction).await? {
            tracing::debug!(table = job.table(), "another runner is cleaning up");
            return Ok(deleted);
        }
        let batch = job.delete_batch(&transaction).await?;
        transaction.commit().await?;
        metrics::retention_deleted(job.table(), batch);
        deleted += batch;
        if batch < DELETE_BATCH as u64 || *shutdown.borrow() {
            return Ok(deleted);
        }
    }
}

/// Runs every job in `jobs` now and then every `interval` until shutdown.
pub async fn run(
    pool: Pool,
    jobs: Vec<Retention>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        for &job in &jobs {
            match cleanup_once(&pool, job, &shutdown).await {
                Ok(0) => {}
                Ok(deleted) => {
                    tracing::info!(deleted, table = job.table(), "deleted rows past retention");
                }
                Err(e) => {
                    tracing::warn!(error = %crate::error_chain(&e), table = job.table(), "retention cleanup failed");
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

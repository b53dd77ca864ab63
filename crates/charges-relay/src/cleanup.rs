//! Retention: deletes published rows older than `--published-retention`.

use std::time::Duration;

use charges_store::{OutboxStore, Pool};
use tokio::sync::watch;

use crate::RelayError;

/// Rows per DELETE statement (and per transaction): short locks, small WAL bursts.
pub const DELETE_BATCH: i64 = 1000;

/// Deletes expired published rows in batches of [`DELETE_BATCH`], each in its own
/// transaction that first takes a transaction-scoped advisory lock: when another relay
/// holds it, this one skips the round. Returns the number of rows deleted.
pub async fn cleanup_once(
    pool: &Pool,
    retention: Duration,
    shutdown: &watch::Receiver<bool>,
) -> Result<u64, RelayError> {
    let mut deleted = 0;
    loop {
        let mut client = pool.get().await?;
        let transaction = client.transaction().await?;
        if !OutboxStore::try_cleanup_lock(&transaction).await? {
            tracing::debug!("another relay is cleaning up");
            return Ok(deleted);
        }
        let batch = OutboxStore::delete_published(&transaction, retention, DELETE_BATCH).await?;
        transaction.commit().await?;
        deleted += batch;
        if batch < DELETE_BATCH as u64 || *shutdown.borrow() {
            return Ok(deleted);
        }
    }
}

/// Runs [`cleanup_once`] now and then every `interval` until shutdown.
pub async fn run(
    pool: Pool,
    retention: Duration,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        match cleanup_once(&pool, retention, &shutdown).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "deleted published outbox rows past retention"),
            Err(e) => tracing::warn!(error = %crate::error_chain(&e), "outbox cleanup failed"),
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

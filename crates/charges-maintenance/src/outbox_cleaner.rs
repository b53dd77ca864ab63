//! Outbox retention: rows published longer ago than the retention are deleted in
//! batches. Pending and dead rows are never deleted.

use std::time::Duration;

use charges_store::{OutboxStore, StoreError, Transaction};

use crate::key_purger::batch_step;
use crate::{DELETE_BATCH, Job, Step};

pub const DELETE_PUBLISHED_OUTBOX: &str = "delete_published_outbox";

/// Its advisory lock ("outbox\x01\x02").
const LOCK_KEY: i64 = 0x6f75_7462_6f78_0102;

pub struct PublishedOutboxCleaner {
    pub interval: Duration,
    pub retention: Duration,
}

impl Job for PublishedOutboxCleaner {
    fn name(&self) -> &'static str {
        DELETE_PUBLISHED_OUTBOX
    }

    fn interval(&self) -> Duration {
        self.interval
    }

    fn lock_key(&self) -> Option<i64> {
        Some(LOCK_KEY)
    }

    async fn step(&self, tx: &Transaction<'_>) -> Result<Step, StoreError> {
        let deleted = OutboxStore::delete_published(tx, self.retention, DELETE_BATCH).await?;
        Ok(batch_step(deleted))
    }
}

//! `delete_published_outbox`, outbox retention: rows published longer ago than
//! `--published-retention` are deleted in batches (`OutboxDeletePublished`). Pending and
//! dead rows are never deleted.

use std::time::Duration;

use charges_runtime::cli::duration_at_least;
use charges_store::{OutboxStore, StoreError, Transaction};

use crate::purge_expired_keys::batch_step;
use crate::{DELETE_BATCH, Job, Step};

/// Its settings. The environment variable keeps the `RELAY_` prefix of the process that
/// runs the jobs (deployments set it).
#[derive(Debug, Clone, clap::Args)]
pub struct DeletePublishedOutboxArgs {
    /// Published rows older than this are deleted (in small batches, by one relay at
    /// a time). Pending and dead rows are never deleted.
    #[arg(long, env = "RELAY_PUBLISHED_RETENTION", default_value = "7d", value_parser = duration_at_least(Duration::from_secs(1)))]
    pub published_retention: Duration,
}

/// Its advisory lock ("outbox\x01\x02").
const LOCK_KEY: i64 = 0x6f75_7462_6f78_0102;

pub struct DeletePublishedOutbox {
    /// `--cleanup-interval` ([`crate::MaintenanceArgs`]), shared with
    /// `purge_expired_keys`.
    pub interval: Duration,
    pub retention: Duration,
}

impl Job for DeletePublishedOutbox {
    const NAME: &'static str = "delete_published_outbox";

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

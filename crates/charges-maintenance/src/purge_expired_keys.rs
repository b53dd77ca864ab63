//! `purge_expired_keys`, where idempotency keys expire: `COMPLETED` keys past their
//! `expires_at` are deleted in batches (`IdempotencyKeyPurgeExpired`), every
//! `--cleanup-interval` and by `charges-relay purge`. `STARTED` keys are never deleted,
//! whatever their age: the one-transaction design never commits one, so one that exists
//! is a bug to look at (`reconcile` counts them).

use std::time::Duration;

use charges_store::{IdempotencyStore, StoreError, Transaction};

use crate::{DELETE_BATCH, Job, Step};

/// Its advisory lock ("idemkey\x01"); distinct from `delete_published_outbox`'s, so the
/// two retention jobs never wait for each other.
const LOCK_KEY: i64 = 0x6964_656d_6b65_7901;

pub struct PurgeExpiredKeys {
    /// `--cleanup-interval` ([`crate::MaintenanceArgs`]), shared with
    /// `delete_published_outbox`.
    pub interval: Duration,
}

impl Job for PurgeExpiredKeys {
    const NAME: &'static str = "purge_expired_keys";

    fn interval(&self) -> Duration {
        self.interval
    }

    fn lock_key(&self) -> Option<i64> {
        Some(LOCK_KEY)
    }

    async fn step(&self, tx: &Transaction<'_>) -> Result<Step, StoreError> {
        let deleted = IdempotencyStore::purge_expired(tx, DELETE_BATCH).await?;
        Ok(batch_step(deleted))
    }
}

/// A full batch may have left rows behind; a short one cannot have.
pub(crate) fn batch_step(deleted: u64) -> Step {
    if deleted < DELETE_BATCH as u64 {
        Step::Done(deleted)
    } else {
        Step::More(deleted)
    }
}

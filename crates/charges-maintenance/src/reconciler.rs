//! The invariants the one-transaction design promises, counted: charges without their
//! `ChargeCreated` outbox row, and committed `STARTED` idempotency keys. Both must be
//! 0; the gauges are alerted on. Read-only, so every replica runs it and alert rules
//! take `max()` over replicas.

use std::time::Duration;

use charges_store::{ChargeStore, IdempotencyStore, StoreError, Transaction};

use crate::{Job, Step, metrics};

pub const RECONCILE: &str = "reconcile";

#[derive(Debug, Clone, Copy)]
pub struct ReconcileSettings {
    pub interval: Duration,
    /// Charges created within this window are checked for their outbox row: the
    /// published-row retention, beyond which outbox rows are legitimately gone.
    pub outbox_window: Duration,
    /// A committed `STARTED` key older than this is reported.
    pub stale_started_after: Duration,
}

pub struct Reconciler {
    pub settings: ReconcileSettings,
}

impl Job for Reconciler {
    fn name(&self) -> &'static str {
        RECONCILE
    }

    fn interval(&self) -> Duration {
        self.settings.interval
    }

    fn lock_key(&self) -> Option<i64> {
        None
    }

    async fn step(&self, tx: &Transaction<'_>) -> Result<Step, StoreError> {
        let without_outbox =
            ChargeStore::count_without_outbox(tx, self.settings.outbox_window).await?;
        let stale_started =
            IdempotencyStore::count_started_older_than(tx, self.settings.stale_started_after)
                .await?;
        metrics::reconciled(without_outbox, stale_started);
        if without_outbox > 0 || stale_started > 0 {
            tracing::error!(
                charges_without_outbox = without_outbox,
                stale_started_keys = stale_started,
                "reconciliation found broken invariants: inspect by hand (docs/operations.md, Runbook)"
            );
        }
        Ok(Step::Done(0))
    }
}

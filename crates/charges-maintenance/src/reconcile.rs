//! `reconcile`: the invariants the one-transaction design promises, counted: charges without their
//! `ChargeCreated` outbox row, and committed `STARTED` idempotency keys. Both must be
//! 0; the gauges are alerted on.
//!
//! The counts read whole tables, so they are shared (`reconciliation_result`, V10):
//! each interval, the one relay that takes the check's lock while the latest result is
//! due checks and records it; every relay exports the latest result, with the time it
//! was counted. A relay that starts checks only if no recent result exists.

use std::time::Duration;

use charges_runtime::cli::{duration_at_least, duration_within};
use charges_store::{
    ChargeStore, IdempotencyStore, ReconciliationResultStore, StoreError, Transaction,
};

use crate::{Job, Step, metrics};

/// Its settings (the `RELAY_` prefix: see [`crate::DeletePublishedOutboxArgs`]).
#[derive(Debug, Clone, clap::Args)]
pub struct ReconcileArgs {
    /// How often reconciliation runs (charges without an outbox row, committed
    /// STARTED idempotency keys); it scans the charges of the last
    /// --published-retention.
    #[arg(long, env = "RELAY_RECONCILE_INTERVAL", default_value = "5m", value_parser = duration_within(Duration::from_millis(100), Duration::from_secs(86400)))]
    pub reconcile_interval: Duration,

    /// A committed STARTED idempotency key older than this is reported by
    /// reconciliation (the one-transaction design never commits one).
    #[arg(long, env = "RELAY_STALE_STARTED_AFTER", default_value = "5m", value_parser = duration_at_least(Duration::from_secs(1)))]
    pub stale_started_after: Duration,
}

#[derive(Debug, Clone, Copy)]
pub struct Reconcile {
    pub interval: Duration,
    /// Charges created within this window are checked for their outbox row: the
    /// published-row retention, beyond which outbox rows are legitimately gone.
    pub outbox_window: Duration,
    /// A committed `STARTED` key older than this is reported.
    pub stale_started_after: Duration,
    /// How long each count may run: they read whole tables, and one cut short by the
    /// pool's statement timeout (sized for request or batch transactions) would fail
    /// on every run once the tables are large, leaving the gauges stale for good.
    pub count_timeout: Duration,
}

impl Job for Reconcile {
    const NAME: &'static str = "reconcile";

    fn interval(&self) -> Duration {
        self.interval
    }

    fn lock_key(&self) -> Option<i64> {
        None
    }

    async fn step(&self, tx: &Transaction<'_>) -> Result<Step, StoreError> {
        let claim = ReconciliationResultStore::claim(tx, self.due_after()).await?;
        if !claim.due {
            // Another relay checked recently, or is checking right now.
            if let Some(latest) = claim.latest {
                metrics::reconciled(&latest);
            }
            return Ok(Step::Done(0));
        }
        ReconciliationResultStore::bound_count(tx, self.count_timeout).await?;
        let without_outbox = ChargeStore::count_without_outbox(tx, self.outbox_window).await?;
        let stale_started =
            IdempotencyStore::count_started_older_than(tx, self.stale_started_after).await?;
        let counted = ReconciliationResultStore::record(tx, without_outbox, stale_started).await?;
        metrics::reconciled(&counted);
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

impl Reconcile {
    /// A result this old is checked again. A little under the interval: relays tick
    /// on their own clocks, and a result a few milliseconds short of `interval` must not
    /// make every relay skip it for another whole interval.
    fn due_after(&self) -> Duration {
        self.interval.mul_f64(0.9)
    }
}

//! Periodic checks outside the HTTP path, exported as gauges: the outbox backlog
//! (cheap, often) and the invariants the one-transaction design promises (a scan of
//! recent charges, less often). Every relay replica runs them; they only read, so
//! alert rules take `max()` over replicas.

use std::time::Duration;

use charges_store::{ChargeStore, OutboxStore, Pool, idempotency_keys};
use tokio::sync::watch;

use crate::{RelayError, metrics};

#[derive(Debug, Clone, Copy)]
pub struct ReconcileSettings {
    /// How often the outbox backlog gauges are refreshed.
    pub stats_interval: Duration,
    /// How often the invariants are checked.
    pub reconcile_interval: Duration,
    /// Charges created within this window are checked for their outbox row: the
    /// published-row retention, beyond which outbox rows are legitimately gone.
    pub outbox_window: Duration,
    /// A committed `STARTED` key older than this is reported.
    pub stale_started_after: Duration,
}

/// Refreshes the outbox backlog gauges once.
pub async fn stats_once(pool: &Pool) -> Result<(), RelayError> {
    let client = pool.get().await?;
    let stats = OutboxStore::stats(&client).await?;
    metrics::outbox_stats(&stats);
    Ok(())
}

/// Checks the invariants once; returns `(charges without outbox, stale STARTED keys)`.
pub async fn reconcile_once(
    pool: &Pool,
    settings: &ReconcileSettings,
) -> Result<(i64, i64), RelayError> {
    let client = pool.get().await?;
    let without_outbox = ChargeStore::count_without_outbox(&client, settings.outbox_window).await?;
    let stale_started =
        idempotency_keys::count_started_older_than(&client, settings.stale_started_after).await?;
    metrics::reconciled(without_outbox, stale_started);
    if without_outbox > 0 || stale_started > 0 {
        tracing::error!(
            charges_without_outbox = without_outbox,
            stale_started_keys = stale_started,
            "reconciliation found broken invariants: inspect by hand (see README, Operations)"
        );
    }
    Ok((without_outbox, stale_started))
}

/// Runs both now and then on their intervals until shutdown. A failure is logged
/// and leaves the gauges at their last value; the last-success gauge shows the gap.
pub async fn run(pool: Pool, settings: ReconcileSettings, mut shutdown: watch::Receiver<bool>) {
    let mut stats = tokio::time::interval(settings.stats_interval);
    let mut reconcile = tokio::time::interval(settings.reconcile_interval);
    stats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stats.tick() => {
                if let Err(e) = stats_once(&pool).await {
                    tracing::warn!(error = %crate::error_chain(&e), "outbox stats failed");
                }
            }
            _ = reconcile.tick() => {
                if let Err(e) = reconcile_once(&pool, &settings).await {
                    tracing::warn!(error = %crate::error_chain(&e), "reconciliation failed");
                }
            }
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

//! Every maintenance setting, as one clap group a host process flattens into its own
//! command line: each job's flags are defined, with their defaults and ranges, in the
//! job's own file; only the interval the two retention jobs share lives here.

use std::time::Duration;

use charges_runtime::cli::duration_within;

use crate::{
    DeletePublishedOutbox, DeletePublishedOutboxArgs, JobRunner, OutboxStats, OutboxStatsArgs,
    PurgeExpiredKeys, Reconcile, ReconcileArgs,
};

#[derive(Debug, Clone, clap::Args)]
pub struct MaintenanceArgs {
    #[command(flatten)]
    pub delete_published_outbox: DeletePublishedOutboxArgs,

    /// How often the retention jobs run (also once at start-up): purge_expired_keys
    /// (expired COMPLETED idempotency keys) and delete_published_outbox (outbox rows
    /// past --published-retention).
    #[arg(long, env = "RELAY_CLEANUP_INTERVAL", default_value = "1m", value_parser = duration_within(Duration::from_millis(100), Duration::from_secs(86400)))]
    pub cleanup_interval: Duration,

    #[command(flatten)]
    pub outbox_stats: OutboxStatsArgs,

    #[command(flatten)]
    pub reconcile: ReconcileArgs,
}

impl MaintenanceArgs {
    /// Starts every job on `runner`. `batch_timeout` is the longest transaction the
    /// host's pool allows otherwise: a reconciliation count may take its whole
    /// interval, never less than that.
    pub fn spawn_all(&self, runner: &mut JobRunner, batch_timeout: Duration) {
        let retention = self.delete_published_outbox.published_retention;
        runner.spawn(DeletePublishedOutbox {
            interval: self.cleanup_interval,
            retention,
        });
        runner.spawn(PurgeExpiredKeys {
            interval: self.cleanup_interval,
        });
        runner.spawn(OutboxStats {
            interval: self.outbox_stats.stats_interval,
        });
        let interval = self.reconcile.reconcile_interval;
        runner.spawn(Reconcile {
            interval,
            outbox_window: retention,
            stale_started_after: self.reconcile.stale_started_after,
            count_timeout: interval.max(batch_timeout),
        });
    }
}

//! `outbox_stats`: the outbox backlog gauges (pending, oldest pending age, dead),
//! refreshed from the database (`OutboxStats`). Each count runs on a partial index, so
//! it stays cheap however many published rows the table holds. Read-only: every
//! replica runs it.

use std::time::Duration;

use charges_runtime::cli::duration_within;
use charges_store::{OutboxStore, StoreError, Transaction};

use crate::{Job, Step, metrics};

/// Its settings (the `RELAY_` prefix: see [`crate::DeletePublishedOutboxArgs`]).
#[derive(Debug, Clone, clap::Args)]
pub struct OutboxStatsArgs {
    /// How often the outbox backlog gauges (pending, oldest pending age, dead) are
    /// refreshed from the database.
    #[arg(long, env = "RELAY_STATS_INTERVAL", default_value = "10s", value_parser = duration_within(Duration::from_millis(100), Duration::from_secs(3600)))]
    pub stats_interval: Duration,
}

pub struct OutboxStats {
    pub interval: Duration,
}

impl Job for OutboxStats {
    const NAME: &'static str = "outbox_stats";

    fn interval(&self) -> Duration {
        self.interval
    }

    fn lock_key(&self) -> Option<i64> {
        None
    }

    async fn step(&self, tx: &Transaction<'_>) -> Result<Step, StoreError> {
        metrics::outbox_stats(&OutboxStore::stats(tx).await?);
        Ok(Step::Done(0))
    }
}

//! The outbox backlog gauges (pending, oldest pending age, dead), refreshed from the
//! database. Each count runs on a partial index, so it stays cheap however many
//! published rows the table holds. Read-only: every replica runs it.

use std::time::Duration;

use charges_store::{OutboxStore, StoreError, Transaction};

use crate::{Job, Step, metrics};

pub const OUTBOX_STATS: &str = "outbox_stats";

pub struct OutboxStatsRefresher {
    pub interval: Duration,
}

impl Job for OutboxStatsRefresher {
    fn name(&self) -> &'static str {
        OUTBOX_STATS
    }

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

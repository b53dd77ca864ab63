//! One event's effect, exactly once: the inbox row, the ledger and (with ordering
//! checks on) the charge's position, in one transaction.

use deadpool_postgres::Pool;

use crate::ConsumerError;
use crate::event::Event;
use crate::inbox::{InboxStore, Source};
use crate::ledger::LedgerStore;
use crate::positions::PositionStore;

/// What [`apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Applied,
    /// Applied, but its charge's previous event (sequence − 1) was not applied yet:
    /// it came before its predecessor (`previous` is the highest applied so far).
    AppliedOutOfOrder {
        previous: Option<i64>,
    },
    Duplicate,
}

/// The inbox insert and the effect, in one transaction; with `check_order`, the
/// charge's position too.
pub async fn apply(
    pool: &Pool,
    event: &Event,
    source: Source<'_>,
    check_order: bool,
) -> Result<Applied, ConsumerError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    if !InboxStore::insert(&tx, event.id, &event.event_type, source).await? {
        // Rolling back or committing is the same here: nothing was written.
        tx.rollback().await?;
        return Ok(Applied::Duplicate);
    }
    if let Some(entry) = &event.entry {
        LedgerStore::apply(&tx, entry).await?;
    }
    let mut applied = Applied::Applied;
    if let (true, Some((aggregate_id, sequence))) = (check_order, event.position) {
        let previous = PositionStore::advance(&tx, aggregate_id, sequence).await?;
        if previous.unwrap_or(0) != sequence - 1 {
            applied = Applied::AppliedOutOfOrder { previous };
        }
    }
    tx.commit().await?;
    Ok(applied)
}

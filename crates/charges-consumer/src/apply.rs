//! One event's effect, exactly once: the inbox row, the ledger and (with ordering
//! checks on) the charge's position, in one transaction.

use deadpool_postgres::Pool;

use pg_inbox::{Delivery, Inbox, Processed, Source};

use crate::ConsumerError;
use crate::event::Event;
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

/// The inbox row and the effect, in one transaction (`pg_inbox`); with `check_order`,
/// the charge's position too.
pub async fn apply(
    pool: &Pool,
    event: &Event,
    source: Source<'_>,
    check_order: bool,
) -> Result<Applied, ConsumerError> {
    let delivery = Delivery {
        id: event.id,
        event_type: &event.event_type,
        source,
    };
    let processed = Inbox::process(pool, &delivery, async |tx| {
        if let Some(entry) = &event.entry {
            LedgerStore::apply(tx, entry).await?;
        }
        let mut applied = Applied::Applied;
        if let (true, Some((aggregate_id, sequence))) = (check_order, event.position) {
            let previous = PositionStore::advance(tx, aggregate_id, sequence).await?;
            if previous.unwrap_or(0) != sequence - 1 {
                applied = Applied::AppliedOutOfOrder { previous };
            }
        }
        Ok::<_, ConsumerError>(applied)
    })
    .await?;
    Ok(match processed {
        Processed::Applied(applied) => applied,
        Processed::Duplicate => Applied::Duplicate,
    })
}

//! `ledger`: the consumer's effect, money per currency.

use deadpool_postgres::GenericClient;

use crate::ConsumerError;

pub struct LedgerStore;

/// `LedgerApply`: adds one event's amounts to its currency's row, creating it.
const APPLY: &str = "
INSERT INTO ledger (currency, charged_cents, refunded_cents, events)
VALUES ($1, $2, $3, 1)
ON CONFLICT (currency) DO UPDATE
   SET charged_cents  = ledger.charged_cents  + EXCLUDED.charged_cents,
       refunded_cents = ledger.refunded_cents + EXCLUDED.refunded_cents,
       events         = ledger.events + 1";

/// One event's contribution to the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub currency: String,
    pub charged_cents: i64,
    pub refunded_cents: i64,
}

impl LedgerStore {
    pub async fn apply(client: &impl GenericClient, entry: &Entry) -> Result<(), ConsumerError> {
        let statement = client.prepare_cached(APPLY).await?;
        client
            .execute(
                &statement,
                &[&entry.currency, &entry.charged_cents, &entry.refunded_cents],
            )
            .await?;
        Ok(())
    }
}

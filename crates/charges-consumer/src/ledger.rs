//! `ledger`: the consumer's effect, money per currency.

use charges_store::statements::{self, Connection, Sql};
use tokio_postgres::types::Type;

use crate::ConsumerError;

pub struct LedgerStore;

/// `LedgerApply`: adds one event's amounts to its currency's row, creating it.
const APPLY: Sql = Sql::new(
    "
INSERT INTO ledger (currency, charged_cents, refunded_cents, events)
VALUES ($1, $2, $3, 1)
ON CONFLICT (currency) DO UPDATE
   SET charged_cents  = ledger.charged_cents  + EXCLUDED.charged_cents,
       refunded_cents = ledger.refunded_cents + EXCLUDED.refunded_cents,
       events         = ledger.events + 1",
    &[Type::TEXT, Type::INT8, Type::INT8],
);

/// One event's contribution to the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub currency: String,
    pub charged_cents: i64,
    pub refunded_cents: i64,
}

impl LedgerStore {
    pub async fn apply(client: &impl Connection, entry: &Entry) -> Result<(), ConsumerError> {
        statements::execute(
            client,
            &APPLY,
            &[&entry.currency, &entry.charged_cents, &entry.refunded_cents],
        )
        .await?;
        Ok(())
    }
}

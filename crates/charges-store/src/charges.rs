//! `charges`: the aggregate.

use charges_domain::{Charge, EventType};
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::StoreError;

pub struct ChargeStore;

/// `ChargeInsert`: `$5` is the authenticated client that creates the charge (V4),
/// NULL without authentication.
pub const INSERT: &str = "
INSERT INTO charges (id, amount_cents, currency, created_at, client_id)
VALUES ($1, $2, $3, $4, $5)";

/// `ChargeGet`: `$2` is the caller's client id; NULL (authentication off) sees every
/// charge, a client only its own.
const GET: &str = "
SELECT id, amount_cents, currency, created_at, refunded_cents FROM charges
 WHERE id = $1 AND ($2::text IS NULL OR client_id = $2::text)";

/// `ChargeLockForRefund`: the row lock serializes concurrent refunds of one charge
/// until the refund's transaction ends, so each sees the previous one's total and
/// event sequence. `$2` as in `ChargeGet`.
const LOCK_FOR_REFUND: &str = "
SELECT amount_cents, refunded_cents, currency, event_sequence FROM charges
 WHERE id = $1 AND ($2::text IS NULL OR client_id = $2::text)
   FOR UPDATE";

/// `ChargeAddRefunded`: adds to the refunded total and sets the event sequence the
/// refund's event takes (known in advance under the row lock).
const ADD_REFUNDED: &str = "
UPDATE charges SET refunded_cents = refunded_cents + $2, event_sequence = $3 WHERE id = $1
RETURNING refunded_cents";

/// `ChargeCountWithoutOutbox`: reconciliation. Every charge is committed with its
/// `ChargeCreated` outbox row, so this must be 0. Checked: charges younger than `$1`
/// seconds *and* created after `outbox_retention_horizon` — retention only ever deleted
/// rows published by then, and an event is published after its charge is created, so
/// these charges' rows cannot have been deleted by any retention any relay ran with. A
/// `ChargeCreated` an operator discarded (`outbox_discarded`) counts as accounted for.
/// Runs on `outbox_aggregate_type_sequence_idx` and `outbox_discarded_aggregate_idx`.
const COUNT_WITHOUT_OUTBOX: &str = "
SELECT count(*) AS without_outbox FROM charges c
 WHERE c.created_at > now() - $1::float8 * interval '1 second'
   AND c.created_at > coalesce((SELECT deleted_published_through FROM outbox_retention_horizon),
                               '-infinity')
   AND NOT EXISTS (SELECT 1 FROM outbox o
                    WHERE o.aggregate_type = 'charge' AND o.aggregate_id = c.id
                      AND o.event_type = $2)
   AND NOT EXISTS (SELECT 1 FROM outbox_discarded d
                    WHERE d.aggregate_id = c.id AND d.event_type = $2)";

/// A charge's state as a refund sees it, under the row lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundableCharge {
    pub amount_cents: i32,
    pub refunded_cents: i32,
    pub currency: String,
    /// The sequence of the charge's latest event.
    pub event_sequence: i64,
}

impl ChargeStore {
    /// `owner` is the authenticated client that creates it, `None` without
    /// authentication.
    pub async fn insert(
        client: &impl GenericClient,
        charge: &Charge,
        owner: Option<&str>,
    ) -> Result<(), StoreError> {
        let statement = client.prepare_cached(INSERT).await?;
        client
            .execute(
                &statement,
                &[
                    &charge.id,
                    &charge.amount_cents,
                    &charge.currency,
                    &charge.created_at,
                    &owner,
                ],
            )
            .await?;
        Ok(())
    }

    /// The charge and its refunded total; `None` if unknown or, when `owner` is
    /// given, another client's.
    pub async fn get(
        client: &impl GenericClient,
        id: Uuid,
        owner: Option<&str>,
    ) -> Result<Option<(Charge, i32)>, StoreError> {
        let statement = client.prepare_cached(GET).await?;
        let Some(row) = client.query_opt(&statement, &[&id, &owner]).await? else {
            return Ok(None);
        };
        let charge = Charge {
            id: row.try_get("id")?,
            amount_cents: row.try_get("amount_cents")?,
            currency: row.try_get("currency")?,
            created_at: row.try_get("created_at")?,
        };
        Ok(Some((charge, row.try_get("refunded_cents")?)))
    }

    /// Locks the charge for the rest of the caller's transaction; `None` if unknown
    /// or, when `owner` is given, another client's.
    pub async fn lock_for_refund(
        client: &impl GenericClient,
        id: Uuid,
        owner: Option<&str>,
    ) -> Result<Option<RefundableCharge>, StoreError> {
        let statement = client.prepare_cached(LOCK_FOR_REFUND).await?;
        let Some(row) = client.query_opt(&statement, &[&id, &owner]).await? else {
            return Ok(None);
        };
        Ok(Some(RefundableCharge {
            amount_cents: row.try_get("amount_cents")?,
            refunded_cents: row.try_get("refunded_cents")?,
            currency: row.try_get("currency")?,
            event_sequence: row.try_get("event_sequence")?,
        }))
    }

    /// Adds to the refunded total, records `event_sequence` as the charge's latest
    /// event, and returns the new total. The table's CHECK refuses a total above the
    /// charged amount.
    pub async fn add_refunded(
        client: &impl GenericClient,
        id: Uuid,
        amount_cents: i32,
        event_sequence: i64,
    ) -> Result<i32, StoreError> {
        let statement = client.prepare_cached(ADD_REFUNDED).await?;
        let row = client
            .query_one(&statement, &[&id, &amount_cents, &event_sequence])
            .await?;
        Ok(row.try_get("refunded_cents")?)
    }

    /// Charges created within `window` that have no `ChargeCreated` outbox row.
    pub async fn count_without_outbox(
        client: &impl GenericClient,
        window: std::time::Duration,
    ) -> Result<i64, StoreError> {
        let statement = client.prepare_cached(COUNT_WITHOUT_OUTBOX).await?;
        let row = client
            .query_one(
                &statement,
                &[&window.as_secs_f64(), &EventType::ChargeCreated.as_str()],
            )
            .await?;
        Ok(row.try_get("without_outbox")?)
    }
}

//! `charges`: the aggregate.

use charges_domain::{Charge, EventType};
use tokio_postgres::types::Type;
use uuid::Uuid;

use crate::StoreError;
use crate::statements::{self, Connection, Sql};

pub struct ChargeStore;

/// `ChargeInsert`: `$5` is the authenticated client that creates the charge (V4),
/// NULL without authentication.
pub const INSERT: Sql = Sql::new(
    "
INSERT INTO charges (id, amount_cents, currency, created_at, client_id)
VALUES ($1, $2, $3, $4, $5)",
    &[
        Type::UUID,
        Type::INT4,
        Type::BPCHAR,
        Type::TIMESTAMPTZ,
        Type::TEXT,
    ],
);

/// `ChargeGet`: `$2` is the caller's client id; NULL (authentication off) sees every
/// charge, a client only its own.
const GET: Sql = Sql::new(
    "
SELECT id, amount_cents, currency, created_at, refunded_cents FROM charges
 WHERE id = $1 AND ($2::text IS NULL OR client_id = $2::text)",
    &[Type::UUID, Type::TEXT],
);

/// `ChargeLockForRefund`: the row lock serializes concurrent refunds of one charge
/// until the refund's transaction ends, so each sees the previous one's total and
/// event sequence. `$2` as in `ChargeGet`.
const LOCK_FOR_REFUND: Sql = Sql::new(
    "
SELECT amount_cents, refunded_cents, currency, event_sequence FROM charges
 WHERE id = $1 AND ($2::text IS NULL OR client_id = $2::text)
   FOR UPDATE",
    &[Type::UUID, Type::TEXT],
);

/// `ChargeAddRefunded`: adds to the refunded total and sets the event sequence the
/// refund's event takes (known in advance under the row lock).
const ADD_REFUNDED: Sql = Sql::new(
    "
UPDATE charges SET refunded_cents = refunded_cents + $2, event_sequence = $3 WHERE id = $1
RETURNING refunded_cents",
    &[Type::UUID, Type::INT4, Type::INT8],
);

/// `ChargeCountWithoutOutbox`: reconciliation. Every charge is committed with its
/// `ChargeCreated` outbox row, so this must be 0. Checked: charges younger than `$1`
/// seconds *and* created after `outbox_retention_horizon` — retention only ever deleted
/// rows published by then, and an event is published after its charge is created, so
/// these charges' rows cannot have been deleted by any retention any relay ran with. A
/// `ChargeCreated` an operator discarded (`outbox_discarded`) counts as accounted for.
/// Runs on `outbox_aggregate_type_sequence_idx` and `outbox_discarded_aggregate_idx`.
const COUNT_WITHOUT_OUTBOX: Sql = Sql::new(
    "
SELECT count(*) AS without_outbox FROM charges c
 WHERE c.created_at > now() - $1::float8 * interval '1 second'
   AND c.created_at > coalesce((SELECT deleted_published_through FROM outbox_retention_horizon),
                               '-infinity')
   AND NOT EXISTS (SELECT 1 FROM outbox o
                    WHERE o.aggregate_type = 'charge' AND o.aggregate_id = c.id
                      AND o.event_type = $2)
   AND NOT EXISTS (SELECT 1 FROM outbox_discarded d
                    WHERE d.aggregate_id = c.id AND d.event_type = $2)",
    &[Type::FLOAT8, Type::TEXT],
);

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
        client: &impl Connection,
        charge: &Charge,
        owner: Option<&str>,
    ) -> Result<(), StoreError> {
        statements::execute(
            client,
            &INSERT,
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
        client: &impl Connection,
        id: Uuid,
        owner: Option<&str>,
    ) -> Result<Option<(Charge, i32)>, StoreError> {
        let Some(row) = statements::query_opt(client, &GET, &[&id, &owner]).await? else {
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
        client: &impl Connection,
        id: Uuid,
        owner: Option<&str>,
    ) -> Result<Option<RefundableCharge>, StoreError> {
        let Some(row) = statements::query_opt(client, &LOCK_FOR_REFUND, &[&id, &owner]).await?
        else {
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
        client: &impl Connection,
        id: Uuid,
        amount_cents: i32,
        event_sequence: i64,
    ) -> Result<i32, StoreError> {
        let row = statements::query_one(
            client,
            &ADD_REFUNDED,
            &[&id, &amount_cents, &event_sequence],
        )
        .await?;
        Ok(row.try_get("refunded_cents")?)
    }

    /// Charges created within `window` that have no `ChargeCreated` outbox row.
    pub async fn count_without_outbox(
        client: &impl Connection,
        window: std::time::Duration,
    ) -> Result<i64, StoreError> {
        let row = statements::query_one(
            client,
            &COUNT_WITHOUT_OUTBOX,
            &[&window.as_secs_f64(), &EventType::ChargeCreated.as_str()],
        )
        .await?;
        Ok(row.try_get("without_outbox")?)
    }
}

//! `charges`: the aggregate.

use charges_domain::{Charge, EventType, FIRST_SEQUENCE};
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use uuid::Uuid;

use crate::StoreError;
use crate::idempotency_keys::{KeyToComplete, StoredResponse, encode_headers};
use crate::outbox::Origin;
use crate::statements::{self, Connection, Sql};

pub struct ChargeStore;

/// `ChargeInsert`: `$5` is the authenticated client that creates the charge, NULL
/// without authentication. The API runs it inside `charges_create_idempotent`; the constant is
/// what `make bench` runs for the five-statement transaction the function replaced.
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

/// `ChargeCreateOnce`: the whole of `POST /charges` in one statement, the key's
/// claim included (`charges_create_idempotent`, migrations/V2, which composes
/// `idempotency_key_claim` and `outbox_append`; see `OneStatementOperation`). Its row is
/// `idempotency_key_outcome`.
pub const CREATE_ONCE: Sql = Sql::new(
    "
SELECT outcome, acquired, now, request_hash, status, response_status, response_headers,
       response_body, expires_at
  FROM charges_create_idempotent($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
                                 $14, $15, $16, $17, $18, $19, $20)",
    &[
        // The key: key, endpoint, fingerprint, TTL in milliseconds.
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::INT8,
        // The response it stores: status, headers, body.
        Type::INT4,
        Type::JSONB,
        Type::TEXT,
        // The charge: id, amount, currency, created_at, owner.
        Type::UUID,
        Type::INT4,
        Type::BPCHAR,
        Type::TIMESTAMPTZ,
        Type::TEXT,
        // Its event: id, aggregate type, event type, sequence, data, trace parent,
        // trace state, request id.
        Type::UUID,
        Type::TEXT,
        Type::TEXT,
        Type::INT8,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
    ],
);

/// `ChargeCreateOnceBeforeClaim`: [`CREATE_ONCE`] on a schema whose charges set is at V1
/// (`charges_create_once`, composing `idempotency_key_reserve` and
/// `idempotency_key_complete`) or that predates the split: what this build runs for the
/// minutes between its start and its migration, the same parameters, the same row.
const CREATE_ONCE_BEFORE_CLAIM: Sql = Sql::new(
    "
SELECT r_outcome AS outcome, r_acquired AS acquired, r_now AS now,
       r_request_hash AS request_hash, r_status AS status,
       r_response_status AS response_status, r_response_headers AS response_headers,
       r_response_body AS response_body, r_expires_at AS expires_at
  FROM charges_create_once($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14,
                           $15, $16, $17, $18, $19, $20)",
    CREATE_ONCE.types,
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

/// A new charge and its `ChargeCreated` event, as [`ChargeStore::create_once`] writes
/// them. The event's row takes the statement's time as its `created_at`, whatever the
/// charge's.
pub struct NewCharge<'a> {
    pub charge: &'a Charge,
    /// The authenticated client that creates it; `None` without authentication.
    pub owner: Option<&'a str>,
    /// The event's id, what consumers deduplicate on.
    pub event_id: Uuid,
    /// The event's payload exactly as it goes on the wire.
    pub event_data: &'a str,
    pub origin: &'a Origin,
}

impl ChargeStore {
    /// Creates `new` under `key` unless the key was used already, in one statement
    /// ([`CREATE_ONCE`]); the row is `OneStatementOperation::call`'s.
    pub async fn create_once(
        client: &impl Connection,
        key: &KeyToComplete<'_>,
        new: &NewCharge<'_>,
        response: &StoredResponse,
    ) -> Result<Row, StoreError> {
        let event_type = EventType::ChargeCreated;
        let headers = encode_headers(&response.headers);
        let params: [&(dyn ToSql + Sync); 20] = [
            &key.key,
            &key.endpoint,
            &key.fingerprint.as_str(),
            &key.ttl_ms,
            &i32::from(response.status),
            &headers,
            &response.body,
            &new.charge.id,
            &new.charge.amount_cents,
            &new.charge.currency,
            &new.charge.created_at,
            &new.owner,
            &new.event_id,
            &event_type.aggregate_type(),
            &event_type.as_str(),
            &FIRST_SEQUENCE,
            &new.event_data,
            &new.origin.trace_parent,
            &new.origin.trace_state,
            &new.origin.request_id,
        ];
        match statements::query_one(client, &CREATE_ONCE, &params).await {
            // Nothing ran: the statement failed as it was planned.
            Err(StoreError::Database(error))
                if error.code() == Some(&SqlState::UNDEFINED_FUNCTION) =>
            {
                statements::query_one(client, &CREATE_ONCE_BEFORE_CLAIM, &params).await
            }
            result => result,
        }
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

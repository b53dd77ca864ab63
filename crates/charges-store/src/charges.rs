//! `charges`: the aggregate.

use charges_domain::Charge;
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::StoreError;

pub struct ChargeStore;

/// `ChargeInsert`
const INSERT: &str = "
INSERT INTO charges (id, amount_cents, currency, created_at) VALUES ($1, $2, $3, $4)";

/// `ChargeGet`
const GET: &str = "
SELECT id, amount_cents, currency, created_at, refunded_cents FROM charges WHERE id = $1";

/// `ChargeLockForRefund`: the row lock serializes concurrent refunds of one charge
/// until the refund's transaction ends, so each sees the previous one's total.
const LOCK_FOR_REFUND: &str = "
SELECT amount_cents, refunded_cents, currency FROM charges WHERE id = $1 FOR UPDATE";

/// `ChargeAddRefunded`
const ADD_REFUNDED: &str = "
UPDATE charges SET refunded_cents = refunded_cents + $2 WHERE id = $1 RETURNING refunded_cents";

/// A charge's state as a refund sees it, under the row lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundableCharge {
    pub amount_cents: i32,
    pub refunded_cents: i32,
    pub currency: String,
}

impl ChargeStore {
    pub async fn insert(client: &impl GenericClient, charge: &Charge) -> Result<(), StoreError> {
        let statement = client.prepare_cached(INSERT).await?;
        client
            .execute(
                &statement,
                &[
                    &charge.id,
                    &charge.amount_cents,
                    &charge.currency,
                    &charge.created_at,
                ],
            )
            .await?;
        Ok(())
    }

    /// The charge and its refunded total.
    pub async fn get(
        client: &impl GenericClient,
        id: Uuid,
    ) -> Result<Option<(Charge, i32)>, StoreError> {
        let statement = client.prepare_cached(GET).await?;
        let Some(row) = client.query_opt(&statement, &[&id]).await? else {
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

    /// Locks the charge for the rest of the caller's transaction; `None` if unknown.
    pub async fn lock_for_refund(
        client: &impl GenericClient,
        id: Uuid,
    ) -> Result<Option<RefundableCharge>, StoreError> {
        let statement = client.prepare_cached(LOCK_FOR_REFUND).await?;
        let Some(row) = client.query_opt(&statement, &[&id]).await? else {
            return Ok(None);
        };
        Ok(Some(RefundableCharge {
            amount_cents: row.try_get("amount_cents")?,
            refunded_cents: row.try_get("refunded_cents")?,
            currency: row.try_get("currency")?,
        }))
    }

    /// Adds to the refunded total and returns the new total. The table's CHECK refuses
    /// a total above the charged amount.
    pub async fn add_refunded(
        client: &impl GenericClient,
        id: Uuid,
        amount_cents: i32,
    ) -> Result<i32, StoreError> {
        let statement = client.prepare_cached(ADD_REFUNDED).await?;
        let row = client.query_one(&statement, &[&id, &amount_cents]).await?;
        Ok(row.try_get(0)?)
    }
}

//! `refunds`: money returned on a charge.

use charges_domain::Refund;
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::StoreError;

pub struct RefundStore;

/// `RefundInsert`
const INSERT: &str = "
INSERT INTO refunds (id, charge_id, amount_cents, created_at) VALUES ($1, $2, $3, $4)";

/// `RefundListForCharge`
const LIST_FOR_CHARGE: &str = "
SELECT r.id, r.charge_id, r.amount_cents, c.currency, r.created_at
  FROM refunds r JOIN charges c ON c.id = r.charge_id
 WHERE r.charge_id = $1
 ORDER BY r.created_at, r.id";

impl RefundStore {
    pub async fn insert(client: &impl GenericClient, refund: &Refund) -> Result<(), StoreError> {
        let statement = client.prepare_cached(INSERT).await?;
        client
            .execute(
                &statement,
                &[
                    &refund.id,
                    &refund.charge_id,
                    &refund.amount_cents,
                    &refund.created_at,
                ],
            )
            .await?;
        Ok(())
    }

    pub async fn list_for_charge(
        client: &impl GenericClient,
        charge_id: Uuid,
    ) -> Result<Vec<Refund>, StoreError> {
        let statement = client.prepare_cached(LIST_FOR_CHARGE).await?;
        client
            .query(&statement, &[&charge_id])
            .await?
            .iter()
            .map(|row| {
                Ok(Refund {
                    id: row.try_get("id")?,
                    charge_id: row.try_get("charge_id")?,
                    amount_cents: row.try_get("amount_cents")?,
                    currency: row.try_get("currency")?,
                    created_at: row.try_get("created_at")?,
                })
            })
            .collect()
    }
}

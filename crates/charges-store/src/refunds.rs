//! `refunds`: money returned on a charge.

use charges_domain::Refund;
use tokio_postgres::types::Type;
use uuid::Uuid;

use crate::StoreError;
use crate::statements::{self, Connection, Sql};

pub struct RefundStore;

/// `RefundInsert`
const INSERT: Sql = Sql::new(
    "INSERT INTO refunds (id, charge_id, amount_cents, created_at) VALUES ($1, $2, $3, $4)",
    &[Type::UUID, Type::UUID, Type::INT4, Type::TIMESTAMPTZ],
);

/// `RefundListForCharge`
const LIST_FOR_CHARGE: Sql = Sql::new(
    "
SELECT r.id, r.charge_id, r.amount_cents, c.currency, r.created_at
  FROM refunds r JOIN charges c ON c.id = r.charge_id
 WHERE r.charge_id = $1
 ORDER BY r.created_at, r.id",
    &[Type::UUID],
);

impl RefundStore {
    pub async fn insert(client: &impl Connection, refund: &Refund) -> Result<(), StoreError> {
        statements::execute(
            client,
            &INSERT,
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
        client: &impl Connection,
        charge_id: Uuid,
    ) -> Result<Vec<Refund>, StoreError> {
        statements::query(client, &LIST_FOR_CHARGE, &[&charge_id])
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

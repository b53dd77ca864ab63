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
SELECT id, amount_cents, currency, created_at FROM charges WHERE id = $1";

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

    pub async fn get(client: &impl GenericClient, id: Uuid) -> Result<Option<Charge>, StoreError> {
        let statement = client.prepare_cached(GET).await?;
        let Some(row) = client.query_opt(&statement, &[&id]).await? else {
            return Ok(None);
        };
        Ok(Some(Charge {
            id: row.try_get("id")?,
            amount_cents: row.try_get("amount_cents")?,
            currency: row.try_get("currency")?,
            created_at: row.try_get("created_at")?,
        }))
    }
}

//! `outbox`: events committed with the change that caused them, for the relay to
//! publish. The API only inserts; everything else here belongs to the relay.

use charges_domain::EventType;
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::StoreError;

pub struct OutboxStore;

/// `OutboxInsert`
const INSERT: &str = "
INSERT INTO outbox (id, aggregate_id, event_type, payload, created_at)
VALUES ($1, $2, $3, $4, $5)";

impl OutboxStore {
    /// Adds an event on the caller's transaction. `id` is the event id consumers
    /// deduplicate on; `payload` is the event's JSON.
    pub async fn insert(
        client: &impl GenericClient,
        id: Uuid,
        aggregate_id: Uuid,
        event_type: EventType,
        payload: &serde_json::Value,
        created_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), StoreError> {
        let statement = client.prepare_cached(INSERT).await?;
        client
            .execute(
                &statement,
                &[
                    &id,
                    &aggregate_id,
                    &event_type.as_str(),
                    payload,
                    &created_at,
                ],
            )
            .await?;
        Ok(())
    }
}

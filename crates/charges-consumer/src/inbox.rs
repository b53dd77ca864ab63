//! `processed_events`: the inbox, one row per event id already applied.

use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::ConsumerError;

pub struct InboxStore;

/// `ProcessedEventInsert`: the row is the claim "this event's effect is applied". On a
/// redelivery the primary key conflicts and nothing is inserted.
const INSERT: &str = "
INSERT INTO processed_events (event_id, event_type, topic, partition, \"offset\")
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (event_id) DO NOTHING";

/// Where a copy of an event was read from.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

impl InboxStore {
    /// Records `event_id` as processed. `false`: it already was (a duplicate), and the
    /// caller must not apply its effect again.
    pub async fn insert(
        client: &impl GenericClient,
        event_id: Uuid,
        event_type: &str,
        source: Source<'_>,
    ) -> Result<bool, ConsumerError> {
        let statement = client.prepare_cached(INSERT).await?;
        let inserted = client
            .execute(
                &statement,
                &[
                    &event_id,
                    &event_type,
                    &source.topic,
                    &source.partition,
                    &source.offset,
                ],
            )
            .await?;
        Ok(inserted == 1)
    }
}

//! `processed_events`: the inbox, one row per event id already applied.

use charges_store::statements::{self, Connection, Sql};
use tokio_postgres::types::Type;
use uuid::Uuid;

use crate::ConsumerError;

pub struct InboxStore;

/// `ProcessedEventInsert`: the row is the claim "this event's effect is applied". On a
/// redelivery the primary key conflicts and nothing is inserted.
const INSERT: Sql = Sql::new(
    "
INSERT INTO processed_events (event_id, event_type, topic, partition, \"offset\")
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (event_id) DO NOTHING",
    &[Type::UUID, Type::TEXT, Type::TEXT, Type::INT4, Type::INT8],
);

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
        client: &impl Connection,
        event_id: Uuid,
        event_type: &str,
        source: Source<'_>,
    ) -> Result<bool, ConsumerError> {
        let inserted = statements::execute(
            client,
            &INSERT,
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

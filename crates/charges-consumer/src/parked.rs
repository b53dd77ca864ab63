//! `parked_events`: messages this consumer did not apply, kept to be replayed.

use charges_store::statements::{self, Connection, Sql};
use tokio_postgres::types::Type;

use crate::ConsumerError;
use crate::event::Message;
use pg_inbox::Source;

pub struct ParkedStore;

/// `ParkedEventInsert`: parks a message, or records one more failure of a parked one.
const PARK: Sql = Sql::new(
    "
INSERT INTO parked_events (topic, partition, \"offset\", event_id, event_type, headers,
                           payload, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (topic, partition, \"offset\") DO UPDATE
   SET reason = EXCLUDED.reason,
       attempts = parked_events.attempts + 1,
       last_tried_at = now()",
    &[
        Type::TEXT,
        Type::INT4,
        Type::INT8,
        Type::TEXT,
        Type::TEXT,
        Type::JSONB,
        Type::BYTEA,
        Type::TEXT,
    ],
);

/// `ParkedEventList`: oldest first.
const LIST: Sql = Sql::new(
    "
SELECT topic, partition, \"offset\", event_id, event_type, headers, payload, reason, attempts,
       parked_at
  FROM parked_events
 ORDER BY parked_at, topic, partition, \"offset\"
 LIMIT $1",
    &[Type::INT8],
);

/// `ParkedEventDelete`: a replayed message leaves the table.
const DELETE: Sql = Sql::new(
    "
DELETE FROM parked_events WHERE topic = $1 AND partition = $2 AND \"offset\" = $3",
    &[Type::TEXT, Type::INT4, Type::INT8],
);

/// A parked message.
#[derive(Debug, Clone)]
pub struct Parked {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub message: Message,
    pub reason: String,
    pub attempts: i32,
    pub parked_at: chrono::DateTime<chrono::Utc>,
}

impl ParkedStore {
    pub async fn park(
        client: &impl Connection,
        source: Source<'_>,
        message: &Message,
        reason: &str,
    ) -> Result<(), ConsumerError> {
        let headers = serde_json::to_value(Message {
            payload: Vec::new(),
            ..message.clone()
        })
        .map_err(ConsumerError::Encode)?;
        statements::execute(
            client,
            &PARK,
            &[
                &source.topic,
                &source.partition,
                &source.offset,
                &message.id,
                &message.ce_type,
                &headers,
                &message.payload,
                &reason,
            ],
        )
        .await?;
        Ok(())
    }

    pub async fn list(client: &impl Connection, limit: i64) -> Result<Vec<Parked>, ConsumerError> {
        let rows = statements::query(client, &LIST, &[&limit]).await?;
        rows.iter()
            .map(|row| {
                let headers: serde_json::Value = row.try_get("headers")?;
                let mut message: Message = serde_json::from_value(headers).map_err(|e| {
                    ConsumerError::Store(charges_store::StoreError::Decode {
                        column: "parked_events.headers",
                        reason: e.to_string(),
                    })
                })?;
                message.payload = row.try_get("payload")?;
                Ok(Parked {
                    topic: row.try_get("topic")?,
                    partition: row.try_get("partition")?,
                    offset: row.try_get("offset")?,
                    message,
                    reason: row.try_get("reason")?,
                    attempts: row.try_get("attempts")?,
                    parked_at: row.try_get("parked_at")?,
                })
            })
            .collect()
    }

    pub async fn delete(client: &impl Connection, parked: &Parked) -> Result<(), ConsumerError> {
        statements::execute(
            client,
            &DELETE,
            &[&parked.topic, &parked.partition, &parked.offset],
        )
        .await?;
        Ok(())
    }
}

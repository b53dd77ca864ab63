//! `parked_events`: messages this consumer did not apply, kept to be replayed.

use deadpool_postgres::GenericClient;

use crate::ConsumerError;
use crate::event::Message;
use crate::inbox::Source;

pub struct ParkedStore;

/// `ParkedEventInsert`: parks a message, or records one more failure of a parked one.
const PARK: &str = "
INSERT INTO parked_events (topic, partition, \"offset\", event_id, event_type, headers,
                           payload, reason)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (topic, partition, \"offset\") DO UPDATE
   SET reason = EXCLUDED.reason,
       attempts = parked_events.attempts + 1,
       last_tried_at = now()";

/// `ParkedEventList`: oldest first.
const LIST: &str = "
SELECT topic, partition, \"offset\", event_id, event_type, headers, payload, reason, attempts,
       parked_at
  FROM parked_events
 ORDER BY parked_at, topic, partition, \"offset\"
 LIMIT $1";

/// `ParkedEventDelete`: a replayed message leaves the table.
const DELETE: &str = "
DELETE FROM parked_events WHERE topic = $1 AND partition = $2 AND \"offset\" = $3";

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
        client: &impl GenericClient,
        source: Source<'_>,
        message: &Message,
        reason: &str,
    ) -> Result<(), ConsumerError> {
        let headers = serde_json::to_value(Message {
            payload: Vec::new(),
            ..message.clone()
        })
        .map_err(ConsumerError::Encode)?;
        let statement = client.prepare_cached(PARK).await?;
        client
            .execute(
                &statement,
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

    pub async fn list(
        client: &impl GenericClient,
        limit: i64,
    ) -> Result<Vec<Parked>, ConsumerError> {
        let statement = client.prepare_cached(LIST).await?;
        let rows = client.query(&statement, &[&limit]).await?;
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

    pub async fn delete(client: &impl GenericClient, parked: &Parked) -> Result<(), ConsumerError> {
        let statement = client.prepare_cached(DELETE).await?;
        client
            .execute(
                &statement,
                &[&parked.topic, &parked.partition, &parked.offset],
            )
            .await?;
        Ok(())
    }
}

//! `aggregate_positions`: the highest event sequence applied per charge.

use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::ConsumerError;

pub struct PositionStore;

/// `AggregatePositionAdvance`: records `$2` as applied for charge `$1` and returns the
/// highest sequence applied before it (NULL for a charge seen for the first time). The
/// row lock serializes two replicas applying events of one charge.
const ADVANCE: &str = "
WITH before AS (
    SELECT last_sequence FROM aggregate_positions WHERE aggregate_id = $1 FOR UPDATE
), upsert AS (
    INSERT INTO aggregate_positions (aggregate_id, last_sequence) VALUES ($1, $2)
    ON CONFLICT (aggregate_id) DO UPDATE
       SET last_sequence = greatest(aggregate_positions.last_sequence, EXCLUDED.last_sequence)
)
SELECT (SELECT last_sequence FROM before) AS previous";

impl PositionStore {
    pub async fn advance(
        client: &impl GenericClient,
        aggregate_id: Uuid,
        sequence: i64,
    ) -> Result<Option<i64>, ConsumerError> {
        let statement = client.prepare_cached(ADVANCE).await?;
        let row = client
            .query_one(&statement, &[&aggregate_id, &sequence])
            .await?;
        Ok(row.try_get("previous")?)
    }
}

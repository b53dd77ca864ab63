//! `aggregate_positions`: the highest event sequence applied per charge.

use charges_store::statements::{self, Connection, Sql};
use tokio_postgres::types::Type;
use uuid::Uuid;

use crate::ConsumerError;

pub struct PositionStore;

/// `AggregatePositionAdvance`: records `$2` as applied for charge `$1` and returns the
/// highest sequence applied before it (NULL for a charge seen for the first time). The
/// row lock serializes two replicas applying events of one charge.
const ADVANCE: Sql = Sql::new(
    "
WITH before AS (
    SELECT last_sequence FROM aggregate_positions WHERE aggregate_id = $1 FOR UPDATE
), upsert AS (
    INSERT INTO aggregate_positions (aggregate_id, last_sequence) VALUES ($1, $2)
    ON CONFLICT (aggregate_id) DO UPDATE
       SET last_sequence = greatest(aggregate_positions.last_sequence, EXCLUDED.last_sequence)
)
SELECT (SELECT last_sequence FROM before) AS previous",
    &[Type::UUID, Type::INT8],
);

impl PositionStore {
    pub async fn advance(
        client: &impl Connection,
        aggregate_id: Uuid,
        sequence: i64,
    ) -> Result<Option<i64>, ConsumerError> {
        let row = statements::query_one(client, &ADVANCE, &[&aggregate_id, &sequence]).await?;
        Ok(row.try_get("previous")?)
    }
}

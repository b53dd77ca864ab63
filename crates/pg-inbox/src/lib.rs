#![doc = include_str!("../README.md")]

use deadpool_postgres::{Pool, Transaction};
use pg_plumbing::statements::{self, Connection, Sql, Type};
use pg_plumbing::{SchemaSet, StoreError};
use uuid::Uuid;

#[cfg(feature = "kafka")]
pub mod kafka;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// `processed_events`, with its own refinery history (`inbox_schema_history`). Apply it
/// with `pg_plumbing::migrations::apply`.
pub fn schema() -> SchemaSet {
    SchemaSet::new(
        "inbox",
        "inbox_schema_history",
        embedded::migrations::runner,
    )
}

/// Where a copy of an event was read from (kept with its row, for debugging).
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

/// An event as delivered: its id (the outbox id the producer deduplicates on), its
/// type and where it came from.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    pub id: Uuid,
    pub event_type: &'a str,
    pub source: Source<'a>,
}

/// What [`Inbox::process`] did with a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed<T> {
    /// First delivery: the effect ran and was committed with the inbox row.
    Applied(T),
    /// Seen before: nothing was run or written.
    Duplicate,
}

/// `ProcessedEventInsert`: the row is the claim "this event's effect is applied". On a
/// redelivery the primary key conflicts and nothing is inserted.
const INSERT: Sql = Sql::new(
    "
INSERT INTO processed_events (event_id, event_type, topic, partition, \"offset\")
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (event_id) DO NOTHING",
    &[Type::UUID, Type::TEXT, Type::TEXT, Type::INT4, Type::INT8],
);

/// Every statement on `processed_events`.
pub struct Inbox;

impl Inbox {
    /// Records `delivery` as processed on the caller's transaction. `false`: it already
    /// was (a duplicate), and the caller must not apply its effect again. A concurrent
    /// first delivery of the same id waits on the row lock until the other transaction
    /// ends, then sees it.
    pub async fn record(
        client: &impl Connection,
        delivery: &Delivery<'_>,
    ) -> Result<bool, StoreError> {
        let source = delivery.source;
        let inserted = statements::execute(
            client,
            &INSERT,
            &[
                &delivery.id,
                &delivery.event_type,
                &source.topic,
                &source.partition,
                &source.offset,
            ],
        )
        .await?;
        Ok(inserted == 1)
    }

    /// Runs `effect` once per event id: the inbox row and whatever `effect` writes on
    /// the transaction commit together, or not at all (an `Err` rolls both back, and
    /// the delivery may be processed again). Commit the message's offset only after
    /// this returned `Ok`: a crash in between redelivers it, and it is then a
    /// [`Processed::Duplicate`].
    pub async fn process<T, E>(
        pool: &Pool,
        delivery: &Delivery<'_>,
        effect: impl AsyncFnOnce(&Transaction<'_>) -> Result<T, E>,
    ) -> Result<Processed<T>, E>
    where
        E: From<StoreError>,
    {
        let mut client = pool.get().await.map_err(StoreError::from)?;
        let tx = client.transaction().await.map_err(StoreError::from)?;
        if !Self::record(&tx, delivery).await? {
            // Nothing was written: rolling back and committing are the same.
            tx.rollback().await.map_err(StoreError::from)?;
            return Ok(Processed::Duplicate);
        }
        let applied = effect(&tx).await?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(Processed::Applied(applied))
    }
}

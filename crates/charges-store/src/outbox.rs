//! `outbox`: events committed with the change that caused them, for the relay to
//! publish. The API only inserts; everything else here belongs to the relay.

use charges_domain::EventType;
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use crate::StoreError;

/// `OutboxInsert`
pub const INSERT: &str = "
INSERT INTO outbox (id, aggregate_id, event_type, payload, created_at)
VALUES ($1, $2, $3, $4, $5)";

// The relay's statements. The claim is the batch transaction's row lock
// (docs/design.md, "The relay").

/// `OutboxClaimSetTimeouts`: bounds the claim transaction (`SET LOCAL`, so it ends
/// with the transaction). Values are milliseconds as text.
const CLAIM_SET_TIMEOUTS: &str = "
SELECT set_config('idle_in_transaction_session_timeout', $1, true),
       set_config('statement_timeout', $2, true)";

/// `OutboxClaimPending`: the oldest publishable rows that no other relay holds.
/// Matches `outbox_pending_idx` (predicate and order).
pub const CLAIM_PENDING: &str = "
SELECT id, aggregate_id, event_type, payload::text AS payload, created_at, attempts
FROM outbox
WHERE published_at IS NULL
  AND dead_at IS NULL
  AND next_attempt_at <= now()
ORDER BY created_at
LIMIT $1
FOR UPDATE SKIP LOCKED";

/// `OutboxMarkPublishedMany`: one statement per batch, only for acknowledged ids.
pub const MARK_PUBLISHED_MANY: &str = "
UPDATE outbox
SET published_at = clock_timestamp(),
    next_attempt_at = clock_timestamp()
WHERE id = ANY($1)
  AND published_at IS NULL";

/// `OutboxRecordFailureMany`: one statement per batch; `$4[i]` says whether row `i`
/// has used up its attempts and becomes dead.
const RECORD_FAILURE_MANY: &str = "
UPDATE outbox AS o
SET attempts = o.attempts + 1,
    last_error = f.error,
    next_attempt_at = clock_timestamp() + f.retry_in_ms * interval '1 millisecond',
    dead_at = CASE WHEN f.dead THEN clock_timestamp() END
FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::bool[])
     AS f(id, error, retry_in_ms, dead)
WHERE o.id = f.id
  AND o.published_at IS NULL";

/// `OutboxDeletePublished`: a small batch of published rows older than `$1` seconds.
/// Pending and dead rows have `published_at IS NULL` and are never matched.
/// By `ctid`, like `IdempotencyKeyDeleteExpired`: exactly the locked batch, whatever
/// the planner thinks of the table's size.
pub const DELETE_PUBLISHED: &str = "
DELETE FROM outbox
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM outbox
    WHERE published_at < now() - $1::float8 * interval '1 second'
    ORDER BY published_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))";

/// `OutboxListDead`
const LIST_DEAD: &str = "
SELECT id, aggregate_id, event_type, attempts, last_error, created_at, dead_at
FROM outbox
WHERE dead_at IS NOT NULL
ORDER BY dead_at, id
LIMIT $1";

/// `OutboxRequeueDeadMany`: `$1` NULL means every dead row.
const REQUEUE_DEAD_MANY: &str = "
UPDATE outbox
SET attempts = 0,
    dead_at = NULL,
    next_attempt_at = now()
WHERE dead_at IS NOT NULL
  AND ($1::uuid[] IS NULL OR id = ANY($1))";

/// `OutboxStats`: what the relay exports as gauges. Each part matches a partial
/// index (`outbox_pending_idx`, `outbox_dead_idx`), so it stays cheap however many
/// published rows the table holds. Rows waiting for a retry count as pending.
const STATS: &str = "
SELECT (SELECT count(*) FROM outbox
         WHERE published_at IS NULL AND dead_at IS NULL) AS pending,
       (SELECT coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8
          FROM outbox
         WHERE published_at IS NULL AND dead_at IS NULL) AS oldest_pending_age_seconds,
       (SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL) AS dead";

/// `OutboxListenPending`: the channel the `outbox_notify_pending` trigger notifies on
/// commit of every INSERT statement (see migration V2).
const LISTEN_PENDING: &str = "LISTEN outbox_pending";

/// Every statement on `outbox`; the caller owns the transaction.
pub struct OutboxStore;

/// A row the relay claimed and must publish.
#[derive(Debug, Clone)]
pub struct PendingEvent {
    pub id: Uuid,
    pub aggregate_id: Uuid,
    pub event_type: String,
    /// The JSON payload as text, exactly what goes on the wire.
    pub payload: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Failed attempts so far.
    pub attempts: i32,
}

/// A failed publish of one row, recorded by [`OutboxStore::record_failures`].
#[derive(Debug, Clone)]
pub struct PublishFailure {
    pub id: Uuid,
    pub error: String,
    pub retry_in: std::time::Duration,
    /// The row has used up its attempts: set `dead_at`, never claim it again.
    pub dead: bool,
}

/// A dead row, as `charges-relay dead list` shows it.
#[derive(Debug, Clone)]
pub struct DeadEvent {
    pub id: Uuid,
    pub aggregate_id: Uuid,
    pub event_type: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub dead_at: chrono::DateTime<chrono::Utc>,
}

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

    /// `SET LOCAL` the claim transaction's `idle_in_transaction_session_timeout` and
    /// `statement_timeout`, so that the server ends it even if the relay hangs.
    pub async fn set_claim_timeouts(
        client: &impl GenericClient,
        idle_in_transaction: std::time::Duration,
        statement: std::time::Duration,
    ) -> Result<(), StoreError> {
        let statement_sql = client.prepare_cached(CLAIM_SET_TIMEOUTS).await?;
        let idle = idle_in_transaction.as_millis().to_string();
        let stmt = statement.as_millis().to_string();
        client.query_one(&statement_sql, &[&idle, &stmt]).await?;
        Ok(())
    }

    /// Locks and returns up to `limit` publishable rows, oldest first, skipping rows
    /// other relays hold. The locks last until the caller's transaction ends.
    pub async fn claim_pending(
        client: &impl GenericClient,
        limit: i64,
    ) -> Result<Vec<PendingEvent>, StoreError> {
        let statement = client.prepare_cached(CLAIM_PENDING).await?;
        let rows = client.query(&statement, &[&limit]).await?;
        rows.iter()
            .map(|row| {
                Ok(PendingEvent {
                    id: row.try_get("id")?,
                    aggregate_id: row.try_get("aggregate_id")?,
                    event_type: row.try_get("event_type")?,
                    payload: row.try_get("payload")?,
                    created_at: row.try_get("created_at")?,
                    attempts: row.try_get("attempts")?,
                })
            })
            .collect()
    }

    /// Marks the broker-acknowledged `ids` published; returns how many rows changed.
    pub async fn mark_published(
        client: &impl GenericClient,
        ids: &[Uuid],
    ) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let statement = client.prepare_cached(MARK_PUBLISHED_MANY).await?;
        Ok(client.execute(&statement, &[&ids]).await?)
    }

    /// Records failed attempts (error, next attempt, dead) in one statement.
    pub async fn record_failures(
        client: &impl GenericClient,
        failures: &[PublishFailure],
    ) -> Result<u64, StoreError> {
        if failures.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Uuid> = failures.iter().map(|f| f.id).collect();
        let errors: Vec<&str> = failures.iter().map(|f| f.error.as_str()).collect();
        let retry_in_ms: Vec<i64> = failures
            .iter()
            .map(|f| i64::try_from(f.retry_in.as_millis()).unwrap_or(i64::MAX))
            .collect();
        let dead: Vec<bool> = failures.iter().map(|f| f.dead).collect();
        let statement = client.prepare_cached(RECORD_FAILURE_MANY).await?;
        Ok(client
            .execute(&statement, &[&ids, &errors, &retry_in_ms, &dead])
            .await?)
    }

    /// Deletes up to `limit` rows published more than `older_than` ago.
    pub async fn delete_published(
        client: &impl GenericClient,
        older_than: std::time::Duration,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let statement = client.prepare_cached(DELETE_PUBLISHED).await?;
        Ok(client
            .execute(&statement, &[&older_than.as_secs_f64(), &limit])
            .await?)
    }

    /// Up to `limit` dead rows, oldest death first.
    pub async fn list_dead(
        client: &impl GenericClient,
        limit: i64,
    ) -> Result<Vec<DeadEvent>, StoreError> {
        let statement = client.prepare_cached(LIST_DEAD).await?;
        let rows = client.query(&statement, &[&limit]).await?;
        rows.iter()
            .map(|row| {
                Ok(DeadEvent {
                    id: row.try_get("id")?,
                    aggregate_id: row.try_get("aggregate_id")?,
                    event_type: row.try_get("event_type")?,
                    attempts: row.try_get("attempts")?,
                    last_error: row.try_get("last_error")?,
                    created_at: row.try_get("created_at")?,
                    dead_at: row.try_get("dead_at")?,
                })
            })
            .collect()
    }

    /// Makes dead rows pending again with a fresh attempt budget: the rows in `ids`,
    /// or every dead row when `ids` is `None`. Returns how many rows changed.
    pub async fn requeue_dead(
        client: &impl GenericClient,
        ids: Option<&[Uuid]>,
    ) -> Result<u64, StoreError> {
        let statement = client.prepare_cached(REQUEUE_DEAD_MANY).await?;
        let ids: Option<Vec<Uuid>> = ids.map(<[Uuid]>::to_vec);
        Ok(client.execute(&statement, &[&ids]).await?)
    }

    pub async fn stats(client: &impl GenericClient) -> Result<OutboxStats, StoreError> {
        let statement = client.prepare_cached(STATS).await?;
        let row = client.query_one(&statement, &[]).await?;
        Ok(OutboxStats {
            pending: row.try_get("pending")?,
            oldest_pending_age_seconds: row.try_get("oldest_pending_age_seconds")?,
            dead: row.try_get("dead")?,
        })
    }

    /// Subscribes `client`'s session to the insert notifications. The notifications
    /// arrive on the client's connection future as `AsyncMessage::Notification`.
    pub async fn listen(client: &tokio_postgres::Client) -> Result<(), StoreError> {
        client.batch_execute(LISTEN_PENDING).await?;
        Ok(())
    }
}

/// The outbox's backlog, as the relay exports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutboxStats {
    /// Neither published nor dead (including rows waiting for a retry).
    pub pending: i64,
    /// Age of the oldest pending row; 0 when nothing is pending.
    pub oldest_pending_age_seconds: f64,
    pub dead: i64,
}

//! `outbox`: events committed with the change that caused them, for the relay to
//! publish. The API only inserts; everything else here belongs to the relay.

use chrono::{DateTime, Utc};
use tokio_postgres::types::{PgLsn, Type};
use uuid::Uuid;

use crate::replication::WalPosition;
use pg_plumbing::StoreError;
use pg_plumbing::statements::{self, Connection, ReadyStatement, Sql};

/// `OutboxInsert`
pub const INSERT: Sql = Sql::new(
    "
INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, sequence, data, created_at,
                    trace_parent, trace_state, request_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    &[
        Type::UUID,
        Type::TEXT,
        Type::UUID,
        Type::TEXT,
        Type::INT8,
        Type::TEXT,
        Type::TIMESTAMPTZ,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
    ],
);

// The relay's statements. The claim is the batch transaction's row lock
// (docs/design.md, "The relay").

/// `OutboxClaimSetTimeouts`: bounds the claim transaction (`SET LOCAL`, so it ends
/// with the transaction). Values are milliseconds as text.
const CLAIM_SET_TIMEOUTS: Sql = Sql::new(
    "
SELECT set_config('idle_in_transaction_session_timeout', $1, true),
       set_config('statement_timeout', $2, true)",
    &[Type::TEXT, Type::TEXT],
);

/// `OutboxClaimPending`: the oldest publishable rows created at or after `$2` (NULL:
/// from the oldest) that no other relay holds. Matches `outbox_pending_idx`
/// (predicate and order; `$2` bounds the index range, so the scan starts there).
///
/// `claim_position`, the same on every row, is where the WAL was flushed to as the first
/// row was read (an uncorrelated subquery in the target list is an InitPlan, run once),
/// after the statement's snapshot was taken: past the commit record of every row it can
/// see, since a commit is flushed before it becomes visible (for commits made with
/// `synchronous_commit` on, local or remote_*; with it off a commit is visible before it
/// is flushed, and lost by a crash anyway). The replication gate waits for the standbys
/// to flush up to it. The insert position would be looser: it includes WAL nobody has
/// flushed yet, such as other batches' marks in flight, and a batch would wait for them.
/// `claim_server` (the postmaster's start time) names the server the position belongs
/// to: after a failover another server's positions say nothing about this claim's rows.
pub const CLAIM_PENDING: Sql = Sql::new(
    "
SELECT id, aggregate_type, aggregate_id, event_type, sequence,
       coalesce(data, payload::text) AS payload, created_at, attempts, rejections,
       trace_parent, trace_state, request_id,
       (SELECT pg_current_wal_flush_lsn()) AS claim_position,
       (SELECT pg_postmaster_start_time()) AS claim_server
FROM outbox
WHERE published_at IS NULL
  AND dead_at IS NULL
  AND next_attempt_at <= now()
  AND created_at >= coalesce($2::timestamptz, '-infinity')
ORDER BY created_at
LIMIT $1
FOR UPDATE SKIP LOCKED",
    &[Type::INT8, Type::TIMESTAMPTZ],
);

/// `OutboxClaimPendingOrdered`: as `OutboxClaimPending`, but only the oldest unpublished
/// event of each aggregate: a row is claimable once no event of its aggregate with a lower
/// sequence is unpublished (pending, waiting for a retry, claimed by another relay, or
/// dead). The probe runs on `outbox_aggregate_type_sequence_idx`. The statement's snapshot
/// can only make it more careful: a predecessor published after the snapshot still
/// counts as unpublished, and its successor waits for the next claim.
pub const CLAIM_PENDING_ORDERED: Sql = Sql::new(
    "
SELECT o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.sequence,
       coalesce(o.data, o.payload::text) AS payload, o.created_at, o.attempts, o.rejections,
       o.trace_parent, o.trace_state, o.request_id,
       (SELECT pg_current_wal_flush_lsn()) AS claim_position,
       (SELECT pg_postmaster_start_time()) AS claim_server
FROM outbox o
WHERE o.published_at IS NULL
  AND o.dead_at IS NULL
  AND o.next_attempt_at <= now()
  AND o.created_at >= coalesce($2::timestamptz, '-infinity')
  AND NOT EXISTS (SELECT 1 FROM outbox earlier
                   WHERE earlier.aggregate_type = o.aggregate_type
                     AND earlier.aggregate_id = o.aggregate_id
                     AND earlier.sequence < o.sequence
                     AND earlier.published_at IS NULL)
ORDER BY o.created_at
LIMIT $1
FOR UPDATE OF o SKIP LOCKED",
    &[Type::INT8, Type::TIMESTAMPTZ],
);

/// `OutboxMarkPublishedMany`: one statement per batch, only for acknowledged ids.
pub const MARK_PUBLISHED_MANY: Sql = Sql::new(
    "
UPDATE outbox
SET published_at = clock_timestamp(),
    next_attempt_at = clock_timestamp()
WHERE id = ANY($1)
  AND published_at IS NULL",
    &[Type::UUID_ARRAY],
);

/// `OutboxRecordFailureMany`: one statement per batch. Every failure counts as an
/// attempt; `$4[i]` says whether the broker refused the message itself (a rejection,
/// which counts towards `--max-attempts`), `$5[i]` whether row `i` has used up its
/// rejections and becomes dead.
const RECORD_FAILURE_MANY: Sql = Sql::new(
    "
UPDATE outbox AS o
SET attempts = o.attempts + 1,
    rejections = o.rejections + CASE WHEN f.rejected THEN 1 ELSE 0 END,
    last_error = f.error,
    next_attempt_at = clock_timestamp() + f.retry_in_ms * interval '1 millisecond',
    dead_at = CASE WHEN f.dead THEN clock_timestamp() END
FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::bool[], $5::bool[])
     AS f(id, error, retry_in_ms, rejected, dead)
WHERE o.id = f.id
  AND o.published_at IS NULL",
    &[
        Type::UUID_ARRAY,
        Type::TEXT_ARRAY,
        Type::INT8_ARRAY,
        Type::BOOL_ARRAY,
        Type::BOOL_ARRAY,
    ],
);

/// `OutboxDeletePublished` (the `delete_published_outbox` job): a small batch of published rows older than `$1` seconds,
/// and how far retention has now deleted (`outbox_retention_horizon`, which
/// reconciliation reads). Pending and dead rows have `published_at IS NULL` and are
/// never matched. By `ctid`, like `IdempotencyKeyPurgeExpired`: exactly the locked
/// batch, whatever the planner thinks of the table's size.
pub const DELETE_PUBLISHED: Sql = Sql::new(
    "
WITH deleted AS (
    DELETE FROM outbox
    WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM outbox
        WHERE published_at < now() - $1::float8 * interval '1 second'
        ORDER BY published_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING published_at
), horizon AS (
    INSERT INTO outbox_retention_horizon AS h (deleted_published_through)
    SELECT max(published_at) FROM deleted HAVING count(*) > 0
    ON CONFLICT (singleton) DO UPDATE
       SET deleted_published_through =
           greatest(h.deleted_published_through, EXCLUDED.deleted_published_through)
)
SELECT count(*) AS deleted FROM deleted",
    &[Type::FLOAT8, Type::INT8],
);

/// `OutboxDiscardDeadMany`: moves the dead rows among `$1` to `outbox_discarded`,
/// recording `$2` as who discarded them; returns their ids.
const DISCARD_DEAD_MANY: Sql = Sql::new(
    "
WITH gone AS (
    DELETE FROM outbox WHERE id = ANY($1) AND dead_at IS NOT NULL
    RETURNING id, aggregate_type, aggregate_id, event_type, sequence, payload, data, attempts,
              rejections, last_error, created_at, dead_at
)
INSERT INTO outbox_discarded (id, aggregate_type, aggregate_id, event_type, sequence, payload,
                              data, attempts, rejections, last_error, created_at, dead_at,
                              discarded_by)
SELECT id, aggregate_type, aggregate_id, event_type, sequence, payload, data, attempts,
       rejections, last_error, created_at, dead_at, $2
  FROM gone
RETURNING id",
    &[Type::UUID_ARRAY, Type::TEXT],
);

/// `OutboxListDead`: `$2` NULL lists every dead row, else those whose `last_error`
/// is `LIKE $2`.
const LIST_DEAD: Sql = Sql::new(
    "
SELECT id, aggregate_type, aggregate_id, event_type, sequence,
       coalesce(data, payload::text) AS payload, attempts, rejections, last_error,
       created_at, dead_at
FROM outbox
WHERE dead_at IS NOT NULL
  AND ($2::text IS NULL OR last_error LIKE $2::text)
ORDER BY dead_at, id
LIMIT $1",
    &[Type::INT8, Type::TEXT],
);

/// `OutboxGetDeadMany`
const GET_DEAD_MANY: Sql = Sql::new(
    "
SELECT id, aggregate_type, aggregate_id, event_type, sequence,
       coalesce(data, payload::text) AS payload, attempts, rejections, last_error,
       created_at, dead_at
FROM outbox
WHERE dead_at IS NOT NULL
  AND id = ANY($1)
ORDER BY dead_at, id",
    &[Type::UUID_ARRAY],
);

/// `OutboxRequeueDeadMany`: returns the ids it requeued.
const REQUEUE_DEAD_MANY: Sql = Sql::new(
    "
UPDATE outbox
SET attempts = 0,
    rejections = 0,
    dead_at = NULL,
    next_attempt_at = now()
WHERE dead_at IS NOT NULL
  AND id = ANY($1)
RETURNING id",
    &[Type::UUID_ARRAY],
);

/// `OutboxStats` (the `outbox_stats` job): what the relay exports as gauges. Each part matches a partial
/// index (`outbox_pending_idx`, `outbox_dead_idx`), so it stays cheap however many
/// published rows the table holds. Rows waiting for a retry count as pending.
const STATS: Sql = Sql::new(
    "
SELECT (SELECT count(*) FROM outbox
         WHERE published_at IS NULL AND dead_at IS NULL) AS pending,
       (SELECT coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8
          FROM outbox
         WHERE published_at IS NULL AND dead_at IS NULL) AS oldest_pending_age_seconds,
       (SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL) AS dead",
    &[],
);

/// `OutboxListenPending`: the channel the `outbox_notify_pending` trigger notifies on
/// commit of every INSERT statement (see migration V2).
const LISTEN_PENDING: &str = "LISTEN outbox_pending";

/// Every statement on `outbox`; the caller owns the transaction.
pub struct OutboxStore;

/// An event to add to the outbox, on the transaction of the change that caused it.
#[derive(Debug, Clone, Copy)]
pub struct NewEvent<'a> {
    /// What consumers deduplicate on.
    pub id: Uuid,
    /// Routes it to a topic (`order`, `invoice`, …); its aggregate's events share it.
    pub aggregate_type: &'a str,
    pub aggregate_id: Uuid,
    /// The event's name, as consumers and the relay's catalog know it.
    pub event_type: &'a str,
    /// The event's place among its aggregate's events, assigned under the aggregate's
    /// row lock.
    pub sequence: i64,
    /// The payload exactly as it goes on the wire.
    pub data: &'a str,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Who wrote it: the request's W3C trace context and request id.
    pub origin: &'a Origin,
}

/// The request an event came from: its W3C Trace Context (`traceparent` names the span
/// that wrote the event) and its request id. Stored with the event; the relay sends
/// them as Kafka headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    pub trace_parent: Option<String>,
    pub trace_state: Option<String>,
    pub request_id: Option<String>,
}

/// A row the relay claimed and must publish.
#[derive(Debug, Clone)]
pub struct PendingEvent {
    pub id: Uuid,
    /// Routes it to a topic (`order`, …).
    pub aggregate_type: String,
    pub aggregate_id: Uuid,
    pub event_type: String,
    /// `None` only for rows written before migration V6.
    pub sequence: Option<i64>,
    /// The JSON payload as text, exactly what goes on the wire.
    pub payload: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Failed attempts so far, whatever the reason.
    pub attempts: i32,
    /// Failed attempts the broker refused the message itself.
    pub rejections: i32,
    pub origin: Origin,
}

impl PendingEvent {
    fn from_row(row: &tokio_postgres::Row) -> Result<PendingEvent, StoreError> {
        Ok(PendingEvent {
            id: row.try_get("id")?,
            aggregate_type: row.try_get("aggregate_type")?,
            aggregate_id: row.try_get("aggregate_id")?,
            event_type: row.try_get("event_type")?,
            sequence: row.try_get("sequence")?,
            payload: row.try_get("payload")?,
            created_at: row.try_get("created_at")?,
            attempts: row.try_get("attempts")?,
            rejections: row.try_get("rejections")?,
            origin: Origin {
                trace_parent: row.try_get("trace_parent")?,
                trace_state: row.try_get("trace_state")?,
                request_id: row.try_get("request_id")?,
            },
        })
    }
}

/// The relay's four statements, ready on the connection that runs them (see
/// [`statements::ReadyStatement`]): a pipelined request goes out the moment its future
/// is first polled, in the order the futures are polled, whereas a statement still to
/// be prepared would send its `Parse` and let a later request overtake its execution.
#[derive(Debug, Clone)]
pub struct ClaimStatements {
    set_timeouts: ReadyStatement,
    claim: ReadyStatement,
    mark_published: ReadyStatement,
    record_failures: ReadyStatement,
}

/// A failed publish of one row, recorded by [`OutboxStore::record_failures`].
#[derive(Debug, Clone)]
pub struct PublishFailure {
    pub id: Uuid,
    pub error: String,
    pub retry_in: std::time::Duration,
    /// The broker refused this message (not: the broker was unavailable).
    pub rejected: bool,
    /// The row has used up its rejections: set `dead_at`, never claim it again.
    pub dead: bool,
}

/// A dead row, as a relay's dead-row commands show it.
#[derive(Debug, Clone)]
pub struct DeadEvent {
    pub id: Uuid,
    pub aggregate_type: String,
    pub aggregate_id: Uuid,
    pub event_type: String,
    pub sequence: Option<i64>,
    pub payload: String,
    pub attempts: i32,
    pub rejections: i32,
    pub last_error: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub dead_at: chrono::DateTime<chrono::Utc>,
}

impl DeadEvent {
    fn from_row(row: &tokio_postgres::Row) -> Result<DeadEvent, StoreError> {
        Ok(DeadEvent {
            id: row.try_get("id")?,
            aggregate_type: row.try_get("aggregate_type")?,
            aggregate_id: row.try_get("aggregate_id")?,
            event_type: row.try_get("event_type")?,
            sequence: row.try_get("sequence")?,
            payload: row.try_get("payload")?,
            attempts: row.try_get("attempts")?,
            rejections: row.try_get("rejections")?,
            last_error: row.try_get("last_error")?,
            created_at: row.try_get("created_at")?,
            dead_at: row.try_get("dead_at")?,
        })
    }
}

impl OutboxStore {
    /// Adds an event on the caller's transaction.
    pub async fn insert(client: &impl Connection, event: &NewEvent<'_>) -> Result<(), StoreError> {
        statements::execute(
            client,
            &INSERT,
            &[
                &event.id,
                &event.aggregate_type,
                &event.aggregate_id,
                &event.event_type,
                &event.sequence,
                &event.data,
                &event.created_at,
                &event.origin.trace_parent,
                &event.origin.trace_state,
                &event.origin.request_id,
            ],
        )
        .await?;
        Ok(())
    }

    /// The claim transaction's statements; directly, prepared (pipelined) on first use
    /// of a connection and from its cache afterwards.
    pub async fn claim_statements(
        client: &impl Connection,
        ordered: bool,
    ) -> Result<ClaimStatements, StoreError> {
        let claim = if ordered {
            CLAIM_PENDING_ORDERED
        } else {
            CLAIM_PENDING
        };
        let (set_timeouts, claim, mark_published, record_failures) = futures::try_join!(
            statements::ready(client, &CLAIM_SET_TIMEOUTS),
            statements::ready(client, &claim),
            statements::ready(client, &MARK_PUBLISHED_MANY),
            statements::ready(client, &RECORD_FAILURE_MANY),
        )?;
        Ok(ClaimStatements {
            set_timeouts,
            claim,
            mark_published,
            record_failures,
        })
    }

    /// `SET LOCAL` the claim transaction's `idle_in_transaction_session_timeout` and
    /// `statement_timeout`, so that the server ends it even if the relay hangs.
    pub async fn set_claim_timeouts(
        client: &impl Connection,
        prepared: &ClaimStatements,
        idle_in_transaction: std::time::Duration,
        statement: std::time::Duration,
    ) -> Result<(), StoreError> {
        let idle = idle_in_transaction.as_millis().to_string();
        let stmt = statement.as_millis().to_string();
        prepared.set_timeouts.query(client, &[&idle, &stmt]).await?;
        Ok(())
    }

    /// Locks and returns up to `limit` publishable rows created at or after `from`
    /// (`None`: from the oldest), oldest first, skipping rows other relays hold; with
    /// the ordered statements, only the oldest unpublished event of each aggregate.
    /// The locks last until the caller's transaction ends.
    /// Also returns the claim's WAL position (see [`CLAIM_PENDING`]); `None` when it
    /// claimed nothing.
    pub async fn claim_pending(
        client: &impl Connection,
        prepared: &ClaimStatements,
        limit: i64,
        from: Option<DateTime<Utc>>,
    ) -> Result<(Vec<PendingEvent>, Option<WalPosition>), StoreError> {
        let rows = prepared.claim.query(client, &[&limit, &from]).await?;
        let position = match rows.first() {
            Some(row) => Some(WalPosition {
                lsn: u64::from(row.try_get::<_, PgLsn>("claim_position")?),
                server: row.try_get("claim_server")?,
            }),
            None => None,
        };
        let events = rows
            .iter()
            .map(PendingEvent::from_row)
            .collect::<Result<_, _>>()?;
        Ok((events, position))
    }

    /// Marks the broker-acknowledged `ids` published; returns how many rows changed.
    pub async fn mark_published(
        client: &impl Connection,
        prepared: &ClaimStatements,
        ids: &[Uuid],
    ) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        prepared.mark_published.execute(client, &[&ids]).await
    }

    /// Records failed attempts (error, next attempt, dead) in one statement.
    pub async fn record_failures(
        client: &impl Connection,
        prepared: &ClaimStatements,
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
        let rejected: Vec<bool> = failures.iter().map(|f| f.rejected).collect();
        let dead: Vec<bool> = failures.iter().map(|f| f.dead).collect();
        prepared
            .record_failures
            .execute(client, &[&ids, &errors, &retry_in_ms, &rejected, &dead])
            .await
    }

    /// Deletes up to `limit` rows published more than `older_than` ago.
    pub async fn delete_published(
        client: &impl Connection,
        older_than: std::time::Duration,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let row = statements::query_one(
            client,
            &DELETE_PUBLISHED,
            &[&older_than.as_secs_f64(), &limit],
        )
        .await?;
        let deleted: i64 = row.try_get("deleted")?;
        Ok(u64::try_from(deleted).unwrap_or_default())
    }

    /// Up to `limit` dead rows, oldest death first; with `last_error_like`, only those
    /// whose last error matches that `LIKE` pattern.
    pub async fn list_dead(
        client: &impl Connection,
        limit: i64,
        last_error_like: Option<&str>,
    ) -> Result<Vec<DeadEvent>, StoreError> {
        let rows = statements::query(client, &LIST_DEAD, &[&limit, &last_error_like]).await?;
        rows.iter().map(DeadEvent::from_row).collect()
    }

    /// The dead rows among `ids`.
    pub async fn get_dead(
        client: &impl Connection,
        ids: &[Uuid],
    ) -> Result<Vec<DeadEvent>, StoreError> {
        let rows = statements::query(client, &GET_DEAD_MANY, &[&ids]).await?;
        rows.iter().map(DeadEvent::from_row).collect()
    }

    /// Moves the dead rows among `ids` to `outbox_discarded` with `by` as who did it;
    /// returns the ids it discarded.
    pub async fn discard_dead(
        client: &impl Connection,
        ids: &[Uuid],
        by: &str,
    ) -> Result<Vec<Uuid>, StoreError> {
        let rows = statements::query(client, &DISCARD_DEAD_MANY, &[&ids, &by]).await?;
        rows.iter().map(|row| Ok(row.try_get("id")?)).collect()
    }

    /// Makes the dead rows among `ids` pending again with a fresh budget; returns the
    /// ids it requeued.
    pub async fn requeue_dead(
        client: &impl Connection,
        ids: &[Uuid],
    ) -> Result<Vec<Uuid>, StoreError> {
        let rows = statements::query(client, &REQUEUE_DEAD_MANY, &[&ids]).await?;
        rows.iter().map(|row| Ok(row.try_get("id")?)).collect()
    }

    pub async fn stats(client: &impl Connection) -> Result<OutboxStats, StoreError> {
        let row = statements::query_one(client, &STATS, &[]).await?;
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

//! `idempotency_keys`: the reusable Idempotency-Key layer for any mutating endpoint.
//!
//! One request is one transaction: [`IdempotencyStore::run`] reserves `(key, endpoint)`
//! (a transaction-scoped advisory lock), lets the operation write its rows on the same
//! transaction, inserts the key's row with the response it produced and commits. Either
//! all of it is committed or none of it. The row is written once, already `COMPLETED`:
//! the API never writes a `STARTED` row, which is kept for rows written by hand or by a
//! future multi-phase endpoint (docs/design.md).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use deadpool_postgres::{Pool, Transaction};
use tokio_postgres::Row;

use pg_plumbing::StoreError;
use pg_plumbing::statements::{self, Connection, Sql, Type};

use crate::replay_cache::ReplayCache;
use crate::{Fingerprint, IdempotencyKey};

/// A response as it will be replayed: status, the headers that belong to the resource
/// (for example `Location`) and the body, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// What an endpoint does once its key is reserved.
///
/// `execute` runs inside the request's transaction and must only write to the database
/// through `tx`: no broker, no HTTP call (that is the outbox relay's job). It ends by
/// handing its response to `completion`, which stores it on the key: the only way to
/// get the [`CompletedKey`] it returns. Returning `Err` rolls everything back, key
/// included, so the request is forgotten and the client may retry with the same key; a
/// business refusal that must be remembered is a completed 4xx response instead.
// actix-web handlers run on a single-threaded runtime and do not need `Send` futures.
#[allow(async_fn_in_trait)]
pub trait IdempotentOperation {
    type Error: From<StoreError>;

    /// What identifies "the same request" for this endpoint.
    fn fingerprint(&self) -> Fingerprint;

    /// `now` is the transaction's timestamp, for rows and responses alike.
    async fn execute(
        &self,
        tx: &Transaction<'_>,
        now: DateTime<Utc>,
        completion: KeyCompletion<'_>,
    ) -> Result<CompletedKey, Self::Error>;
}

/// An operation the database runs whole in one statement, key included: a function of
/// the schema that claims the key with this crate's SQL function `idempotency_key_claim`
/// (the lock and read of [`RESERVE`], the completed row of [`COMPLETE`]), does its own
/// writes when the claim's outcome is `executed`, and returns the claim's row, in
/// autocommit. One round trip and no plan to make per request, prepared or not, which is
/// what keeps a transaction pooler's path as fast as the direct one.
///
/// [`IdempotencyStore::run_one_statement`] runs it with the same replay cache, retry
/// and outcomes as [`IdempotencyStore::run`].
#[allow(async_fn_in_trait)]
pub trait OneStatementOperation {
    /// What identifies "the same request" for this endpoint.
    fn fingerprint(&self) -> Fingerprint;

    /// The response the statement stores when it runs the operation.
    fn response(&self) -> &StoredResponse;

    /// Runs the statement for `key`; its one row has [`RESERVE`]'s columns and
    /// `outcome`: `executed` (everything written, the key completed with
    /// [`Self::response`]), `taken` (the key's row was taken after it was read; nothing
    /// written) or `found` (nothing written; the row as read decides). A `found` row must
    /// be on the synchronous standbys before the statement returns, as
    /// [`AWAIT_STANDBYS`] makes it in the transaction path.
    async fn call(
        &self,
        client: &deadpool_postgres::Client,
        key: &KeyToComplete<'_>,
    ) -> Result<Row, StoreError>;
}

/// The key a request reserves and completes, and for how long.
pub struct KeyToComplete<'a> {
    pub key: &'a str,
    pub endpoint: &'a str,
    pub fingerprint: &'a Fingerprint,
    pub ttl_ms: i64,
}

/// The reserved key's last write: its row with the replayable response
/// (`IdempotencyKeyComplete`). Consumed by value, so an operation completes its key
/// exactly once.
pub struct KeyCompletion<'a> {
    tx: &'a Transaction<'a>,
    key: &'a KeyToComplete<'a>,
}

/// Proof that the key's row was written in the request's transaction; the store commits
/// only with one. Opaque to operations: they hand it back to the store as they got it.
pub struct CompletedKey(Completion);

enum Completion {
    Stored(StoredResponse),
    /// The key's row was committed by someone else before this request's lock was
    /// granted (see [`RESERVE`]): nothing of this transaction may be committed.
    Taken,
}

impl KeyCompletion<'_> {
    /// Stores `response` after everything the operation wrote.
    pub async fn store(self, response: StoredResponse) -> Result<CompletedKey, StoreError> {
        let stored = self.complete(&response).await?;
        Ok(CompletedKey::new(stored, response))
    }

    /// Stores `response` while `writes` run: an operation whose response is known
    /// before its writes return sends them and the completion in one round trip
    /// (tokio-postgres pipelines concurrent statements on one connection). They share
    /// the transaction, so a failed write rolls the completion back with it; the
    /// writes' error is the one reported.
    pub async fn store_with<E: From<StoreError>>(
        self,
        writes: impl Future<Output = Result<(), E>>,
        response: StoredResponse,
    ) -> Result<CompletedKey, E> {
        let (written, stored) = futures::join!(writes, self.complete(&response));
        written?;
        Ok(CompletedKey::new(stored?, response))
    }

    /// Whether the row was written (false: someone else's committed row holds the key).
    async fn complete(&self, response: &StoredResponse) -> Result<bool, StoreError> {
        let headers = encode_headers(&response.headers);
        let written = statements::execute(
            self.tx,
            &COMPLETE,
            &[
                &self.key.key,
                &self.key.endpoint,
                &self.key.fingerprint.as_str(),
                &i32::from(response.status),
                &headers,
                &response.body,
                &self.key.ttl_ms,
            ],
        )
        .await?;
        Ok(written == 1)
    }
}

impl CompletedKey {
    fn new(stored: bool, response: StoredResponse) -> Self {
        CompletedKey(if stored {
            Completion::Stored(response)
        } else {
            Completion::Taken
        })
    }
}

/// How a request with an `Idempotency-Key` ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotentOutcome {
    /// First time for this key: the operation ran and its response is now stored.
    Executed(StoredResponse),
    /// The key was completed earlier with the same fingerprint: the stored response.
    Replayed(StoredResponse),
    /// Another request holds the key right now.
    InFlight,
    /// The key was used earlier for a request with a different fingerprint.
    PayloadConflict,
}

impl IdempotentOutcome {
    /// A label for logs and metrics (never the key itself).
    pub fn as_str(&self) -> &'static str {
        match self {
            IdempotentOutcome::Executed(_) => "created",
            IdempotentOutcome::Replayed(_) => "replayed",
            IdempotentOutcome::InFlight => "in_flight",
            IdempotentOutcome::PayloadConflict => "payload_conflict",
        }
    }
}

/// Reserves keys, replays completed ones and expires them after `ttl`. Completed keys
/// are also remembered in process (see `replay_cache`), so most replays skip the
/// database.
pub struct IdempotencyStore {
    ttl: Duration,
    cache: ReplayCache,
}

/// Transactions one request may take: a second one follows only a lost race.
const ATTEMPTS: usize = 2;

/// Completed keys remembered in process by default.
pub const DEFAULT_REPLAY_CACHE_ENTRIES: usize = 10_000;

/// `IdempotencyKeyReserve`: one round trip that decides the request's fate, writing
/// nothing.
///
/// The loser of a race never waits for the winner. `pg_try_advisory_xact_lock` on a
/// hash of `(endpoint, key)` answers at once; whoever fails it rolls back with the
/// completed, unexpired row it read replayed (the holder is then another retry), or
/// else with `InFlight`. Whoever gets it is the only writer of that `(key, endpoint)`
/// until it commits or rolls back: it runs the operation when the key has no row or an
/// expired one (an expired key is a new key), and otherwise answers from the row. A
/// committed `STARTED` row is never overwritten, whatever its age (docs/design.md).
///
/// Under READ COMMITTED the statement's snapshot is taken before the lock is granted,
/// so the previous holder may have committed the row in between, unseen by the join.
/// [`COMPLETE`] finds it then, and the request starts over (found by `make soak`).
pub const RESERVE: Sql = Sql::new(
    "
WITH lock AS (
    SELECT pg_try_advisory_xact_lock(hashtextextended($2 || ' ' || $1, 0)) AS acquired,
           now() AS now
)
SELECT lock.acquired,
       lock.now,
       existing.request_hash,
       existing.status,
       existing.response_status,
       existing.response_headers,
       existing.response_body,
       existing.expires_at
  FROM lock
  LEFT JOIN idempotency_keys existing ON existing.key = $1 AND existing.endpoint = $2",
    &[Type::TEXT, Type::TEXT],
);

/// `IdempotencyKeyComplete`: the key's row, `COMPLETED` with the replayable response,
/// written once after the operation's writes. Inserting it whole, rather than a
/// `STARTED` row first and the response later, leaves no dead row version behind: a
/// page of keys is written once and stays full, so new keys go to new pages instead
/// of every old page that vacuum found room on (docs/benchmarks.md, "As the tables
/// grow"). An expired row is overwritten; any other row means the key was taken after
/// RESERVE's snapshot, and nothing is written (0 rows). The SQL functions
/// `idempotency_key_complete` and `idempotency_key_claim`, which one-statement
/// operations compose, write the same row; they are not called here so that a build
/// still completes keys on a schema whose migrations have not reached them yet (an
/// upgrade's first minutes).
pub const COMPLETE: Sql = Sql::new(
    "
INSERT INTO idempotency_keys AS k (key, endpoint, request_hash, status, response_status,
                                   response_headers, response_body, created_at, expires_at)
VALUES ($1, $2, $3, 'COMPLETED', $4, $5, $6, now(), now() + $7::bigint * interval '1 millisecond')
ON CONFLICT (key, endpoint) DO UPDATE
   SET request_hash = EXCLUDED.request_hash,
       status = EXCLUDED.status,
       response_status = EXCLUDED.response_status,
       response_headers = EXCLUDED.response_headers,
       response_body = EXCLUDED.response_body,
       created_at = EXCLUDED.created_at,
       expires_at = EXCLUDED.expires_at
 WHERE k.status = 'COMPLETED' AND k.expires_at <= now()",
    &[
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::INT4,
        Type::JSONB,
        Type::TEXT,
        Type::INT8,
    ],
);

/// `IdempotencyKeyAwaitStandbys`: run before answering from a key's row in the
/// transaction path (a replay, a payload conflict): returns once the synchronous
/// standbys have the row (`idempotency_await_standbys`; at once without a
/// synchronous standby). A commit whose own wait for the standbys was cancelled stays
/// visible on the primary: answering from it unconfirmed would acknowledge an operation
/// a failover loses. The statement's timeout or a cancel ends the wait as a 503. The
/// one-statement path does the same inside its function.
pub const AWAIT_STANDBYS: Sql = Sql::new("SELECT idempotency_await_standbys()", &[]);

// Reconciliation and retention: never on the request path.

/// `IdempotencyKeyCountStartedOlderThan`: committed `STARTED` rows, which the
/// one-transaction design never leaves behind (see the module documentation).
const COUNT_STARTED_OLDER_THAN: Sql = Sql::new(
    "
SELECT count(*) AS started FROM idempotency_keys
 WHERE status = 'STARTED' AND created_at < now() - $1::bigint * interval '1 millisecond'",
    &[Type::INT8],
);

/// `IdempotencyKeyPurgeExpired` (the `purge_expired_keys` job): a small batch of expired `COMPLETED` rows, oldest
/// expiry first (matches `idempotency_keys_expires_idx`). `STARTED` rows are never
/// matched, whatever their age: they are alerted on and inspected by hand. A row a
/// request is overwriting right now is locked by it and skipped.
///
/// The batch is deleted by `ctid` (a TID scan of exactly those rows, safe because the
/// same statement holds their row locks). Joined on `(key, endpoint)` instead, the
/// planner may hash-join the batch against every expired row: `make soak` caught that
/// plan scanning 255 000 rows per batch of 1 000 until the statement timed out and the
/// table grew without bound.
pub const PURGE_EXPIRED: Sql = Sql::new(
    "
DELETE FROM idempotency_keys
 WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM idempotency_keys
         WHERE status = 'COMPLETED' AND expires_at <= now()
         ORDER BY expires_at
         LIMIT $1
           FOR UPDATE SKIP LOCKED))
   AND status = 'COMPLETED'
   AND expires_at <= now()",
    &[Type::INT8],
);

enum Reservation {
    Reserved {
        now: DateTime<Utc>,
    },
    Decided(IdempotentOutcome),
    /// A completed key with the same fingerprint, and how long it has left.
    Completed(StoredResponse, Duration),
}

impl IdempotencyStore {
    pub fn new(ttl: Duration) -> Self {
        Self::with_replay_cache(ttl, DEFAULT_REPLAY_CACHE_ENTRIES)
    }

    /// `cache_entries` completed keys are remembered in process; 0 turns that off.
    pub fn with_replay_cache(ttl: Duration, cache_entries: usize) -> Self {
        IdempotencyStore {
            ttl,
            cache: ReplayCache::new(cache_entries),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Runs `operation` at most once per `(key, endpoint)` within the TTL.
    pub async fn run<Op: IdempotentOperation>(
        &self,
        pool: &Pool,
        key: &IdempotencyKey,
        endpoint: &str,
        operation: &Op,
    ) -> Result<IdempotentOutcome, Op::Error> {
        let key = key.to_string();
        let fingerprint = operation.fingerprint();
        if let Some(outcome) = self.cached(&key, endpoint, &fingerprint) {
            return Ok(outcome);
        }
        let mut client = pool.get().await.map_err(StoreError::from)?;
        let request = self.key_to_complete(&key, endpoint, &fingerprint);
        // A lost race ends in a rolled-back attempt; the next one's snapshot sees the
        // row that won, so a second attempt is the last unless the row went again.
        for _ in 0..ATTEMPTS {
            if let Some(outcome) = self.attempt(&mut client, &request, operation).await? {
                return Ok(outcome);
            }
        }
        Ok(IdempotentOutcome::InFlight)
    }

    /// Runs `operation` at most once per `(key, endpoint)` within the TTL, as [`Self::run`]
    /// does, in one statement per attempt.
    pub async fn run_one_statement<Op: OneStatementOperation>(
        &self,
        pool: &Pool,
        key: &IdempotencyKey,
        endpoint: &str,
        operation: &Op,
    ) -> Result<IdempotentOutcome, StoreError> {
        let key = key.to_string();
        let fingerprint = operation.fingerprint();
        if let Some(outcome) = self.cached(&key, endpoint, &fingerprint) {
            return Ok(outcome);
        }
        let client = pool.get().await?;
        let request = self.key_to_complete(&key, endpoint, &fingerprint);
        for _ in 0..ATTEMPTS {
            // Before the statement, whose time `expires_at` is computed from (see
            // `attempt`).
            let observed_at = Instant::now();
            let row = operation.call(&client, &request).await?;
            let (outcome, remaining) = match row.try_get::<_, &str>("outcome")? {
                "executed" => (
                    IdempotentOutcome::Executed(operation.response().clone()),
                    self.ttl,
                ),
                "taken" => continue,
                "found" => match decide(&row, &fingerprint)? {
                    Reservation::Decided(outcome) => return Ok(outcome),
                    Reservation::Completed(response, remaining) => {
                        (IdempotentOutcome::Replayed(response), remaining)
                    }
                    Reservation::Reserved { .. } => {
                        return Err(StoreError::Invariant(
                            "the statement found the key free and ran nothing".to_owned(),
                        ));
                    }
                },
                other => {
                    return Err(StoreError::Invariant(format!(
                        "the statement answered the unknown outcome {other:?}"
                    )));
                }
            };
            self.remember(&request, &outcome, observed_at, remaining);
            return Ok(outcome);
        }
        Ok(IdempotentOutcome::InFlight)
    }

    /// The outcome the replay cache knows for this key, if any.
    fn cached(
        &self,
        key: &str,
        endpoint: &str,
        fingerprint: &Fingerprint,
    ) -> Option<IdempotentOutcome> {
        let hit = self.cache.get(key, endpoint)?;
        Some(if hit.fingerprint == *fingerprint {
            IdempotentOutcome::Replayed(hit.response.clone())
        } else {
            IdempotentOutcome::PayloadConflict
        })
    }

    /// Remembers a stored response in process for `remaining`, from `observed_at`.
    fn remember(
        &self,
        key: &KeyToComplete<'_>,
        outcome: &IdempotentOutcome,
        observed_at: Instant,
        remaining: Duration,
    ) {
        if let IdempotentOutcome::Executed(stored) | IdempotentOutcome::Replayed(stored) = outcome {
            self.cache.insert(
                key.key.to_owned(),
                key.endpoint.to_owned(),
                key.fingerprint.clone(),
                stored.clone(),
                observed_at,
                remaining,
            );
        }
    }

    /// One transaction; `None` when the key was taken under it and nothing committed.
    async fn attempt<Op: IdempotentOperation>(
        &self,
        client: &mut deadpool_postgres::Client,
        request: &KeyToComplete<'_>,
        operation: &Op,
    ) -> Result<Option<IdempotentOutcome>, Op::Error> {
        // Taken before BEGIN, whose time is the `now()` that `expires_at` is computed
        // from: the cache's deadline can only fall before the row's expiry, never after.
        let observed_at = Instant::now();
        let tx = client.transaction().await.map_err(StoreError::from)?;
        let (response, remaining) = match self.reserve(&tx, request).await? {
            Reservation::Reserved { now } => {
                let completion = KeyCompletion {
                    tx: &tx,
                    key: request,
                };
                let CompletedKey(completion) = operation.execute(&tx, now, completion).await?;
                // Taken: dropping `tx` rolls the operation's writes back.
                let Completion::Stored(response) = completion else {
                    return Ok(None);
                };
                tx.commit().await.map_err(StoreError::from)?;
                (IdempotentOutcome::Executed(response), self.ttl)
            }
            Reservation::Decided(IdempotentOutcome::PayloadConflict) => {
                await_standbys(tx).await?;
                return Ok(Some(IdempotentOutcome::PayloadConflict));
            }
            // Nothing was read that needs confirming; dropping `tx` rolls back and
            // releases the lock.
            Reservation::Decided(outcome) => return Ok(Some(outcome)),
            Reservation::Completed(response, remaining) => {
                await_standbys(tx).await?;
                (IdempotentOutcome::Replayed(response), remaining)
            }
        };
        self.remember(request, &response, observed_at, remaining);
        Ok(Some(response))
    }

    fn key_to_complete<'a>(
        &self,
        key: &'a str,
        endpoint: &'a str,
        fingerprint: &'a Fingerprint,
    ) -> KeyToComplete<'a> {
        KeyToComplete {
            key,
            endpoint,
            fingerprint,
            ttl_ms: i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX),
        }
    }

    /// Committed `STARTED` keys older than `age` (reconciliation).
    pub async fn count_started_older_than(
        client: &impl Connection,
        age: Duration,
    ) -> Result<i64, StoreError> {
        let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        Ok(
            statements::query_one(client, &COUNT_STARTED_OLDER_THAN, &[&age_ms])
                .await?
                .try_get("started")?,
        )
    }

    /// Deletes up to `limit` expired `COMPLETED` keys; returns how many.
    pub async fn purge_expired(client: &impl Connection, limit: i64) -> Result<u64, StoreError> {
        statements::execute(client, &PURGE_EXPIRED, &[&limit]).await
    }

    async fn reserve(
        &self,
        tx: &Transaction<'_>,
        request: &KeyToComplete<'_>,
    ) -> Result<Reservation, StoreError> {
        let row = statements::query_one(tx, &RESERVE, &[&request.key, &request.endpoint]).await?;
        decide(&row, request.fingerprint)
    }
}

/// Ends a transaction that answers from a key's row, once the synchronous standbys have
/// that row ([`AWAIT_STANDBYS`]; when their positions cannot be read, its commit is what
/// waits, and a cancelled wait fails it through `unreplicated_commit`).
async fn await_standbys(tx: Transaction<'_>) -> Result<(), StoreError> {
    statements::execute(&tx, &AWAIT_STANDBYS, &[]).await?;
    tx.commit().await?;
    Ok(())
}

/// What a request may do, from the lock's answer and the key's row as [`RESERVE`] (or a
/// [`OneStatementOperation`]) read them.
fn decide(row: &Row, fingerprint: &Fingerprint) -> Result<Reservation, StoreError> {
    let acquired = row.try_get::<_, bool>("acquired")?;
    let status = row.try_get::<_, Option<&str>>("status")?;
    let free = status.is_none() || expired_completion(row)?;
    if acquired && free {
        return Ok(Reservation::Reserved {
            now: row.try_get("now")?,
        });
    }
    // Another request for this key holds its lock: one writing it, or one more retry
    // of a request that already finished. A completed row within its TTL is final
    // whatever the holder does (only an expired one is written again), so it is
    // answered now rather than sent back as in flight.
    if !acquired && (free || status == Some("STARTED")) {
        return Ok(Reservation::Decided(IdempotentOutcome::InFlight));
    }
    stored_outcome(row, fingerprint)
}

/// Whether RESERVE found a `COMPLETED` row that has expired at the statement's time: the
/// key is free again.
fn expired_completion(row: &Row) -> Result<bool, StoreError> {
    let completed = row.try_get::<_, Option<&str>>("status")? == Some("COMPLETED");
    let now: DateTime<Utc> = row.try_get("now")?;
    let expires_at: Option<DateTime<Utc>> = row.try_get("expires_at")?;
    Ok(completed && expires_at.is_some_and(|at| at <= now))
}

/// What a request gets from the row RESERVE found for its key, when it reserved nothing.
fn stored_outcome(row: &Row, fingerprint: &Fingerprint) -> Result<Reservation, StoreError> {
    let Some(stored_hash) = row.try_get::<_, Option<String>>("request_hash")? else {
        // No row: the caller decides those before asking.
        return Ok(Reservation::Decided(IdempotentOutcome::InFlight));
    };
    if stored_hash != fingerprint.as_str() {
        return Ok(Reservation::Decided(IdempotentOutcome::PayloadConflict));
    }
    let status: String = row.try_get("status")?;
    if status != "COMPLETED" {
        return Ok(Reservation::Decided(IdempotentOutcome::InFlight));
    }
    let response = StoredResponse {
        status: u16::try_from(row.try_get::<_, i32>("response_status")?).map_err(|e| {
            StoreError::Decode {
                column: "response_status",
                reason: e.to_string(),
            }
        })?,
        headers: decode_headers(row.try_get("response_headers")?)?,
        body: row.try_get("response_body")?,
    };
    let now: DateTime<Utc> = row.try_get("now")?;
    let expires_at: DateTime<Utc> = row.try_get("expires_at")?;
    let remaining = (expires_at - now).to_std().unwrap_or(Duration::ZERO);
    Ok(Reservation::Completed(response, remaining))
}

/// A response's headers as the `response_headers` column stores them (a JSON array of
/// `[name, value]` pairs), for one-statement operations that write the key themselves.
pub fn encode_headers(headers: &[(String, String)]) -> serde_json::Value {
    serde_json::Value::Array(
        headers
            .iter()
            .map(|(name, value)| serde_json::json!([name, value]))
            .collect(),
    )
}

fn decode_headers(value: serde_json::Value) -> Result<Vec<(String, String)>, StoreError> {
    serde_json::from_value(value).map_err(|e| StoreError::Decode {
        column: "response_headers",
        reason: e.to_string(),
    })
}

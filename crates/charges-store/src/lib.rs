//! Everything SQL: the Postgres pool, the embedded migrations, and one store per table.
//!
//! # Conventions
//!
//! - **One module per table** (`idempotency_keys`, `charges`, `refunds`, `outbox`,
//!   `outbox_wakeup`, `reconciliation_result`),
//!   holding every statement that touches that table; the schema itself lives in the
//!   workspace's top-level `migrations/`, embedded by refinery. `claim_transaction`
//!   holds no SQL of its own: it runs the relay's `outbox` statements pipelined with
//!   `BEGIN` and `COMMIT`.
//! - **Statements are constants** at the top of their module, each documented with a
//!   `TableVerb[Many]` name (`OutboxClaimPending`, `IdempotencyKeyPurgeExpired`), and
//!   shaped for production only: `make bench` reads the same constants and follows
//!   them, never the reverse.
//! - **One store type per table** (`OutboxStore`, `ChargeStore`, …) with one `impl`
//!   block. Its functions take `&impl Connection`: the caller owns the connection
//!   or transaction, so one request's statements share one transaction. The relay's
//!   statements take a prepared [`outbox::ClaimStatements`] instead of preparing
//!   their own, so that they can be pipelined (see `ClaimTransaction`).
//!   `IdempotencyStore` also carries the request path's state (TTL, replay cache).
//! - Statements are [`Sql`] constants, text and parameter types together, run through
//!   [`statements`]: prepared once per connection directly, sent unnamed through a
//!   transaction pooler; parameters are always bound, never formatted into SQL text.
//! - **Columns are read by name** (`row.try_get("column")`), never by position, and
//!   never with a panicking getter; computed columns get an `AS name`.
//! - Every failure is a [`StoreError`]; [`StoreError::is_unavailable`] is the one
//!   place that decides whether a caller may retry.

pub mod charges;
pub mod migrations;
mod reconciliation_result;
pub mod refunds;

pub use charges::{ChargeStore, NewCharge, RefundableCharge};
pub use pg_idempotency::store as idempotency_keys;
pub use pg_idempotency::{
    CompletedKey, IdempotencyStore, IdempotentOperation, IdempotentOutcome, KeyCompletion,
    KeyToComplete, OneStatementOperation, StoredResponse,
};
pub use pg_outbox::store as outbox;
pub use pg_outbox::{
    ClaimStatements, ClaimTransaction, DeadEvent, GateStandbys, NewEvent, Origin, OutboxStats,
    OutboxStore, OutboxWakeupStore, PendingEvent, PublishFailure, ReplicationStore, StandbyFlush,
    WalPosition,
};
pub use pg_plumbing::{
    Client, Connection, DatabaseTls, GenericClient, IsolationLevel, Pool, PoolSettings, Pooler,
    Row, Sql, StoreError, Transaction, connect, detect_dead_peers, statements,
};
pub use reconciliation_result::{
    ReconciliationClaim, ReconciliationCounts, ReconciliationResultStore,
};
pub use refunds::RefundStore;

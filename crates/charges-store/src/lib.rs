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
mod claim_transaction;
mod error;
pub mod idempotency_keys;
pub mod migrations;
pub mod outbox;
mod outbox_wakeup;
mod pool;
mod reconciliation_result;
pub mod refunds;
mod replay_cache;
mod replication;
pub mod statements;
mod tls;
mod unreplicated_commit;

pub use charges::{ChargeStore, NewCharge, RefundableCharge};
pub use claim_transaction::ClaimTransaction;
pub use deadpool_postgres::{Client, GenericClient, Pool, Transaction};
pub use error::{POOL_TIMEOUTS_METRIC, StoreError};
pub use idempotency_keys::{
    CompletedKey, IdempotencyStore, IdempotentOperation, IdempotentOutcome, KeyCompletion,
    KeyToComplete, OneStatementOperation, StoredResponse,
};
pub use outbox::{
    ClaimStatements, DeadEvent, NewEvent, Origin, OutboxStats, OutboxStore, PendingEvent,
    PublishFailure,
};
pub use outbox_wakeup::OutboxWakeupStore;
pub use pool::{PoolSettings, connect, detect_dead_peers};
pub use reconciliation_result::{
    ReconciliationClaim, ReconciliationCounts, ReconciliationResultStore,
};
pub use refunds::RefundStore;
pub use replication::{GateStandbys, ReplicationStore, StandbyFlush, WalPosition};
pub use statements::{Connection, Pooler, Sql};
pub use tls::DatabaseTls;
pub use tokio_postgres::IsolationLevel;
pub use tokio_postgres::Row;
pub use unreplicated_commit::UNREPLICATED_COMMITS_METRIC;

//! The charges service's SQL, on top of the building blocks.
//!
//! - [`ChargeStore`] and [`RefundStore`]: every statement on `charges` and `refunds`.
//!   [`ChargeStore::create_once`] is the whole of `POST /charges` in one statement:
//!   `charges_create_idempotent` composes pg-idempotency's `idempotency_key_claim` with
//!   pg-outbox's `outbox_append`, so that a new charge costs one round trip and no plan
//!   per request.
//! - [`ReconciliationResultStore`]: the latest reconciliation, one row that one relay
//!   writes and every relay exports.
//! - [`migrations`]: the schema sets in the order they are applied (the pre-split
//!   history, idempotency, outbox, charges), their status for `/readyz`, and the grants.
//! - Re-exports of the `pg_plumbing`, `pg_idempotency` and `pg_outbox` types the charges
//!   binaries use, and those crates' statement modules as [`idempotency_keys`] and
//!   [`outbox`], so that a charges binary names one crate for its database.
//!
//! # Conventions
//!
//! - **Statements are [`Sql`] constants** at the top of their module, each documented
//!   with a `TableVerb[Many]` name (`ChargeInsert`, `RefundListForCharge`) that
//!   `deploy/sql/grants.sql` cites. Parameters are always bound, never formatted into
//!   SQL text. Statements are shaped for production only: `make bench` reads the same
//!   constants and follows them, never the reverse.
//! - **One store type per table**, whose functions take `&impl Connection`: the caller
//!   owns the connection or transaction, so one request's statements share one
//!   transaction.
//! - **Columns are read by name** (`row.try_get("column")`), never by position, and
//!   never with a panicking getter; computed columns get an `AS name`.
//! - Every failure is a [`StoreError`]; [`StoreError::is_unavailable`] is the one place
//!   that decides whether a caller may retry.

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

//! Everything SQL. One module per table (`idempotency_keys`, `charges`, `refunds`, `outbox`),
//! each holding every statement that touches its table; the schema itself lives in
//! the workspace's top-level `migrations/`, embedded here by refinery.

pub mod charges;
mod error;
pub mod idempotency_keys;
pub mod migrations;
pub mod outbox;
mod pool;
pub mod refunds;
mod replay_cache;
mod tls;

pub use charges::{ChargeStore, RefundableCharge};
pub use deadpool_postgres::{GenericClient, Pool, Transaction};
pub use error::StoreError;
pub use idempotency_keys::{
    IdempotencyStore, IdempotentOperation, IdempotentOutcome, StoredResponse,
};
pub use outbox::{DeadEvent, OutboxStats, OutboxStore, PendingEvent, PublishFailure};
pub use pool::{PoolSettings, connect};
pub use refunds::RefundStore;
pub use tls::DatabaseTls;
pub use tokio_postgres::IsolationLevel;

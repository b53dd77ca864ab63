#![doc = include_str!("../README.md")]

mod error;
mod metric_names;
pub mod migrations;
mod pool;
pub mod statements;
mod tls;
mod unreplicated_commit;

pub use deadpool_postgres::{Client, GenericClient, Pool, Transaction};
pub use error::{StoreError, error_chain};
pub use metric_names::{DEFAULT_NAMESPACE, MetricNames, metric_names, namespace, set_namespace};
pub use migrations::{SchemaSet, SchemaStatus};
pub use pool::{PoolSettings, connect, detect_dead_peers};
pub use statements::{Connection, Pooler, Sql};
pub use tls::DatabaseTls;
pub use tokio_postgres::{IsolationLevel, Row};

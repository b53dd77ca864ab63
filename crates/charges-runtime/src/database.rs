//! The database flags every binary takes, and the pool they describe.

use std::path::PathBuf;

use charges_store::{DatabaseTls, PoolSettings, Pooler};

use crate::secrets::SecretString;

/// `--database-url` and `--database-ca-file`, accepted before or after a subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseArgs {
    /// Postgres connection URL. Never logged.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test",
        hide_env_values = true,
        global = true
    )]
    pub database_url: SecretString,
    /// PEM file of the certificate authorities the database server must chain to when the
    /// URL says sslmode=require (default: the system's roots). With sslmode=require the
    /// server's certificate and host name are always verified; prefer and disable are plain text.
    #[arg(long, env = "DATABASE_CA_FILE", global = true)]
    pub database_ca_file: Option<PathBuf>,
    /// What --database-url points at. `none`: Postgres itself (or a pooler in session
    /// mode); statements are prepared once per connection and the timeouts travel with
    /// the connection. `transaction`: a pooler in transaction mode (PgBouncer's
    /// pool_mode = transaction, …): statements go unnamed, the server's role must carry
    /// the statement and idle-in-transaction timeouts (checked at start), and migrations
    /// and the relay's LISTEN need Postgres's own URL. `transaction-prepared`: the same,
    /// through a pooler that keeps protocol-level prepared statements (PgBouncer >= 1.21
    /// with max_prepared_statements > 0): statements are prepared as with `none`.
    #[arg(
        long,
        env = "DB_POOLER",
        value_enum,
        default_value = "none",
        global = true
    )]
    pub db_pooler: DbPooler,
}

/// `--db-pooler`: what sits between a binary and Postgres.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DbPooler {
    /// Postgres itself, or a pooler in session mode.
    None,
    /// A pooler in transaction mode.
    Transaction,
    /// A pooler in transaction mode that keeps prepared statements.
    TransactionPrepared,
}

impl From<DbPooler> for Pooler {
    fn from(pooler: DbPooler) -> Pooler {
        match pooler {
            DbPooler::None => Pooler::None,
            DbPooler::Transaction => Pooler::Transaction,
            DbPooler::TransactionPrepared => Pooler::TransactionPrepared,
        }
    }
}

impl DatabaseArgs {
    pub fn tls(&self) -> DatabaseTls {
        DatabaseTls::new(self.database_ca_file.clone())
    }

    /// The default pool settings with this TLS configuration, `max_size` connections
    /// and `application_name` (shown in `pg_stat_activity`).
    pub fn pool_settings(&self, application_name: &str, max_size: usize) -> PoolSettings {
        PoolSettings {
            max_size,
            application_name: application_name.to_owned(),
            tls: self.tls(),
            pooler: self.db_pooler.into(),
            ..PoolSettings::default()
        }
    }
}

//! One classification of storage failures for every binary.
//!
//! [`StoreError::is_unavailable`] answers the only question callers ask of a storage
//! failure: will the same request work if it is sent again later? Yes only when the
//! database could not be reached or the connection broke (pool timeouts, closed
//! connections, socket errors, the server shutting down or refusing connections,
//! cancelled or serialization-failed statements): the API answers those `503` with
//! `Retry-After`, the relay and the consumer retry them. Everything else — a
//! constraint violation, a column of the wrong type, a statement that returned no
//! row, bad stored data — is a bug or a broken schema that a retry repeats: `500`, and
//! no invitation to retry.

use std::io::ErrorKind;

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no database connection could be obtained")]
    Pool(#[source] deadpool_postgres::PoolError),
    #[error("database statement failed")]
    Database(#[from] tokio_postgres::Error),
    #[error("applying migrations failed")]
    Migration(#[from] refinery::Error),
    #[error("the database pool could not be configured")]
    PoolConfig(#[from] deadpool_postgres::BuildError),
    #[error("invalid database URL")]
    DatabaseUrl(#[source] tokio_postgres::Error),
    /// A stored value that the code cannot read back (a column holding what no
    /// version of this code writes).
    #[error("stored {column} could not be decoded: {reason}")]
    Decode {
        column: &'static str,
        reason: String,
    },
    /// A statement did something the schema and the locks it holds rule out.
    #[error("invariant violated: {0}")]
    Invariant(String),
    #[error("{0:?} is not a plain lower-case role name")]
    InvalidRole(String),
    #[error("TLS to the database could not be set up")]
    Tls(#[from] openssl::error::ErrorStack),
    #[error("the database CA file {0} could not be loaded")]
    TlsCaFile(std::path::PathBuf, #[source] openssl::error::ErrorStack),
    /// A second pool asked for another statement mode than the process's first one.
    #[error("this process already talks to Postgres another way than --db-pooler {}", .0.as_str())]
    PoolerMismatch(crate::Pooler),
    /// A pooler in transaction mode leaves a server unbounded: its role or database has
    /// no timeout of its own, and the connection's cannot pass the pooler.
    #[error(
        "through a transaction pooler the server must bound every statement and idle transaction itself: {0}"
    )]
    UnboundedThroughPooler(String),
    /// The server (a pooler, in fact) refused the connection's `options` startup
    /// parameter, which carries the timeouts on a direct connection.
    #[error(
        "the server refused this connection's startup options, as PgBouncer and other \
         transaction poolers do: behind one, set --db-pooler transaction (migrations need \
         Postgres's own URL)"
    )]
    StartupOptionsRefused(#[source] tokio_postgres::Error),
    /// Work that needs one server session for its whole length, sent through a
    /// transaction pooler.
    #[error(
        "{0} needs a session of its own: give it Postgres's own URL, not the pooler's (--db-pooler none)"
    )]
    NeedsSession(&'static str),
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        if matches!(error, deadpool_postgres::PoolError::Timeout(_)) {
            metrics::counter!(crate::metric_names().pool_timeouts).increment(1);
        }
        StoreError::Pool(error)
    }
}

/// SQLSTATEs that mean "try again later", not "this request is wrong".
const TRANSIENT_SQLSTATES: &[&str] = &[
    "57014", // query_canceled: statement_timeout fired
    "57P01", // admin_shutdown
    "57P02", // crash_shutdown
    "57P03", // cannot_connect_now
    "53300", // too_many_connections
    "40001", // serialization_failure
    "40P01", // deadlock_detected
    "55P03", // lock_not_available
];

impl StoreError {
    /// The database could not be reached or the connection broke: the same request
    /// may work later. See the module documentation.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Pool(error) => pool_unavailable(error),
            StoreError::Database(error) => database_unavailable(error),
            StoreError::Migration(_)
            | StoreError::PoolConfig(_)
            | StoreError::DatabaseUrl(_)
            | StoreError::Decode { .. }
            | StoreError::Invariant(_)
            | StoreError::InvalidRole(_)
            | StoreError::Tls(_)
            | StoreError::TlsCaFile(..)
            | StoreError::PoolerMismatch(_)
            | StoreError::UnboundedThroughPooler(_)
            | StoreError::StartupOptionsRefused(_)
            | StoreError::NeedsSession(_) => false,
        }
    }
}

fn pool_unavailable(error: &deadpool_postgres::PoolError) -> bool {
    use deadpool_postgres::PoolError;
    match error {
        // Waiting for a free connection, connecting or recycling took too long, or the
        // pool is shutting down.
        PoolError::Timeout(_) | PoolError::Closed => true,
        // Opening a connection failed: refused, reset, the server starting or shutting
        // down, too many connections, a TLS or authentication failure. A new
        // connection is tried on the next request either way.
        PoolError::Backend(_) => true,
        PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_) => false,
    }
}

fn database_unavailable(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    if let Some(db) = error.as_db_error() {
        let code = db.code().code();
        return TRANSIENT_SQLSTATES.contains(&code) || code.starts_with("08");
    }
    // tokio-postgres keeps its error kinds private; a socket failure is told apart by
    // its cause. Decoding and encoding failures also carry an io::Error, of kind
    // InvalidData/InvalidInput: those are bugs, not outages.
    io_cause(error)
        .is_some_and(|io| !matches!(io.kind(), ErrorKind::InvalidData | ErrorKind::InvalidInput))
}

fn io_cause(error: &tokio_postgres::Error) -> Option<&std::io::Error> {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        source = cause.source();
    }
    None
}

/// An error and all its sources on one line (`error: cause: cause…`), for a log field;
/// never for a client.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

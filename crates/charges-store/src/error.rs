/// A storage failure. [`StoreError::is_unavailable`] separates "the database cannot be
/// reached right now" (worth a retry) from everything else (a bug or a broken schema).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no database connection could be obtained")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("database statement failed")]
    Database(#[from] tokio_postgres::Error),
    #[error("applying migrations failed")]
    Migration(#[from] refinery::Error),
    #[error("stored data could not be decoded: {0}")]
    Corrupt(String),
    #[error("{0:?} is not a plain lower-case role name")]
    InvalidRole(String),
    #[error("TLS to the database could not be set up")]
    Tls(#[from] openssl::error::ErrorStack),
    #[error("the database CA file {0} could not be loaded")]
    TlsCaFile(std::path::PathBuf, #[source] openssl::error::ErrorStack),
}

/// SQLSTATE classes and codes that mean "try again later", not "this request is wrong".
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
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Pool(_) => true,
            StoreError::Database(e) => {
                e.is_closed()
                    || e.code()
                        .is_some_and(|c| TRANSIENT_SQLSTATES.contains(&c.code()))
                    || e.code().is_some_and(|c| c.code().starts_with("08"))
                    || (e.code().is_none() && e.as_db_error().is_none())
            }
            StoreError::Migration(_)
            | StoreError::Corrupt(_)
            | StoreError::InvalidRole(_)
            | StoreError::Tls(_)
            | StoreError::TlsCaFile(..) => false,
        }
    }
}

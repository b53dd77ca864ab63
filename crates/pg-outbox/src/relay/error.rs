use pg_plumbing::StoreError;

/// Why a batch, or the listener's start, failed. A failed batch is logged and retried
/// by its loop; what ends the process is the binary's decision.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Every database failure, classified once ([`StoreError::is_unavailable`]).
    #[error("database operation failed")]
    Store(#[from] StoreError),
    /// The replication gate's standbys had not flushed a batch's WAL within its bound.
    #[error(
        "the replication gate's standbys have not confirmed WAL position {position} within \
         the batch's bound ({lag}); its rows stay pending"
    )]
    StandbysBehind { position: String, lag: String },
    /// The Kafka producer could not be made (a setting librdkafka refuses).
    #[error("the Kafka producer could not be created")]
    Producer(#[from] rdkafka::error::KafkaError),
}

impl From<deadpool_postgres::PoolError> for EngineError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        EngineError::Store(error.into())
    }
}

impl From<tokio_postgres::Error> for EngineError {
    fn from(error: tokio_postgres::Error) -> Self {
        EngineError::Store(error.into())
    }
}

impl EngineError {
    /// The database could not be reached: worth a retry, not an ERROR per attempt.
    pub fn is_database_unavailable(&self) -> bool {
        matches!(self, EngineError::Store(e) if e.is_unavailable())
    }

    /// Something outside the relay is down or behind (the database, the standbys): a
    /// WARN and a retry after a pause, never a sign that the relay itself is broken.
    pub fn is_outage(&self) -> bool {
        self.is_database_unavailable() || matches!(self, EngineError::StandbysBehind { .. })
    }
}

pub(crate) use pg_plumbing::error_chain;

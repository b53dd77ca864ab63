use charges_store::StoreError;

/// Everything that can stop the relay or one of its commands. A failed batch is
/// logged and retried by its loop; only start-up failures, a maintenance job or batch
/// loop that dies, and command failures end the process.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Every database failure, classified once ([`StoreError::is_unavailable`]).
    #[error("database operation failed")]
    Store(#[from] StoreError),
    #[error("creating the Kafka producer failed")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("installing the signal handler failed")]
    Signal(#[source] std::io::Error),
    #[error(transparent)]
    OpsListen(#[from] charges_runtime::ops::OpsBindError),
    #[error("installing the metrics recorder failed")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    #[error(transparent)]
    Job(#[from] charges_maintenance::JobFailed),
    #[error("a batch loop stopped: {0}")]
    BatchLoop(String),
    #[error("writing to stdout failed")]
    Output(#[source] std::io::Error),
    #[error(transparent)]
    DeadCommand(#[from] crate::commands::DeadCommandError),
    /// The replication gate's standbys had not flushed a batch's WAL within its bound.
    #[error(
        "the standbys (--wait-for-standbys) have not confirmed WAL position {position} within \
         the batch's bound ({lag}); its rows stay pending"
    )]
    StandbysBehind { position: String, lag: String },
}

impl From<deadpool_postgres::PoolError> for RelayError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        RelayError::Store(error.into())
    }
}

impl From<tokio_postgres::Error> for RelayError {
    fn from(error: tokio_postgres::Error) -> Self {
        RelayError::Store(error.into())
    }
}

impl RelayError {
    /// The database could not be reached: worth a retry, not an ERROR per attempt.
    pub fn is_database_unavailable(&self) -> bool {
        matches!(self, RelayError::Store(e) if e.is_unavailable())
    }

    /// Something outside the relay is down or behind (the database, the standbys): a
    /// WARN and a retry after a pause, never a sign that the relay itself is broken.
    pub fn is_outage(&self) -> bool {
        self.is_database_unavailable() || matches!(self, RelayError::StandbysBehind { .. })
    }
}

pub use charges_runtime::error_chain;

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
    /// The relay engine's (the listener's start): transparent, so that a database
    /// failure reads as [`RelayError::Store`]'s does.
    #[error(transparent)]
    Engine(#[from] pg_outbox::relay::EngineError),
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

pub use charges_runtime::error_chain;

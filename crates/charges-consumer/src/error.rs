/// Why the consumer stopped (or could not start).
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// Every database failure, classified once
    /// ([`charges_store::StoreError::is_unavailable`]).
    #[error("database operation failed")]
    Store(#[from] charges_store::StoreError),
    #[error("kafka")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("cannot install the signal handler")]
    Signal(#[source] std::io::Error),
    #[error("encoding a parked message's headers failed")]
    Encode(#[source] serde_json::Error),
    #[error("topic {0} does not exist (or has no partitions)")]
    NoSuchTopic(String),
    #[error("cannot write to stdout")]
    Output(#[source] std::io::Error),
    #[error(transparent)]
    OpsListen(#[from] charges_runtime::ops::OpsBindError),
    #[error("installing the metrics recorder failed")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
}

impl From<deadpool_postgres::PoolError> for ConsumerError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        ConsumerError::Store(error.into())
    }
}

impl From<tokio_postgres::Error> for ConsumerError {
    fn from(error: tokio_postgres::Error) -> Self {
        ConsumerError::Store(error.into())
    }
}

pub use charges_runtime::error_chain;

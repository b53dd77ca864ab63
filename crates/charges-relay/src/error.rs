use charges_store::StoreError;

/// Everything that can stop the relay or one of its commands. A failed batch is
/// logged and retried by the loop; only start-up failures end the process.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("database operation failed")]
    Store(#[from] StoreError),
    #[error("no database connection could be obtained")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("database statement failed")]
    Database(#[from] tokio_postgres::Error),
    #[error("invalid database URL")]
    DatabaseUrl(#[source] tokio_postgres::Error),
    #[error("creating the Kafka producer failed")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("installing the signal handler failed")]
    Signal(#[source] std::io::Error),
    #[error("binding the metrics listener on {0} failed")]
    MetricsListen(std::net::SocketAddr, #[source] std::io::Error),
    #[error("installing the metrics recorder failed")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    #[error("writing to stdout failed")]
    Output(#[source] std::io::Error),
}

pub use charges_runtime::error_chain;

/// Why the consumer stopped (or could not start).
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("database")]
    Store(#[from] charges_store::StoreError),
    #[error("database statement failed")]
    Database(#[from] tokio_postgres::Error),
    #[error("no database connection could be obtained")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("applying the consumer's migrations failed")]
    Migration(#[from] refinery::Error),
    #[error("kafka")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("cannot install the signal handler")]
    Signal(#[source] std::io::Error),
    #[error("cannot write to stdout")]
    Output(#[source] std::io::Error),
}

pub use charges_runtime::error_chain;

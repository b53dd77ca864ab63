//! `orders serve | relay | consume`: the three processes of the orders service.

use clap::{Parser, Subcommand};
use pg_plumbing::PoolSettings;
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio::sync::watch;

#[derive(Parser)]
#[command(about = "The orders service, built on pg-idempotency, pg-outbox and pg-inbox")]
struct Cli {
    /// Postgres's URL (migrated at start).
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// Kafka bootstrap servers (relay, consume).
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    kafka_brokers: String,
    /// The topic events go to and are read from.
    #[arg(long, env = "KAFKA_TOPIC", default_value = "orders.events")]
    topic: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The HTTP API.
    Serve {
        #[arg(long, env = "LISTEN", default_value = "127.0.0.1:8081")]
        listen: std::net::SocketAddr,
    },
    /// Publishes the outbox to the topic, until SIGINT.
    Relay,
    /// Applies the topic's events once each, until SIGINT.
    Consume {
        #[arg(long, env = "GROUP_ID", default_value = "orders-totals")]
        group_id: String,
    },
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let cli = Cli::parse();
    let pool = pg_plumbing::connect(&cli.database_url, &PoolSettings::default()).await?;
    orders::migrate(&pool).await?;
    let (stop, shutdown) = watch::channel(false);
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        let _ = stop.send(true);
    });
    match cli.command {
        Command::Serve { listen } => {
            orders::serve(pool, std::net::TcpListener::bind(listen)?)?.await?
        }
        Command::Relay => {
            let (url, brokers, mut stopped) = (&cli.database_url, &cli.kafka_brokers, shutdown);
            let engine = orders::relay(pool, url, brokers, &cli.topic, stopped.clone()).await?;
            let _ = stopped.changed().await;
            engine.drain(std::time::Duration::from_secs(5)).await;
        }
        Command::Consume { group_id } => {
            let consumer: StreamConsumer = ClientConfig::new()
                .set("bootstrap.servers", &cli.kafka_brokers)
                .set("group.id", &group_id)
                .set("enable.auto.commit", "false")
                .set("auto.offset.reset", "earliest")
                .create()?;
            consumer.subscribe(&[&cli.topic])?;
            orders::consume(&pool, &consumer, &Default::default(), shutdown).await?;
        }
    }
    Ok(())
}

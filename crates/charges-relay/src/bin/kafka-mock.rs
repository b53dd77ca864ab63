//! A throwaway Kafka for demos: librdkafka's mock cluster (in this process, real Kafka
//! protocol on loopback ports). Prints `bootstrap=<host:port,…>` on one line, then runs
//! until SIGTERM or Ctrl-C. Messages live in memory only.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use rdkafka::mocking::MockCluster;

/// Runs an in-memory Kafka mock cluster (librdkafka's) for demos and manual tests.
#[derive(Debug, Parser)]
#[command(name = "kafka-mock", version)]
struct Args {
    /// Topic to create.
    #[arg(long, env = "KAFKA_TOPIC", default_value = "charges.events")]
    topic: String,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 3)]
    partitions: i32,
    /// Brokers in the cluster (the topic's replication factor is min(brokers, 3)).
    #[arg(long, default_value_t = 1)]
    brokers: i32,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let cluster = match MockCluster::new(args.brokers) {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("kafka-mock: cannot start the mock cluster: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = cluster.create_topic(&args.topic, args.partitions, args.brokers.min(3)) {
        eprintln!("kafka-mock: cannot create topic {}: {e}", args.topic);
        return ExitCode::FAILURE;
    }
    let mut stdout = std::io::stdout();
    if writeln!(stdout, "bootstrap={}", cluster.bootstrap_servers())
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            eprintln!("kafka-mock: cannot install the SIGTERM handler: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(cluster);
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        Args::command().debug_assert();
    }
}

//! Command line and environment: one clap-derived struct per command.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use uuid::Uuid;

/// Publishes committed outbox rows from Postgres to Kafka, at least once.
///
/// Without a subcommand, runs the relay loop until SIGTERM or SIGINT. Any number of
/// relays may run against one database: each claims a disjoint batch of rows.
#[derive(Debug, Parser)]
#[command(
    name = "charges-relay",
    version,
    args_conflicts_with_subcommands = true,
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Log line format; the filter comes from RUST_LOG (default "info").
    #[arg(
        long,
        env = "LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Inspect and requeue dead rows (rows that failed --max-attempts times).
    Dead(DeadArgs),
    /// Delete expired COMPLETED idempotency keys now, in small batches, and exit (for
    /// cron; the relay also does it every --cleanup-interval). STARTED keys are never
    /// deleted.
    Purge,
}

pub use charges_runtime::{DatabaseArgs, LogFormat};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MessageKey {
    /// The outbox id: spreads events evenly over partitions; no ordering between
    /// events of one charge.
    OutboxId,
    /// The charge id: all events of one charge land on one partition, in publish
    /// order; a hot charge makes a hot partition. Even so, order can break on a
    /// retry, since a failed row is retried after its younger neighbours.
    AggregateId,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Kafka bootstrap servers, comma separated.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,

    /// Topic every event is published to.
    #[arg(long, env = "KAFKA_TOPIC", default_value = "charges.events")]
    pub topic: String,

    /// Message key. `outbox-id` (default) spreads load evenly but gives no per-charge
    /// order; `aggregate-id` keeps one charge's events on one partition (ordered as
    /// published), at the price of hot partitions for busy charges.
    #[arg(
        long,
        env = "RELAY_MESSAGE_KEY",
        value_enum,
        default_value = "outbox-id"
    )]
    pub message_key: MessageKey,

    /// CloudEvents `source` attribute (header `ce_source`).
    #[arg(long, env = "RELAY_EVENT_SOURCE", default_value = "urn:charges")]
    pub event_source: String,

    /// Rows claimed (and published concurrently) per transaction. Bigger batches drain a
    /// backlog with fewer transactions; a relay killed mid-batch republishes at most
    /// this many rows per loop.
    #[arg(long, env = "RELAY_BATCH_SIZE", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: u32,

    /// Batches in flight at once in this process, each in its own transaction on its
    /// own connection: while one waits for the broker's acknowledgements, the next is
    /// claimed and marked. Rows are disjoint (`SKIP LOCKED`), as between replicas.
    #[arg(long, env = "RELAY_CONCURRENCY", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub concurrency: u32,

    /// How often to look for rows when no notification arrives (fallback for lost
    /// notifications, retries that became due, and a dropped LISTEN connection).
    #[arg(long, env = "RELAY_POLL_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub poll_interval: Duration,

    /// Upper bound on one batch's delivery (`message.timeout.ms`); the claim
    /// transaction stays open at most this long plus a small margin.
    #[arg(long, env = "RELAY_PUBLISH_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub publish_timeout: Duration,

    /// Failed attempts after which a row is set dead and no longer claimed.
    #[arg(long, env = "RELAY_MAX_ATTEMPTS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,

    /// First retry delay cap; the cap doubles per attempt (full jitter: the delay is
    /// uniformly random between 0 and the cap).
    #[arg(long, env = "RELAY_BACKOFF_BASE", default_value = "1s", value_parser = humantime::parse_duration)]
    pub backoff_base: Duration,

    /// Largest retry delay cap.
    #[arg(long, env = "RELAY_BACKOFF_MAX", default_value = "5m", value_parser = humantime::parse_duration)]
    pub backoff_max: Duration,

    /// Published rows older than this are deleted (in small batches, by one relay at
    /// a time). Pending and dead rows are never deleted.
    #[arg(long, env = "RELAY_PUBLISHED_RETENTION", default_value = "7d", value_parser = humantime::parse_duration)]
    pub published_retention: Duration,

    /// How often the retention cleanup runs (also once at start-up): published outbox
    /// rows past --published-retention and expired COMPLETED idempotency keys.
    #[arg(long, env = "RELAY_CLEANUP_INTERVAL", default_value = "1m", value_parser = humantime::parse_duration)]
    pub cleanup_interval: Duration,

    /// Address of the operations HTTP server: GET /metrics (Prometheus), /healthz,
    /// /readyz. Port 0 picks a free port (logged as `metrics_addr`).
    #[arg(long, env = "RELAY_METRICS_LISTEN", default_value = "127.0.0.1:9091")]
    pub metrics_listen: std::net::SocketAddr,

    /// How often the outbox backlog gauges (pending, oldest pending age, dead) are
    /// refreshed from the database.
    #[arg(long, env = "RELAY_STATS_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub stats_interval: Duration,

    /// How often reconciliation runs (charges without an outbox row, committed
    /// STARTED idempotency keys); it scans the charges of the last
    /// --published-retention.
    #[arg(long, env = "RELAY_RECONCILE_INTERVAL", default_value = "5m", value_parser = humantime::parse_duration)]
    pub reconcile_interval: Duration,

    /// A committed STARTED idempotency key older than this is reported by
    /// reconciliation (the one-transaction design never commits one).
    #[arg(long, env = "RELAY_STALE_STARTED_AFTER", default_value = "5m", value_parser = humantime::parse_duration)]
    pub stale_started_after: Duration,

    /// Extra librdkafka producer setting, `key=value`; repeatable. Applied after the
    /// relay's own settings (bootstrap.servers, enable.idempotence=true, acks=all,
    /// message.timeout.ms), so it can override them; e.g. security.protocol=SSL.
    #[arg(long = "kafka-config", value_name = "KEY=VALUE", value_parser = charges_runtime::parse_key_value)]
    pub kafka_config: Vec<(String, String)>,

    /// Apply pending database migrations before starting.
    #[arg(long, env = "RELAY_MIGRATE")]
    pub migrate: bool,
}

#[derive(Debug, Args)]
pub struct DeadArgs {
    #[command(subcommand)]
    pub action: DeadAction,
}

#[derive(Debug, Subcommand)]
pub enum DeadAction {
    /// Print dead rows (id, aggregate id, type, attempts, last error), oldest first.
    List {
        /// Print at most this many rows.
        #[arg(long, default_value_t = 1000)]
        limit: i64,
    },
    /// Make dead rows pending again, with attempts reset to 0.
    Requeue {
        /// Requeue this row; repeatable.
        #[arg(long, required_unless_present = "all", conflicts_with = "all")]
        id: Vec<Uuid>,
        /// Requeue every dead row.
        #[arg(long)]
        all: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_kafka_config() {
        let cli = Cli::try_parse_from([
            "charges-relay",
            "--kafka-config",
            "message.max.bytes=2000",
            "--kafka-config",
            "linger.ms=1",
        ])
        .unwrap();
        assert_eq!(cli.run.kafka_config.len(), 2);
        assert_eq!(
            cli.run.kafka_config[0],
            ("message.max.bytes".into(), "2000".into())
        );
    }

    #[test]
    fn dead_requeue_needs_id_or_all() {
        assert!(Cli::try_parse_from(["charges-relay", "dead", "requeue"]).is_err());
        assert!(Cli::try_parse_from(["charges-relay", "dead", "requeue", "--all"]).is_ok());
    }
}

//! Command line and environment configuration. Every flag of the consumer loop has an
//! environment fallback.

use std::time::Duration;

use charges_runtime::cli::{KafkaConfigArgs, duration_within};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// Reads charges.events with a consumer group and applies each event once: the event id
/// (header `id`) goes into an inbox table in the same transaction as the effect, and the
/// Kafka offset is committed only after that transaction. Runs until SIGTERM or SIGINT.
#[derive(Debug, Parser)]
#[command(name = "charges-consumer", version, args_override_self = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The consumer's own database (inbox and ledger).
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

impl Cli {
    /// Parses the command line (or `args`) and refuses consumer-loop flags next to a
    /// subcommand (usage error, exit code 2).
    pub fn parse_checked<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{CommandFactory, FromArgMatches};
        let command = Cli::command();
        let matches = command.clone().try_get_matches_from(args)?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        charges_runtime::cli::reject_loop_flags_with_subcommand::<RunArgs>(&command, &matches)?;
        let kafka = match &mut cli.command {
            Some(Command::Tail(tail)) => &mut tail.kafka,
            Some(Command::Parked(_)) | None => &mut cli.run.kafka,
        };
        kafka.resolve().map_err(|e| {
            command
                .clone()
                .error(clap::error::ErrorKind::ValueValidation, e)
        })?;
        Ok(cli)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Messages this consumer did not apply (unknown payload version, undecodable, or
    /// failing --max-apply-attempts times): list them, or replay them once fixed.
    Parked(ParkedArgs),
    /// Print every message on the topic (partition, offset, header `id`, `ce_type`), read
    /// without a consumer group, and exit once nothing new arrived for --until-idle.
    Tail(TailArgs),
}

pub use charges_runtime::{DatabaseArgs, LogFormat};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OffsetReset {
    /// A group with no committed offset starts at the oldest message (nothing is
    /// skipped; duplicates are harmless).
    Earliest,
    /// A group with no committed offset starts at the next new message.
    Latest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Ordering {
    /// Apply events in whatever order they arrive (the ledger only adds).
    Unordered,
    /// The relay runs with --ordering per-aggregate: keep each charge's highest
    /// applied sequence and count (metric, warning) every event that arrives before
    /// its predecessor. Events are still applied.
    PerAggregate,
}

impl OffsetReset {
    pub fn as_str(self) -> &'static str {
        match self {
            OffsetReset::Earliest => "earliest",
            OffsetReset::Latest => "latest",
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Kafka bootstrap servers, comma separated.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,

    /// Topic to consume.
    #[arg(long, env = "KAFKA_TOPIC", default_value = "charges.events")]
    pub topic: String,

    /// Consumer group: replicas with the same group share the partitions.
    #[arg(long, env = "KAFKA_GROUP_ID", default_value = "charges-ledger")]
    pub group_id: String,

    /// Where a group without a committed offset starts.
    #[arg(
        long,
        env = "KAFKA_OFFSET_RESET",
        value_enum,
        default_value = "earliest"
    )]
    pub offset_reset: OffsetReset,

    /// How often processed offsets are committed to Kafka; 0s commits after every
    /// message. A longer interval means fewer commits and more redeliveries after a
    /// crash; the inbox makes those harmless either way.
    #[arg(long, env = "CONSUMER_COMMIT_INTERVAL", default_value = "0s", value_parser = duration_within(Duration::ZERO, Duration::from_secs(3600)))]
    pub commit_interval: Duration,

    /// librdkafka consumer settings, applied after the consumer's own, so they can
    /// override them (e.g. session.timeout.ms, security.protocol=SSL).
    /// enable.auto.commit cannot be turned back on usefully: the consumer stores offsets
    /// itself.
    #[command(flatten)]
    pub kafka: KafkaConfigArgs,

    /// Failures to apply one event (other than an unreachable database, which is waited
    /// for) after which it is parked (`parked list`, `parked replay`) and the consumer
    /// goes on with the next message.
    #[arg(long, env = "CONSUMER_MAX_APPLY_ATTEMPTS", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_apply_attempts: u32,

    /// Whether to check each charge's event order (see the relay's --ordering).
    #[arg(
        long,
        env = "CONSUMER_ORDERING",
        value_enum,
        default_value = "unordered"
    )]
    pub ordering: Ordering,

    /// Address of the operations HTTP server: GET /metrics (Prometheus), /healthz,
    /// /readyz. Port 0 picks a free port (logged as `metrics_addr`).
    #[arg(
        long,
        env = "CONSUMER_METRICS_LISTEN",
        default_value = "127.0.0.1:9095"
    )]
    pub metrics_listen: std::net::SocketAddr,

    /// Apply the consumer's pending migrations before starting.
    #[arg(long, env = "CONSUMER_MIGRATE")]
    pub migrate: bool,
}

#[derive(Debug, Args)]
pub struct ParkedArgs {
    #[command(subcommand)]
    pub action: ParkedAction,
}

#[derive(Debug, Subcommand)]
pub enum ParkedAction {
    /// Print parked messages (topic, partition, offset, id, type, attempts, parked at,
    /// reason), oldest first.
    List {
        /// Print at most this many.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=100_000))]
        limit: i64,
    },
    /// Apply parked messages again, oldest first: one that applies (or turns out to be
    /// a duplicate) leaves the table, one that still fails stays with its new reason.
    /// Prints one line per message.
    Replay {
        /// At most this many.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=100_000))]
        limit: i64,
        /// Check each charge's event order as the consumer loop does.
        #[arg(long, value_enum, default_value = "unordered")]
        ordering: Ordering,
    },
}

#[derive(Debug, Args)]
pub struct TailArgs {
    /// Kafka bootstrap servers, comma separated.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,

    /// Topic to read.
    #[arg(long, env = "KAFKA_TOPIC", default_value = "charges.events")]
    pub topic: String,

    /// Start at each partition's first message (otherwise at its end).
    #[arg(long)]
    pub from_beginning: bool,

    /// librdkafka consumer settings for reading a secured cluster (TLS, SASL).
    #[command(flatten)]
    pub kafka: KafkaConfigArgs,

    /// Exit after this long without a new message.
    #[arg(long, default_value = "2s", value_parser = duration_within(Duration::from_millis(100), Duration::from_secs(3600)))]
    pub until_idle: Duration,
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
    fn defaults() {
        let cli = Cli::try_parse_from(["charges-consumer"]).unwrap();
        assert_eq!(cli.run.topic, "charges.events");
        assert_eq!(cli.run.group_id, "charges-ledger");
        assert_eq!(cli.run.commit_interval, Duration::ZERO);
        assert_eq!(cli.run.offset_reset, OffsetReset::Earliest);
        let tail = Cli::try_parse_from(["charges-consumer", "tail", "--from-beginning"]).unwrap();
        assert!(matches!(
            tail.command,
            Some(Command::Tail(TailArgs {
                from_beginning: true,
                ..
            }))
        ));
    }
}

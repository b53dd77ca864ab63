//! Command line and environment: one clap-derived struct per command.

use std::time::Duration;

use charges_maintenance::MaintenanceArgs;
use charges_runtime::cli::{KafkaConfigArgs, duration_within};
use charges_runtime::secrets::SecretString;
use clap::{Args, Parser, Subcommand, ValueEnum};
use uuid::Uuid;

/// Publishes committed outbox rows from Postgres to Kafka, at least once.
///
/// Without a subcommand, runs the relay loop until SIGTERM or SIGINT. Any number of
/// relays may run against one database: each claims a disjoint batch of rows.
#[derive(Debug, Parser)]
#[command(name = "charges-relay", version, args_override_self = true)]
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
    /// Delete expired COMPLETED idempotency keys now, in small batches, and exit: the
    /// purge_expired_keys job once (for cron; the relay runs it every
    /// --cleanup-interval). STARTED keys are never deleted.
    Purge,
}

pub use charges_runtime::{DatabaseArgs, LogFormat};
use charges_store::GateStandbys;

/// `--wait-for-standbys`: which standbys must have a batch's WAL before it is published.
fn parse_standbys(text: &str) -> Result<GateStandbys, String> {
    match text.trim() {
        "any" => return Ok(GateStandbys::Any),
        "sync" => return Ok(GateStandbys::Synchronous),
        _ => {}
    }
    let mut names: Vec<String> = Vec::new();
    for name in text.split(',').map(str::trim) {
        if name.is_empty() {
            return Err("expected `sync`, `any` or standby names separated by commas".to_owned());
        }
        if !names.iter().any(|known| known == name) {
            names.push(name.to_owned());
        }
    }
    Ok(GateStandbys::Named(names))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MessageKey {
    /// The outbox id: spreads events evenly over partitions; no ordering between
    /// events of one charge.
    OutboxId,
    /// The charge id: all events of one charge land on one partition, in publish
    /// order; a hot charge makes a hot partition. Without --ordering per-aggregate,
    /// order can still break on a retry, since a failed row is retried after its
    /// younger neighbours.
    AggregateId,
}

impl From<MessageKey> for pg_outbox::relay::MessageKey {
    fn from(key: MessageKey) -> Self {
        match key {
            MessageKey::OutboxId => pg_outbox::relay::MessageKey::OutboxId,
            MessageKey::AggregateId => pg_outbox::relay::MessageKey::AggregateId,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Ordering {
    /// Rows are published oldest first but concurrently; a retried row goes out after
    /// its younger neighbours. The fastest.
    Unordered,
    /// For every charge, its events reach the topic in the order their transactions
    /// committed (first occurrences; a redelivered duplicate may come later): a row
    /// is claimed only once every older event of its charge is published. Message key
    /// = charge id. An event that waits for a retry, or is dead, holds back its
    /// charge's later events, and only those.
    PerAggregate,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Postgres's own URL for the LISTEN session that wakes the relay when rows are
    /// committed (default: --database-url). Needed behind a transaction pooler
    /// (--db-pooler transaction), where LISTEN cannot work: without it the relay only
    /// polls, every --poll-interval. Never logged.
    #[arg(long, env = "LISTEN_DATABASE_URL", hide_env_values = true)]
    pub listen_database_url: Option<SecretString>,

    /// Kafka bootstrap servers, comma separated.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,

    /// Topic of every event whose aggregate type has no --topic-for of its own.
    #[arg(long, env = "KAFKA_TOPIC", default_value = "charges.events")]
    pub topic: String,

    /// Route an aggregate type's events to a topic of their own: `AGGREGATE=TOPIC`,
    /// repeatable (e.g. charge=charges.events, payout=payouts.events).
    #[arg(long = "topic-for", env = "RELAY_TOPIC_FOR", value_name = "AGGREGATE=TOPIC", value_delimiter = ',', value_parser = charges_runtime::parse_key_value)]
    pub topic_for: Vec<(String, String)>,

    /// Delivery order. `unordered` (default) publishes concurrently, oldest first;
    /// `per-aggregate` publishes each charge's events in commit order (message key =
    /// charge id), at the price of one event per charge per batch.
    #[arg(long, env = "RELAY_ORDERING", value_enum, default_value = "unordered")]
    pub ordering: Ordering,

    /// Message key. `outbox-id` (the default without ordering) spreads load evenly but
    /// gives no per-charge order; `aggregate-id` (always, with --ordering
    /// per-aggregate) keeps one charge's events on one partition, at the price of hot
    /// partitions for busy charges.
    #[arg(long, env = "RELAY_MESSAGE_KEY", value_enum)]
    pub message_key: Option<MessageKey>,

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

    /// How often an idle relay looks for rows when no notification arrives (fallback
    /// for lost notifications, retries that became due, and a dropped LISTEN
    /// connection).
    #[arg(long, env = "RELAY_POLL_INTERVAL", default_value = "1s", value_parser = duration_within(Duration::from_millis(10), Duration::from_secs(86400)))]
    pub poll_interval: Duration,

    /// While rows keep arriving (the last batch claimed some, but not a full batch),
    /// look again after this pause. A busy relay asks for no notification, because a
    /// NOTIFY makes the inserting transactions commit one at a time; an idle one does.
    /// At most --poll-interval.
    #[arg(long, env = "RELAY_BUSY_POLL_INTERVAL", default_value = "10ms", value_parser = duration_within(Duration::from_millis(1), Duration::from_secs(86400)))]
    pub busy_poll_interval: Duration,

    /// Upper bound on one batch's delivery (`message.timeout.ms`); the claim
    /// transaction stays open at most this long plus a small margin.
    #[arg(long, env = "RELAY_PUBLISH_TIMEOUT", default_value = "5s", value_parser = duration_within(Duration::from_millis(100), Duration::from_secs(600)))]
    pub publish_timeout: Duration,

    /// The replication gate: publish a batch only once these standbys have flushed the
    /// WAL holding its rows, so that no event goes out for a commit a failover to them
    /// would lose. `sync`: those synchronous_standby_names names at the time (as many as
    /// it asks for; none while it names none, as under a failover manager that promotes
    /// only its synchronous standbys); `any`: one standby is enough; or standby names
    /// (their application_name, comma separated; every one must confirm). Off when
    /// unset. While they lag, a batch waits up to --publish-timeout, then rolls back
    /// untouched: no attempt used, the rows stay pending. With the gate on, each
    /// --concurrency loop runs twice (twice the connections), so that batches waiting
    /// for the standbys do not hold the others up.
    #[arg(long, env = "RELAY_WAIT_FOR_STANDBYS", value_name = "sync|any|NAME,…", value_parser = parse_standbys)]
    pub wait_for_standbys: Option<GateStandbys>,

    /// Rejections after which a row is set dead and no longer claimed: attempts the
    /// broker refused the message itself (too large, invalid). Failures because the
    /// broker was unavailable never count: a row waits for the broker however long it
    /// takes.
    #[arg(long, env = "RELAY_MAX_ATTEMPTS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,

    /// First retry delay cap; the cap doubles per attempt (full jitter: the delay is
    /// uniformly random between 0 and the cap).
    #[arg(long, env = "RELAY_BACKOFF_BASE", default_value = "1s", value_parser = duration_within(Duration::from_millis(1), Duration::from_secs(3600)))]
    pub backoff_base: Duration,

    /// Largest retry delay cap.
    #[arg(long, env = "RELAY_BACKOFF_MAX", default_value = "5m", value_parser = duration_within(Duration::from_millis(1), Duration::from_secs(86400)))]
    pub backoff_max: Duration,

    /// While the broker is unavailable the relay claims nothing and probes the
    /// broker's metadata instead, first after --backoff-base, then twice as long each
    /// time, up to this.
    #[arg(long, env = "RELAY_BROKER_PROBE_MAX", default_value = "30s", value_parser = duration_within(Duration::from_millis(100), Duration::from_secs(3600)))]
    pub broker_probe_max: Duration,

    // The maintenance jobs' settings: each job defines its own flags, with their
    // defaults and ranges, in its file.
    #[command(flatten)]
    pub maintenance: MaintenanceArgs,

    /// Address of the operations HTTP server: GET /metrics (Prometheus), /healthz,
    /// /readyz. Port 0 picks a free port (logged as `metrics_addr`).
    #[arg(long, env = "RELAY_METRICS_LISTEN", default_value = "127.0.0.1:9091")]
    pub metrics_listen: std::net::SocketAddr,

    /// librdkafka producer settings, applied after the relay's own (bootstrap.servers,
    /// enable.idempotence=true, acks=all, linger.ms=0, message.timeout.ms), so they can
    /// override them; e.g. security.protocol=SSL.
    #[command(flatten)]
    pub kafka: KafkaConfigArgs,

    /// Apply pending database migrations before starting.
    #[arg(long, env = "RELAY_MIGRATE")]
    pub migrate: bool,
}

impl Cli {
    /// Parses the command line (or `args`), then checks what clap cannot check flag by
    /// flag. A failure is a usage error: exit code 2 with the flags named.
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
        cli.validate()?;
        cli.run.kafka.resolve().map_err(|e| {
            command
                .clone()
                .error(clap::error::ErrorKind::ValueValidation, e)
        })?;
        Ok(cli)
    }

    fn validate(&self) -> Result<(), clap::Error> {
        use clap::CommandFactory;
        use clap::error::ErrorKind;
        let run = &self.run;
        for (flag, value) in [
            ("--backoff-max", run.backoff_max),
            ("--broker-probe-max", run.broker_probe_max),
        ] {
            if value < run.backoff_base {
                return Err(Cli::command().error(
                    ErrorKind::ValueValidation,
                    format!(
                        "{flag} ({}) must not be shorter than --backoff-base ({}): the delays start there",
                        humantime::format_duration(value),
                        humantime::format_duration(run.backoff_base)
                    ),
                ));
            }
        }
        if run.busy_poll_interval > run.poll_interval {
            return Err(Cli::command().error(
                ErrorKind::ValueValidation,
                format!(
                    "--busy-poll-interval ({}) must not be longer than --poll-interval ({}): \
                     a busy relay looks for rows at least as often as an idle one",
                    humantime::format_duration(run.busy_poll_interval),
                    humantime::format_duration(run.poll_interval)
                ),
            ));
        }
        if run.ordering == Ordering::PerAggregate && run.message_key == Some(MessageKey::OutboxId) {
            return Err(Cli::command().error(
                ErrorKind::ArgumentConflict,
                "--ordering per-aggregate needs the charge id as the message key (Kafka orders \
                 within a partition only): drop --message-key outbox-id",
            ));
        }
        Ok(())
    }
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
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=100_000))]
        limit: i64,
    },
    /// Print one dead row in full: payload, attempts, rejections, last error, times.
    Show {
        /// The outbox id (the message's `id` header).
        id: Uuid,
    },
    /// Delete dead rows whose event will never be published, keeping a copy (table
    /// outbox_discarded, with who and when); prints one line per row. Asks before
    /// deleting on a terminal; elsewhere needs --yes.
    Discard {
        /// The outbox ids; every one must be a dead row, or nothing is discarded.
        #[arg(required = true)]
        ids: Vec<Uuid>,
        /// Who discards them, for the record (default: the USER environment variable).
        #[arg(long, env = "USER", hide_env_values = true)]
        by: Option<String>,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// Make dead rows pending again, with attempts and rejections reset to 0. Name the
    /// rows with exactly one of --id, --all, --unavailable or --last-error-like.
    #[command(
        after_help = "Examples:\n  charges-relay dead requeue --id 0190d5b0-0000-7000-8000-000000000001\n  charges-relay dead requeue --unavailable   # rows killed by a broker outage\n  charges-relay dead requeue --all"
    )]
    Requeue(RequeueArgs),
}

/// Which dead rows `dead requeue` takes.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct RequeueArgs {
    /// Requeue this row; repeatable. Every id must be a dead row, or nothing is requeued.
    #[arg(long)]
    pub id: Vec<Uuid>,
    /// Requeue every dead row.
    #[arg(long)]
    pub all: bool,
    /// Requeue the dead rows whose last error says the broker was unavailable (a
    /// timeout, no broker, no leader…): rows that relays older than this one set dead
    /// during a broker outage. Rows the broker refused stay dead.
    #[arg(long)]
    pub unavailable: bool,
    /// Requeue the dead rows whose last error matches this SQL LIKE pattern
    /// (e.g. '%MessageSizeTooLarge%').
    #[arg(long, value_name = "PATTERN")]
    pub last_error_like: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use charges_runtime::secrets::ExposeSecret;
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        Cli::command().debug_assert();
    }

    #[test]
    fn both_database_passwords_reach_the_log_redactor() {
        let cli = Cli::try_parse_from([
            "charges-relay",
            "--database-url",
            "postgres://app:pooled-pw@pgbouncer/charges",
            "--listen-database-url",
            "postgres://app:direct-pw@db/charges",
        ])
        .unwrap();
        let secrets = crate::secrets(&cli);
        assert!(secrets.contains(&"pooled-pw".to_owned()), "{secrets:?}");
        assert!(secrets.contains(&"direct-pw".to_owned()), "{secrets:?}");
        assert!(
            !format!("{cli:?}").contains("-pw"),
            "Debug shows a password"
        );
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
        assert_eq!(cli.run.kafka.kafka_config.len(), 2);
        assert_eq!(
            cli.run.kafka.kafka_config[0],
            ("message.max.bytes".into(), "2000".into())
        );
    }

    #[test]
    fn dead_requeue_needs_exactly_one_selection() {
        let missing = Cli::try_parse_from(["charges-relay", "dead", "requeue"])
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("--id") && missing.contains("--all"),
            "{missing}"
        );
        assert!(Cli::try_parse_from(["charges-relay", "dead", "requeue", "--all"]).is_ok());
        assert!(Cli::try_parse_from(["charges-relay", "dead", "requeue", "--unavailable"]).is_ok());
        assert!(
            Cli::try_parse_from(["charges-relay", "dead", "requeue", "--all", "--unavailable"])
                .is_err()
        );
    }

    #[test]
    fn database_flags_go_before_or_after_the_subcommand() {
        for args in [
            &[
                "charges-relay",
                "--database-url",
                "postgres://x/y",
                "dead",
                "list",
            ][..],
            &[
                "charges-relay",
                "dead",
                "list",
                "--database-url",
                "postgres://x/y",
            ][..],
            &[
                "charges-relay",
                "dead",
                "--database-url",
                "postgres://x/y",
                "list",
            ][..],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            assert_eq!(
                cli.database.database_url.expose_secret(),
                "postgres://x/y",
                "{args:?}"
            );
        }
    }

    #[test]
    fn per_aggregate_ordering_refuses_the_outbox_id_as_key() {
        let cli = Cli::try_parse_from([
            "charges-relay",
            "--ordering",
            "per-aggregate",
            "--message-key",
            "outbox-id",
        ])
        .unwrap();
        assert!(cli.validate().is_err());
        let cli = Cli::try_parse_from(["charges-relay", "--ordering", "per-aggregate"]).unwrap();
        assert!(cli.validate().is_ok());
    }

    #[test]
    fn loop_flags_with_a_subcommand_are_refused() {
        let Err(error) = Cli::parse_checked(["charges-relay", "--batch-size", "5", "dead", "list"])
        else {
            panic!("a loop flag with a subcommand was accepted");
        };
        assert!(error.to_string().contains("--batch-size"), "{error}");
        assert!(
            Cli::parse_checked(["charges-relay", "--log-format", "json", "dead", "list"]).is_ok()
        );
    }
}

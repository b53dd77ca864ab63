//! The consumer loop: receive, apply in one transaction, then store and commit the
//! offset.

use charges_runtime::DatabaseArgs;
use deadpool_postgres::Pool;
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext, Statistics};
use tokio::time::Instant;

use charges_runtime::ops::OpsServer;
use charges_runtime::secrets::ExposeSecret;

use crate::config::{Ordering, RunArgs};
use crate::{ConsumerError, handle, metrics, migrations};

/// Exports each assigned partition's lag from librdkafka's statistics (emitted every
/// `statistics.interval.ms`).
pub struct LagReporter;

impl ClientContext for LagReporter {
    fn stats(&self, statistics: Statistics) {
        for topic in statistics.topics.values() {
            for (partition, stats) in &topic.partitions {
                // -1: not assigned to this member, or no position yet.
                if *partition >= 0 && stats.consumer_lag >= 0 {
                    metrics::lag(*partition, stats.consumer_lag);
                }
            }
        }
    }
}

impl ConsumerContext for LagReporter {}

/// The consumer this loop reads with.
type LedgerConsumer = StreamConsumer<LagReporter>;

fn consumer_config(args: &RunArgs) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.kafka_brokers)
        .set("group.id", &args.group_id)
        .set("client.id", "charges-consumer")
        .set("statistics.interval.ms", "5000")
        // Offsets are ours to commit, and only after the database commit.
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", args.offset_reset.as_str());
    for (key, value) in &args.kafka.resolved {
        config.set(key, value.expose_secret());
    }
    config
}

/// Commits the stored offsets. "Nothing stored" is not an error; any other failure is
/// only logged: the next commit covers the same offsets, and until then a crash costs
/// redeliveries, which the inbox absorbs.
fn commit(consumer: &LedgerConsumer, mode: CommitMode) {
    match consumer.commit_consumer_state(mode) {
        Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => {
            tracing::warn!(error = %e, "offset commit failed; will retry with the next commit")
        }
    }
}

/// The consumer loop, until SIGTERM/SIGINT.
pub async fn run(database: &DatabaseArgs, args: RunArgs) -> Result<(), ConsumerError> {
    let pool = charges_store::connect(
        database.database_url.expose_secret(),
        &database.pool_settings("charges-consumer", 2),
    )
    .await?;
    if args.migrate {
        migrations::run(&pool).await?;
    }
    let metrics_handle = metrics::install()?;
    let upkeep = tokio::spawn(charges_runtime::metrics::upkeep(metrics_handle.clone()));
    let health = std::sync::Arc::new(charges_runtime::readiness::Health::default());
    let ops = OpsServer::start(
        args.metrics_listen,
        pool.clone(),
        migrations::sets().to_vec(),
        metrics_handle,
        health,
    )?;
    let consumer: StreamConsumer<LagReporter> =
        consumer_config(&args).create_with_context(LagReporter)?;
    consumer.subscribe(&[args.topic.as_str()])?;
    let signal = charges_runtime::shutdown_signal().map_err(ConsumerError::Signal)?;
    tracing::info!(
        topic = %args.topic,
        group = %args.group_id,
        brokers = %args.kafka_brokers,
        ordering = ?args.ordering,
        metrics_addr = %ops.addr_text(),
        "consumer started"
    );
    let result = consume(&pool, &consumer, &args, signal).await;
    commit(&consumer, CommitMode::Sync);
    ops.stop().await;
    upkeep.abort();
    tracing::info!("consumer stopped");
    result
}

/// Message after message until `signal`: apply, then store the offset; commit the
/// stored offsets every `--commit-interval`.
async fn consume(
    pool: &Pool,
    consumer: &LedgerConsumer,
    args: &RunArgs,
    signal: impl Future<Output = &'static str>,
) -> Result<(), ConsumerError> {
    tokio::pin!(signal);
    let handling = handle::Handling {
        check_order: args.ordering == Ordering::PerAggregate,
        max_apply_attempts: args.max_apply_attempts,
    };
    // Offsets stored since the last commit, and when the next commit is due.
    let mut uncommitted = false;
    let mut next_commit = Instant::now() + args.commit_interval;
    loop {
        let message = tokio::select! {
            name = &mut signal => {
                tracing::info!(signal = name, "shutting down");
                return Ok(());
            }
            () = tokio::time::sleep_until(next_commit), if uncommitted => {
                commit(consumer, CommitMode::Async);
                uncommitted = false;
                continue;
            }
            received = consumer.recv() => received,
        };
        let message = match message {
            Ok(message) => message,
            Err(e) => {
                // librdkafka recovers from broker errors by itself; this is a report.
                tracing::warn!(error = %e, "kafka consumer error");
                continue;
            }
        };
        let Some(()) = handle::process(pool, &message, &args.topic, &handling, &mut signal).await
        else {
            tracing::info!("shutting down before this message was applied; it will be redelivered");
            return Ok(());
        };
        // Only now, after the database commit, may Kafka hear that the message is done.
        consumer.store_offset_from_message(&message)?;
        if !uncommitted {
            next_commit = Instant::now() + args.commit_interval;
            uncommitted = true;
        }
        if Instant::now() >= next_commit {
            commit(consumer, CommitMode::Async);
            uncommitted = false;
        }
    }
}

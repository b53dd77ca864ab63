//! The reference consumer of `charges.events`: how to turn at-least-once delivery into
//! exactly-once *effects*.
//!
//! # The loop
//!
//! For each message, in **one** database transaction:
//!
//! 1. `INSERT INTO processed_events (event_id, …) … ON CONFLICT DO NOTHING` with the
//!    message's header `id` (the outbox id, also `ce_id` and the payload's `eventId`);
//! 2. only if that inserted a row, apply the effect (add to the per-currency `ledger`);
//! 3. `COMMIT`.
//!
//! Only then is the message's offset stored and committed to Kafka. A crash anywhere
//! before the offset commit means the message is delivered again (to this replica or
//! another one after a rebalance), and step 1 then inserts nothing, so step 2 is
//! skipped. A crash before the database commit rolls back both the inbox row and the
//! effect, so the redelivery applies it. Two replicas racing on the same event (during
//! a rebalance) serialize on the inbox row's primary key: the second insert waits for
//! the first transaction and then finds the conflict.
//!
//! The relay may publish an event more than once, and Kafka may deliver a message more
//! than once; both look the same here: the same `id` again.
//!
//! # Ordering
//!
//! Kafka orders messages within a partition only. With the relay's default message key
//! (the outbox id) a charge's `ChargeCreated` and `ChargeRefunded` may sit on different
//! partitions and arrive in either order; a redelivered duplicate can arrive after newer
//! events. The ledger only adds, so order does not matter to it; a consumer whose effect
//! depends on order must check it itself (e.g. compare `refundedCents`, or keep a
//! per-charge version), not assume it.

pub mod config;
mod error;
pub mod inbox;
pub mod ledger;
pub mod migrations;

use std::io::Write;
use std::time::Duration;

use charges_domain::{ChargeCreated, ChargeRefunded, EventType};
use charges_runtime::DatabaseArgs;
use deadpool_postgres::Pool;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::time::Instant;
use uuid::Uuid;

pub use error::{ConsumerError, error_chain};

use crate::config::{Cli, Command, RunArgs, TailArgs};
use crate::inbox::{InboxStore, Source};
use crate::ledger::{Entry, LedgerStore};

/// Every secret on the command line, for the log redactor: the database password and
/// the values of secret `--kafka-config` settings (`sasl.password`, …).
pub fn secrets(cli: &Cli) -> Vec<String> {
    let mut secrets = charges_runtime::secrets::database_password(&cli.database.database_url);
    secrets.extend(charges_runtime::secrets::kafka_config_secrets(
        &cli.run.kafka_config,
    ));
    secrets
}

/// Runs what the command line asks for.
pub async fn main(cli: Cli) -> Result<(), ConsumerError> {
    match cli.command {
        None => run(&cli.database, cli.run).await,
        Some(Command::Tail(args)) => tail(args).await,
    }
}

/// One decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: Uuid,
    pub event_type: String,
    /// `None` for an event type this consumer does not know: it is still recorded in
    /// the inbox (so it is looked at once) but has no effect.
    pub entry: Option<Entry>,
}

/// Why a message cannot be processed at all.
#[derive(Debug, thiserror::Error)]
pub enum Poison {
    #[error("no header `id` (the deduplication key)")]
    NoId,
    #[error("header `id` is not a UUID")]
    BadId,
    #[error("the payload is not a valid {event_type}: {reason}")]
    BadPayload { event_type: String, reason: String },
}

/// Decodes a message from its headers and payload. The event type comes from
/// `ce_type` (CloudEvents binary binding), the dedupe key from `id`.
pub fn decode(id: Option<&[u8]>, ce_type: Option<&[u8]>, payload: &[u8]) -> Result<Event, Poison> {
    let id = id.ok_or(Poison::NoId)?;
    let id = std::str::from_utf8(id)
        .ok()
        .and_then(|id| Uuid::try_parse(id).ok())
        .ok_or(Poison::BadId)?;
    let event_type = String::from_utf8_lossy(ce_type.unwrap_or_default()).into_owned();
    let bad = |e: serde_json::Error| Poison::BadPayload {
        event_type: event_type.clone(),
        reason: e.to_string(),
    };
    let entry = if event_type == EventType::ChargeCreated.as_str() {
        let event: ChargeCreated = serde_json::from_slice(payload).map_err(bad)?;
        Some(Entry {
            currency: event.currency,
            charged_cents: event.amount_cents.into(),
            refunded_cents: 0,
        })
    } else if event_type == EventType::ChargeRefunded.as_str() {
        let event: ChargeRefunded = serde_json::from_slice(payload).map_err(bad)?;
        Some(Entry {
            currency: event.currency,
            charged_cents: 0,
            refunded_cents: event.amount_cents.into(),
        })
    } else {
        None
    };
    Ok(Event {
        id,
        event_type,
        entry,
    })
}

/// What [`apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Applied,
    Duplicate,
}

/// The inbox insert and the effect, in one transaction.
pub async fn apply(
    pool: &Pool,
    event: &Event,
    source: Source<'_>,
) -> Result<Applied, ConsumerError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    if !InboxStore::insert(&tx, event.id, &event.event_type, source).await? {
        // Rolling back or committing is the same here: nothing was written.
        tx.rollback().await?;
        return Ok(Applied::Duplicate);
    }
    if let Some(entry) = &event.entry {
        LedgerStore::apply(&tx, entry).await?;
    }
    tx.commit().await?;
    Ok(Applied::Applied)
}

fn consumer_config(args: &RunArgs) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.kafka_brokers)
        .set("group.id", &args.group_id)
        .set("client.id", "charges-consumer")
        // Offsets are ours to commit, and only after the database commit.
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", args.offset_reset.as_str());
    for (key, value) in &args.kafka_config {
        config.set(key, value);
    }
    config
}

/// Commits the stored offsets. "Nothing stored" is not an error; any other failure is
/// only logged: the next commit covers the same offsets, and until then a crash costs
/// redeliveries, which the inbox absorbs.
fn commit(consumer: &StreamConsumer, mode: CommitMode) {
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
        &database.database_url,
        &database.pool_settings("charges-consumer", 2),
    )
    .await?;
    if args.migrate {
        migrations::run(&pool).await?;
    }
    let consumer: StreamConsumer = consumer_config(&args).create()?;
    consumer.subscribe(&[args.topic.as_str()])?;
    let signal = charges_runtime::shutdown_signal().map_err(ConsumerError::Signal)?;
    tokio::pin!(signal);
    tracing::info!(
        topic = %args.topic,
        group = %args.group_id,
        brokers = %args.kafka_brokers,
        "consumer started"
    );

    // Offsets stored since the last commit, and when the next commit is due.
    let mut uncommitted = false;
    let mut next_commit = Instant::now() + args.commit_interval;
    loop {
        let message = tokio::select! {
            name = &mut signal => {
                tracing::info!(signal = name, "shutting down");
                break;
            }
            () = tokio::time::sleep_until(next_commit), if uncommitted => {
                commit(&consumer, CommitMode::Async);
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
        let Some(()) = process(&pool, &message, &args.topic, &mut signal).await else {
            tracing::info!("shutting down before this message was applied; it will be redelivered");
            break;
        };
        // Only now, after the database commit, may Kafka hear that the message is done.
        consumer.store_offset_from_message(&message)?;
        if !uncommitted {
            next_commit = Instant::now() + args.commit_interval;
            uncommitted = true;
        }
        if Instant::now() >= next_commit {
            commit(&consumer, CommitMode::Async);
            uncommitted = false;
        }
    }
    commit(&consumer, CommitMode::Sync);
    tracing::info!("consumer stopped");
    Ok(())
}

/// Applies one message, retrying database failures until they pass. `None`: a
/// shutdown signal came first, and nothing was applied.
async fn process(
    pool: &Pool,
    message: &BorrowedMessage<'_>,
    topic: &str,
    signal: &mut (impl Future<Output = &'static str> + Unpin),
) -> Option<()> {
    let header = |name: &str| {
        message
            .headers()
            .and_then(|headers| headers.iter().find(|h| h.key == name))
            .and_then(|h| h.value)
    };
    let (partition, offset) = (message.partition(), message.offset());
    let event = match decode(
        header("id"),
        header("ce_type"),
        message.payload().unwrap_or_default(),
    ) {
        Ok(event) => event,
        Err(poison) => {
            // It can never be applied, and retrying would stop the partition for good:
            // skip it, loudly, for an operator to look at.
            tracing::error!(partition, offset, error = %poison, "skipping a message that cannot be processed");
            return Some(());
        }
    };
    let source = Source {
        topic,
        partition,
        offset,
    };
    let mut delay = Duration::from_millis(100);
    loop {
        match apply(pool, &event, source).await {
            Ok(Applied::Applied) => {
                tracing::info!(id = %event.id, event_type = %event.event_type, partition, offset, "event applied");
                return Some(());
            }
            Ok(Applied::Duplicate) => {
                tracing::info!(id = %event.id, event_type = %event.event_type, partition, offset, "duplicate event skipped");
                return Some(());
            }
            Err(e) => {
                tracing::error!(id = %event.id, error = %error_chain(&e), ?delay, "applying the event failed; retrying");
                tokio::select! {
                    _ = &mut *signal => return None,
                    () = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// `charges-consumer tail`: prints `partition offset id ce_type` per message.
pub async fn tail(args: TailArgs) -> Result<(), ConsumerError> {
    tokio::task::spawn_blocking(move || tail_blocking(&args))
        .await
        .map_err(|e| ConsumerError::Output(std::io::Error::other(e)))?
}

fn tail_blocking(args: &TailArgs) -> Result<(), ConsumerError> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.kafka_brokers)
        // A group id of its own that never commits: tail reads, it never moves a group.
        .set(
            "group.id",
            format!("charges-consumer-tail-{}", Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(&args.topic), Duration::from_secs(10))?;
    let start = if args.from_beginning {
        Offset::Beginning
    } else {
        Offset::End
    };
    let mut assignment = TopicPartitionList::new();
    for topic in metadata.topics() {
        for partition in topic.partitions() {
            assignment.add_partition_offset(topic.name(), partition.id(), start)?;
        }
    }
    consumer.assign(&assignment)?;
    let mut out = std::io::stdout().lock();
    let mut idle_since = std::time::Instant::now();
    while idle_since.elapsed() < args.until_idle {
        let Some(result) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = result?;
        idle_since = std::time::Instant::now();
        let header = |name: &str| {
            message
                .headers()
                .and_then(|headers| headers.iter().find(|h| h.key == name))
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_else(|| "-".to_owned())
        };
        writeln!(
            out,
            "{}\t{}\t{}\t{}",
            message.partition(),
            message.offset(),
            header("id"),
            header("ce_type")
        )
        .map_err(ConsumerError::Output)?;
    }
    out.flush().map_err(ConsumerError::Output)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_both_event_types_and_refuses_what_cannot_be_deduplicated() {
        let id = "0190d5b0-0000-7000-8000-000000000001";
        let created = br#"{"eventId":"0190d5b0-0000-7000-8000-000000000001","chargeId":"0190d5b0-0000-7000-8000-000000000002","amountCents":4900,"currency":"EUR","occurredAt":"2025-01-01T00:00:00Z"}"#;
        let event = decode(Some(id.as_bytes()), Some(b"ChargeCreated"), created).unwrap();
        assert_eq!(event.entry.unwrap().charged_cents, 4900);
        let refunded = br#"{"eventId":"0190d5b0-0000-7000-8000-000000000003","chargeId":"0190d5b0-0000-7000-8000-000000000002","refundId":"0190d5b0-0000-7000-8000-000000000004","amountCents":900,"currency":"EUR","refundedCents":900,"occurredAt":"2025-01-01T00:00:00Z"}"#;
        let event = decode(Some(id.as_bytes()), Some(b"ChargeRefunded"), refunded).unwrap();
        assert_eq!(event.entry.unwrap().refunded_cents, 900);
        let unknown = decode(Some(id.as_bytes()), Some(b"ChargeDisputed"), b"{}").unwrap();
        assert_eq!(unknown.entry, None);
        assert!(matches!(
            decode(None, Some(b"ChargeCreated"), created),
            Err(Poison::NoId)
        ));
        assert!(matches!(
            decode(Some(b"42"), Some(b"ChargeCreated"), created),
            Err(Poison::BadId)
        ));
        assert!(matches!(
            decode(Some(id.as_bytes()), Some(b"ChargeCreated"), b"{}"),
            Err(Poison::BadPayload { .. })
        ));
    }
}

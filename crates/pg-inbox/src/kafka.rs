//! The consume loop for rdkafka (feature `kafka`): receive a message, process it
//! through the inbox, and only then commit its offset.

use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_postgres::{Pool, Transaction};
use pg_plumbing::StoreError;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use tokio::sync::watch;
use uuid::Uuid;

use crate::{Delivery, Inbox, Processed, Source};

/// What [`consume`] did so far (for a service's metrics and its tests).
#[derive(Debug, Default)]
pub struct Consumed {
    pub applied: AtomicU64,
    pub duplicates: AtomicU64,
    /// Messages without a readable `id` header: they can never be deduplicated, so
    /// they are logged and skipped, never applied.
    pub unreadable: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum ConsumeError<E> {
    #[error("the consumer failed")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The effect or the inbox failed; the offset was not committed, so the message
    /// is read again after a restart.
    #[error("processing a message failed")]
    Process(#[source] E),
}

/// The delivery a message carries: its `id` header (the producer's outbox id) and its
/// `ce_type` header (else `unknown`). `None` without a readable id.
pub fn delivery<'m>(message: &'m BorrowedMessage<'m>) -> Option<Delivery<'m>> {
    let header = |name: &str| {
        let headers = message.headers()?;
        let value = headers.iter().find(|h| h.key == name)?.value?;
        std::str::from_utf8(value).ok()
    };
    Some(Delivery {
        id: Uuid::parse_str(header("id")?).ok()?,
        event_type: header("ce_type").unwrap_or("unknown"),
        source: Source {
            topic: message.topic(),
            partition: message.partition(),
            offset: message.offset(),
        },
    })
}

/// Until `shutdown`: each message's `effect` (given its payload) runs once per event id,
/// in one transaction with the inbox row, and its offset is committed after that
/// transaction. An error stops the loop with the offset uncommitted: the caller
/// decides whether to retry or exit (a restart reads the message again).
pub async fn consume<E>(
    pool: &Pool,
    consumer: &StreamConsumer,
    consumed: &Consumed,
    mut shutdown: watch::Receiver<bool>,
    effect: impl AsyncFn(&Transaction<'_>, &[u8]) -> Result<(), E>,
) -> Result<(), ConsumeError<E>>
where
    E: From<StoreError>,
{
    loop {
        let message = tokio::select! {
            message = consumer.recv() => message?,
            _ = shutdown.changed() => return Ok(()),
        };
        let counter = match delivery(&message) {
            Some(delivery) => {
                let payload = message.payload().unwrap_or_default();
                let processed =
                    Inbox::process(pool, &delivery, async |tx| effect(tx, payload).await)
                        .await
                        .map_err(ConsumeError::Process)?;
                match processed {
                    Processed::Applied(()) => &consumed.applied,
                    Processed::Duplicate => &consumed.duplicates,
                }
            }
            None => {
                tracing::error!(
                    partition = message.partition(),
                    offset = message.offset(),
                    "message without a readable id header skipped"
                );
                &consumed.unreadable
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        consumer.commit_message(&message, CommitMode::Async)?;
    }
}

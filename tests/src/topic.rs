//! Writing to a test topic as the relay does, and reading it to its end: what a
//! negative check ("nothing else was published") waits for instead of a fixed sleep.
//! (Beside kafka.rs, which is being reworked elsewhere; they belong together.)

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use uuid::Uuid;

use crate::DEADLINE;
use crate::kafka::{TestKafka, TopicReader};

/// Publishes one event as the relay does: key and header `id` = the event id, the
/// CloudEvents headers, and the JSON payload.
pub async fn produce(kafka: &TestKafka, id: Uuid, event_type: &str, payload: &str) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &kafka.bootstrap)
        .set("message.timeout.ms", "10000")
        .create()
        .expect("producer");
    let id = id.to_string();
    let headers = [
        ("id", id.as_str()),
        ("ce_specversion", "1.0"),
        ("ce_id", id.as_str()),
        ("ce_type", event_type),
        ("ce_source", "urn:charges"),
        ("ce_time", "2025-01-01T00:00:00.000000Z"),
        ("content-type", "application/json"),
    ]
    .into_iter()
    .fold(OwnedHeaders::new(), |headers, (key, value)| {
        headers.insert(Header {
            key,
            value: Some(value),
        })
    });
    producer
        .send(
            FutureRecord::to(&kafka.topic)
                .key(id.as_str())
                .payload(payload)
                .headers(headers),
            Duration::from_secs(10),
        )
        .await
        .unwrap_or_else(|(e, _)| panic!("produce {id}: {e}"));
}

/// `(partition, low, high)` watermarks of every partition of the topic, as the broker
/// reports them now.
async fn watermarks(kafka: &TestKafka) -> Vec<(i32, i64, i64)> {
    let (bootstrap, topic, partitions) = (
        kafka.bootstrap.clone(),
        kafka.topic.clone(),
        kafka.partitions,
    );
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()
            .expect("consumer for the watermarks");
        (0..partitions)
            .map(|partition| {
                let (low, high) = consumer
                    .fetch_watermarks(&topic, partition, Duration::from_secs(10))
                    .unwrap_or_else(|e| panic!("watermarks of {topic}/{partition}: {e}"));
                (partition, low, high)
            })
            .collect()
    })
    .await
    .expect("fetch the watermarks")
}

/// Reads until `reader` holds every message the topic holds now (up to each partition's
/// high watermark). Once no producer is left, that is everything that will ever be
/// published.
pub async fn read_to_end(kafka: &TestKafka, reader: &mut TopicReader) {
    let ends = watermarks(kafka).await;
    reader
        .read_until(
            DEADLINE,
            "every message up to the end of the topic",
            |read| {
                ends.iter().all(|(partition, low, high)| {
                    low >= high
                        || read
                            .iter()
                            .any(|m| m.partition == *partition && m.offset + 1 >= *high)
                })
            },
        )
        .await;
}

//! Writing to a test topic as the relay does. (Beside kafka.rs, which is being reworked
//! elsewhere; they belong together.)

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use uuid::Uuid;

use crate::kafka::TestKafka;

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

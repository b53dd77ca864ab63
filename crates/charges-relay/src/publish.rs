//! The Kafka side: the producer's settings and the message an outbox row becomes.

use std::time::Duration;

use charges_store::PendingEvent;
use chrono::SecondsFormat;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use charges_domain::EventType;
use charges_runtime::secrets::{ExposeSecret, SecretString};
use charges_runtime::telemetry;
use charges_runtime::trace::TraceParent;

use crate::broker::BrokerHealth;
use crate::config::MessageKey;
use crate::failure::PublishError;

/// Builds the producer: idempotent (no duplicates from its own retries), `acks=all`
/// (an ack means every in-sync replica has the message), and `message.timeout.ms` =
/// `publish_timeout`, so that every delivery future resolves within it. `extra` is
/// applied last (`--kafka-config`).
pub fn producer(
    brokers: &str,
    publish_timeout: Duration,
    extra: &[(String, SecretString)],
) -> Result<FutureProducer, rdkafka::error::KafkaError> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("client.id", "charges-relay")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        // The relay hands librdkafka a whole batch at once and waits for every ack
        // before its next claim: lingering for more messages only delays the batch
        // (5 ms by default; measured: about 7 % of the relay's throughput).
        .set("linger.ms", "0")
        // The relay writes to every partition, so it needs every partition leader's
        // connection anyway. Sparse connections would hold the first one back by
        // half of `reconnect.backoff.ms` after the bootstrap connection: measured, a
        // relay's first mark came 67 ms after its launch, and 35 ms without.
        .set("enable.sparse.connections", "false")
        // A broker connection whose peer vanished (a partition) is noticed by TCP too,
        // not only by librdkafka's request timeouts.
        .set("socket.keepalive.enable", "true")
        .set(
            "message.timeout.ms",
            publish_timeout.as_millis().max(1).to_string(),
        );
    for (key, value) in extra {
        config.set(key, value.expose_secret());
    }
    config.create()
}

/// The relay's producer, and a new one when the old one is stuck.
///
/// An idempotent producer whose state the broker no longer accepts (fenced after
/// in-flight messages timed out during an outage, an out-of-order sequence, …) fails
/// every later message, or librdkafka declares it fatally broken. Nothing is wrong with
/// the messages or the broker; the cure is a new producer (a new producer id), which
/// this builds and swaps in. Batches still waiting on the old one finish with its
/// errors (availability errors, so no row moves towards dead) and their rows are
/// published by the new one. (Found against tansu: after an outage every message
/// failed with `ProducerFenced` until the relay restarted.)
pub struct Producers {
    brokers: String,
    publish_timeout: Duration,
    extra: Vec<(String, SecretString)>,
    current: std::sync::RwLock<FutureProducer>,
}

impl Producers {
    pub fn new(
        brokers: &str,
        publish_timeout: Duration,
        extra: &[(String, SecretString)],
    ) -> Result<Producers, rdkafka::error::KafkaError> {
        Ok(Producers {
            current: std::sync::RwLock::new(producer(brokers, publish_timeout, extra)?),
            brokers: brokers.to_owned(),
            publish_timeout,
            extra: extra.to_vec(),
        })
    }

    /// The producer to use now (a cheap handle).
    pub fn current(&self) -> FutureProducer {
        match self.current.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces `used` if it is stuck (`stuck`: one of its messages failed with a
    /// producer-state error) or librdkafka declared it fatally broken, unless another
    /// batch replaced it already.
    pub fn renew_if_stuck(&self, used: &FutureProducer, stuck: Option<&str>) {
        let (code, reason) = match (used.client().fatal_error(), stuck) {
            (Some((code, reason)), _) => (Some(code), reason),
            (None, Some(error)) => (None, error.to_owned()),
            (None, None) => return,
        };
        let mut current = match self.current.write() {
            Ok(current) => current,
            Err(poisoned) => poisoned.into_inner(),
        };
        if current.client().native_ptr() != used.client().native_ptr() {
            return;
        }
        match producer(&self.brokers, self.publish_timeout, &self.extra) {
            Ok(fresh) => {
                tracing::warn!(?code, %reason, "the Kafka producer is stuck: replaced by a new one");
                *current = fresh;
            }
            Err(error) => {
                tracing::error!(?code, %reason, %error, "the Kafka producer is stuck and a new one could not be made; retrying after the next batch")
            }
        }
    }
}

/// What every message of one relay shares.
#[derive(Debug, Clone)]
pub struct MessageSettings {
    /// Where events go whose aggregate type has no route of its own.
    pub topic: String,
    /// `(aggregate type, topic)`: `--topic-for charge=charges.events`.
    pub routes: Vec<(String, String)>,
    pub key: MessageKey,
    pub event_source: String,
}

impl MessageSettings {
    /// The topic an event of `aggregate_type` goes to.
    pub fn topic_for(&self, aggregate_type: &str) -> &str {
        self.routes
            .iter()
            .find(|(kind, _)| kind == aggregate_type)
            .map_or(self.topic.as_str(), |(_, topic)| topic.as_str())
    }
}

/// Headers of one event: `id` (what consumers deduplicate on), the CloudEvents Kafka
/// binary binding (`ce_*`, `content-type`; `ce_type` namespaced, `ce_dataschema` the
/// `$id` of the payload's JSON Schema, `ce_subject` the aggregate's id, `ce_sequence`
/// the sequence extension: the event's place among its aggregate's events, as decimal
/// digits), `aggregate_type` and `aggregate_id`, and where it came from: W3C
/// `traceparent`/`tracestate` and the API's `request_id`.
pub fn headers(event: &PendingEvent, source: &str, trace_parent: Option<&str>) -> OwnedHeaders {
    let id = event.id.to_string();
    let aggregate_id = event.aggregate_id.to_string();
    let time = event
        .created_at
        .to_rfc3339_opts(SecondsFormat::Micros, true);
    let sequence = event.sequence.map(|s| s.to_string());
    let known = EventType::parse(&event.event_type);
    // An event type this relay does not know is sent as stored: its writer chose it.
    let ce_type: &str = match known {
        Some(known) => known.cloud_event_type(),
        None => &event.event_type,
    };
    [
        ("id", Some(id.as_str())),
        ("ce_specversion", Some("1.0")),
        ("ce_id", Some(id.as_str())),
        ("ce_type", Some(ce_type)),
        ("ce_source", Some(source)),
        ("ce_subject", Some(aggregate_id.as_str())),
        ("ce_time", Some(time.as_str())),
        ("ce_dataschema", known.map(EventType::data_schema)),
        // Rows written before migration V6 have none.
        ("ce_sequence", sequence.as_deref()),
        ("content-type", Some("application/json")),
        ("aggregate_type", Some(event.aggregate_type.as_str())),
        ("aggregate_id", Some(aggregate_id.as_str())),
        ("traceparent", trace_parent),
        (
            "tracestate",
            trace_parent.and(event.origin.trace_state.as_deref()),
        ),
        ("request_id", event.origin.request_id.as_deref()),
    ]
    .into_iter()
    .filter_map(|(key, value)| Some((key, value?)))
    .fold(
        OwnedHeaders::new_with_capacity(16),
        |headers, (key, value)| {
            headers.insert(Header {
                key,
                value: Some(value),
            })
        },
    )
}

/// The `traceparent` a message carries, and the span (when spans are exported) that
/// lives while the message is in flight: a child of the span that wrote the event.
/// Without export the stored `traceparent` goes on as it is, so the consumer's work
/// becomes a child of the writer's.
fn publish_span(event: &PendingEvent, topic: &str) -> (Option<String>, Option<tracing::Span>) {
    let parent = event
        .origin
        .trace_parent
        .as_deref()
        .and_then(TraceParent::parse);
    if !telemetry::exporting() {
        return (parent.map(|p| p.to_string()), None);
    }
    let span =
        tracing::info_span!("publish", event_id = %event.id, topic, event_type = %event.event_type);
    let position = telemetry::start_span(&span, parent);
    (Some(position.to_string()), Some(span))
}

/// Publishes `events` concurrently and waits for every acknowledgement, at most
/// `deadline` in all, and no longer than until an outage is declared (by this batch or
/// another). Returns one result per event, in order: `Ok` only for a message the
/// broker acknowledged; an event still unacknowledged when the wait ends is an
/// availability error (it may still arrive: at least once, never "at most once").
pub async fn publish_batch(
    producer: &FutureProducer,
    settings: &MessageSettings,
    events: &[PendingEvent],
    deadline: Duration,
    health: &BrokerHealth,
) -> Vec<Result<(), PublishError>> {
    let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; events.len()];
    let in_flight = FuturesUnordered::new();
    for (index, event) in events.iter().enumerate() {
        let key = match settings.key {
            MessageKey::OutboxId => event.id.to_string(),
            MessageKey::AggregateId => event.aggregate_id.to_string(),
        };
        let topic = settings.topic_for(&event.aggregate_type);
        let (trace_parent, span) = publish_span(event, topic);
        let record = FutureRecord::to(topic)
            .key(key.as_str())
            .payload(event.payload.as_str())
            .headers(headers(
                event,
                &settings.event_source,
                trace_parent.as_deref(),
            ));
        // `send_result` only enqueues; it never waits (a full local queue is an
        // availability error, retried).
        match producer.send_result(record) {
            Ok(delivery) => in_flight.push(async move {
                let delivered = delivery.await;
                drop(span);
                (index, delivered)
            }),
            Err((error, _record)) => results[index] = Some(Err(PublishError::from_kafka(&error))),
        }
    }
    let acknowledgements = async {
        let mut in_flight = in_flight;
        while let Some((index, delivered)) = in_flight.next().await {
            results[index] = Some(match delivered {
                Ok(Ok(_delivery)) => Ok(()),
                Ok(Err((error, _message))) => Err(PublishError::from_kafka(&error)),
                Err(_canceled) => Err(PublishError::unavailable(
                    "the producer dropped the message",
                )),
            });
        }
    };
    let cut_short = tokio::select! {
        () = acknowledgements => None,
        () = tokio::time::sleep(deadline) => Some(format!("no acknowledgement within {deadline:?}")),
        () = health.wait_unavailable() => Some("no acknowledgement before the broker was declared unavailable".to_owned()),
    };
    results
        .into_iter()
        .map(|result| {
            result.unwrap_or_else(|| {
                Err(PublishError::unavailable(
                    cut_short.clone().unwrap_or_default(),
                ))
            })
        })
        .collect()
}

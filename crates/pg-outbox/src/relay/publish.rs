//! The Kafka side: the producer's settings and the message an outbox row becomes.

use std::sync::Arc;
use std::time::Duration;

use chrono::SecondsFormat;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use secrecy::{ExposeSecret, SecretString};

use crate::PendingEvent;
use crate::relay::broker::BrokerHealth;
use crate::relay::failure::PublishError;
use crate::relay::hooks::{
    EventCatalog, ForwardTraceParent, NoCatalog, PublishTrace, PublishTracing,
};

/// What the relay's producer is made of.
#[derive(Debug, Clone)]
pub struct ProducerSettings {
    /// `bootstrap.servers`: comma separated.
    pub brokers: String,
    /// `client.id`: how the brokers' logs and quotas name this relay.
    pub client_id: String,
    /// `message.timeout.ms`: every delivery is answered within it.
    pub publish_timeout: Duration,
    /// librdkafka settings applied after the relay's own, so they can override them
    /// (`security.protocol`, `sasl.password`, …): secrets among them stay unprinted.
    pub extra: Vec<(String, SecretString)>,
}

impl ProducerSettings {
    /// `brokers` as `client_id`, with the reference relay's 5 s publish timeout and no
    /// extra settings.
    pub fn new(brokers: impl Into<String>, client_id: impl Into<String>) -> ProducerSettings {
        ProducerSettings {
            brokers: brokers.into(),
            client_id: client_id.into(),
            publish_timeout: Duration::from_secs(5),
            extra: Vec::new(),
        }
    }
}

/// Builds the producer: idempotent (no duplicates from its own retries), `acks=all`
/// (an ack means every in-sync replica has the message), and `message.timeout.ms` =
/// `publish_timeout`, so that every delivery future resolves within it. `extra` is
/// applied last.
pub fn producer(settings: &ProducerSettings) -> Result<FutureProducer, rdkafka::error::KafkaError> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.brokers)
        .set("client.id", &settings.client_id)
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
            settings.publish_timeout.as_millis().max(1).to_string(),
        );
    for (key, value) in &settings.extra {
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
    settings: ProducerSettings,
    current: std::sync::RwLock<FutureProducer>,
}

impl Producers {
    pub fn new(settings: ProducerSettings) -> Result<Producers, rdkafka::error::KafkaError> {
        Ok(Producers {
            current: std::sync::RwLock::new(producer(&settings)?),
            settings,
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
        match producer(&self.settings) {
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

/// Which id keys a message, and so picks its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKey {
    /// The outbox id: spreads events evenly over partitions; no ordering between
    /// events of one aggregate.
    OutboxId,
    /// The aggregate's id: all events of one aggregate land on one partition, in
    /// publish order (needed with [`RelaySettings::ordered`]).
    ///
    /// [`RelaySettings::ordered`]: crate::relay::RelaySettings::ordered
    AggregateId,
}

/// What every message of one relay shares.
#[derive(Clone)]
pub struct MessageSettings {
    /// Where events go whose aggregate type has no route of its own.
    pub topic: String,
    /// `(aggregate type, topic)`: events of these aggregate types go to their own topic.
    pub routes: Vec<(String, String)>,
    pub key: MessageKey,
    /// The CloudEvents `source` attribute (header `ce_source`).
    pub event_source: String,
    /// The CloudEvents names of the service's event types.
    pub catalog: Arc<dyn EventCatalog>,
    /// The trace context of each message.
    pub tracing: Arc<dyn PublishTracing>,
}

impl std::fmt::Debug for MessageSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageSettings")
            .field("topic", &self.topic)
            .field("routes", &self.routes)
            .field("key", &self.key)
            .field("event_source", &self.event_source)
            .finish_non_exhaustive()
    }
}

impl MessageSettings {
    /// Every event to `topic`, keyed by its outbox id, under `event_source`, with its
    /// stored event type and `traceparent`: no routes, [`NoCatalog`],
    /// [`ForwardTraceParent`].
    pub fn new(topic: impl Into<String>, event_source: impl Into<String>) -> MessageSettings {
        MessageSettings {
            topic: topic.into(),
            routes: Vec::new(),
            key: MessageKey::OutboxId,
            event_source: event_source.into(),
            catalog: Arc::new(NoCatalog),
            tracing: Arc::new(ForwardTraceParent),
        }
    }

    /// The topic an event of `aggregate_type` goes to.
    pub fn topic_for(&self, aggregate_type: &str) -> &str {
        self.routes
            .iter()
            .find(|(kind, _)| kind == aggregate_type)
            .map_or(self.topic.as_str(), |(_, topic)| topic.as_str())
    }
}

/// Headers of one event: `id` (what consumers deduplicate on), the CloudEvents Kafka
/// binary binding (`ce_*`, `content-type`; `ce_type` and `ce_dataschema` (the `$id` of
/// the payload's JSON Schema) as `catalog` names them, `ce_subject` the aggregate's id,
/// `ce_sequence` the sequence extension: the event's place among its aggregate's
/// events, as decimal digits), `aggregate_type` and `aggregate_id`, and where it came
/// from: W3C `traceparent`/`tracestate` and the writer's `request_id`.
pub fn headers(
    event: &PendingEvent,
    catalog: &dyn EventCatalog,
    source: &str,
    trace_parent: Option<&str>,
) -> OwnedHeaders {
    let id = event.id.to_string();
    let aggregate_id = event.aggregate_id.to_string();
    let time = event
        .created_at
        .to_rfc3339_opts(SecondsFormat::Micros, true);
    let sequence = event.sequence.map(|s| s.to_string());
    let known = catalog.cloud_event(&event.event_type);
    // An event type this relay does not know is sent as stored: its writer chose it.
    let ce_type: &str = match &known {
        Some(known) => &known.ce_type,
        None => &event.event_type,
    };
    let data_schema = known
        .as_ref()
        .and_then(|known| known.data_schema.as_deref());
    [
        ("id", Some(id.as_str())),
        ("ce_specversion", Some("1.0")),
        ("ce_id", Some(id.as_str())),
        ("ce_type", Some(ce_type)),
        ("ce_source", Some(source)),
        ("ce_subject", Some(aggregate_id.as_str())),
        ("ce_time", Some(time.as_str())),
        ("ce_dataschema", data_schema),
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
        let PublishTrace { traceparent, span } = settings.tracing.publish(event, topic);
        let record = FutureRecord::to(topic)
            .key(key.as_str())
            .payload(event.payload.as_str())
            .headers(headers(
                event,
                settings.catalog.as_ref(),
                &settings.event_source,
                traceparent.as_deref(),
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

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use rdkafka::message::Headers;
    use uuid::Uuid;

    use super::*;
    use crate::Origin;
    use crate::relay::hooks::CloudEventType;

    fn event(event_type: &str) -> PendingEvent {
        PendingEvent {
            id: Uuid::nil(),
            aggregate_type: "order".to_owned(),
            aggregate_id: Uuid::max(),
            event_type: event_type.to_owned(),
            sequence: Some(2),
            payload: "{}".to_owned(),
            created_at: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap_or_default(),
            attempts: 0,
            rejections: 0,
            origin: Origin::default(),
        }
    }

    fn pairs(headers: &OwnedHeaders) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|h| {
                let value = h.value.map(String::from_utf8_lossy).unwrap_or_default();
                (h.key.to_owned(), value.into_owned())
            })
            .collect()
    }

    fn value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
        pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    struct Orders;

    impl EventCatalog for Orders {
        fn cloud_event(&self, event_type: &str) -> Option<CloudEventType> {
            (event_type == "OrderPlaced").then_some(CloudEventType {
                ce_type: Cow::Borrowed("com.example.order.placed"),
                data_schema: Some(Cow::Borrowed("urn:example:order-placed:v1")),
            })
        }
    }

    #[test]
    fn an_event_type_the_catalog_knows_gets_its_cloud_events_names() {
        let headers = pairs(&headers(&event("OrderPlaced"), &Orders, "urn:x", None));
        assert_eq!(value(&headers, "ce_type"), Some("com.example.order.placed"));
        assert_eq!(
            value(&headers, "ce_dataschema"),
            Some("urn:example:order-placed:v1")
        );
        assert_eq!(value(&headers, "ce_sequence"), Some("2"));
        assert_eq!(value(&headers, "traceparent"), None);
    }

    #[test]
    fn an_unknown_event_type_goes_out_as_stored_without_a_schema() {
        for catalog in [&Orders as &dyn EventCatalog, &NoCatalog] {
            let headers = pairs(&headers(&event("OrderShipped"), catalog, "urn:x", None));
            assert_eq!(value(&headers, "ce_type"), Some("OrderShipped"));
            assert_eq!(value(&headers, "ce_dataschema"), None);
        }
    }
}

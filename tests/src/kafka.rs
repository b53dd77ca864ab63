//! A Kafka for one test: a topic of its own on librdkafka's in-process mock cluster, on
//! a tansu broker of the test's own ([`TestKafka::tansu`]), on a broker container of the
//! test's own with `TEST_SERVICES=containers` ([`crate::containers::broker`]), or on the
//! real broker at `KAFKA_BROKERS` when that is set. Read back with a consumer that `assign()`s every
//! partition from the beginning (no consumer group, so no rebalance wait).
//!
//! Outages ([`TestKafka::refuse`], [`TestKafka::hang`], [`TestKafka::restore`]) work on
//! the mock and on tansu. Request-level fault injection (`request_errors`) only exists
//! on the mock: [`TestKafka::mock`] is `None` otherwise, and tests that need it skip.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::message::{Headers, Message};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use uuid::Uuid;

use crate::DEADLINE;
use crate::tansu::TestTansu;

pub type Mock = MockCluster<'static, DefaultProducerContext>;

fn new_topic_name() -> String {
    format!("relay-test-{}", Uuid::new_v4().simple())
}

/// The broker behind a [`TestKafka`].
enum Broker {
    Mock(Mock),
    Tansu(Box<TestTansu>),
    /// `KAFKA_BROKERS`: someone else's, no fault injection.
    External,
    /// A container of the test's own (`TEST_SERVICES=containers`), no fault injection;
    /// held to be removed with the topic.
    Container(#[allow(dead_code)] crate::containers::Held),
}

/// One topic for one test. Keep it alive for as long as any client (the relay
/// process included) talks to it: dropping it stops the mock cluster or tansu.
pub struct TestKafka {
    broker: Broker,
    pub bootstrap: String,
    pub topic: String,
    pub partitions: i32,
}

/// Which broker a test runs against, for tests that run on both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    Mock,
    Tansu,
}

impl TestKafka {
    /// A fresh topic with `partitions` partitions: on `KAFKA_BROKERS` when set, else on
    /// a broker container with `TEST_SERVICES=containers`, else on librdkafka's mock
    /// cluster.
    pub async fn new(partitions: i32) -> TestKafka {
        match std::env::var("KAFKA_BROKERS") {
            Ok(bootstrap) if !bootstrap.is_empty() => {
                Self::on_real_broker(Broker::External, bootstrap, partitions).await
            }
            _ if crate::containers::requested() => {
                let (container, bootstrap) = crate::containers::broker().await;
                Self::on_real_broker(Broker::Container(container), bootstrap, partitions).await
            }
            _ => {
                let topic = new_topic_name();
                let mock = MockCluster::new(1).expect("start the Kafka mock cluster");
                mock.create_topic(&topic, partitions, 1)
                    .expect("create topic on the mock cluster");
                TestKafka {
                    bootstrap: mock.bootstrap_servers(),
                    broker: Broker::Mock(mock),
                    topic,
                    partitions,
                }
            }
        }
    }

    /// A fresh topic on a tansu broker of this test's own.
    pub async fn tansu(partitions: i32) -> TestKafka {
        let tansu = TestTansu::start().await;
        let bootstrap = tansu.bootstrap();
        Self::on_real_broker(Broker::Tansu(Box::new(tansu)), bootstrap, partitions).await
    }

    /// [`TestKafka::new`] for the mock, [`TestKafka::tansu`] for tansu.
    pub async fn of(kind: BrokerKind, partitions: i32) -> TestKafka {
        match kind {
            BrokerKind::Mock => Self::new(partitions).await,
            BrokerKind::Tansu => Self::tansu(partitions).await,
        }
    }

    /// A fresh topic on the broker at `bootstrap`, which someone else runs (a container
    /// of the test's, for example): no fault injection.
    pub async fn on(bootstrap: String, partitions: i32) -> TestKafka {
        Self::on_real_broker(Broker::External, bootstrap, partitions).await
    }

    async fn on_real_broker(broker: Broker, bootstrap: String, partitions: i32) -> TestKafka {
        let topic = new_topic_name();
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()
            .expect("Kafka admin client");
        let results = admin
            .create_topics(
                &[NewTopic::new(
                    &topic,
                    partitions,
                    TopicReplication::Fixed(1),
                )],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
            )
            .await
            .expect("create topic");
        for result in results {
            result.unwrap_or_else(|(name, e)| panic!("create topic {name}: {e}"));
        }
        TestKafka {
            broker,
            bootstrap,
            topic,
            partitions,
        }
    }

    /// The mock cluster, for fault injection; `None` against a real broker.
    pub fn mock(&self) -> Option<&Mock> {
        match &self.broker {
            Broker::Mock(mock) => Some(mock),
            _ => None,
        }
    }

    /// The broker refuses connections (and drops the open ones) until [`restore`].
    ///
    /// [`restore`]: TestKafka::restore
    pub fn refuse(&self) {
        match &self.broker {
            Broker::Mock(mock) => mock.broker_down(1).expect("mock broker down"),
            Broker::Tansu(tansu) => tansu.proxy.refuse(),
            Broker::External | Broker::Container(_) => {
                panic!("no fault injection on KAFKA_BROKERS or a broker container")
            }
        }
    }

    /// The broker keeps its connections but answers nothing until [`restore`].
    ///
    /// [`restore`]: TestKafka::restore
    pub fn hang(&self) {
        match &self.broker {
            // Every answer 10 s late: far beyond every timeout a test gives the relay
            // (publish timeout ≤ 2 s), and after `restore` the answers still in
            // flight arrive within that. (An hour would hold every connection's later
            // answers, which Kafka sends in order, for the hour.)
            Broker::Mock(mock) => mock
                .broker_round_trip_time(1, Duration::from_secs(10))
                .expect("mock broker rtt"),
            Broker::Tansu(tansu) => tansu.hang(),
            Broker::External | Broker::Container(_) => {
                panic!("no fault injection on KAFKA_BROKERS or a broker container")
            }
        }
    }

    /// Undoes [`TestKafka::refuse`] and [`TestKafka::hang`].
    pub fn restore(&self) {
        match &self.broker {
            Broker::Mock(mock) => {
                mock.broker_round_trip_time(1, Duration::ZERO)
                    .expect("mock broker rtt");
                mock.broker_up(1).expect("mock broker up");
            }
            Broker::Tansu(tansu) => {
                tansu.resume();
                tansu.proxy.pass();
            }
            Broker::External | Broker::Container(_) => {
                panic!("no fault injection on KAFKA_BROKERS or a broker container")
            }
        }
    }

    /// A reader of this topic from its first offset.
    pub fn reader(&self) -> TopicReader {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set(
                "group.id",
                format!("relay-test-reader-{}", Uuid::new_v4().simple()),
            )
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("Kafka consumer");
        let mut assignment = TopicPartitionList::new();
        for partition in 0..self.partitions {
            assignment
                .add_partition_offset(&self.topic, partition, Offset::Beginning)
                .expect("add partition");
        }
        consumer.assign(&assignment).expect("assign partitions");
        TopicReader {
            consumer,
            messages: Vec::new(),
        }
    }
}

/// One message as read back.
#[derive(Debug, Clone)]
pub struct Received {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub payload: Option<String>,
    pub headers: BTreeMap<String, String>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// Everything read from the topic so far.
pub struct TopicReader {
    consumer: BaseConsumer,
    pub messages: Vec<Received>,
}

impl TopicReader {
    /// Reads whatever is available right now, without blocking the runtime.
    pub fn drain(&mut self) {
        while let Some(result) = self.consumer.poll(Duration::ZERO) {
            let message = result.expect("consume");
            let headers: BTreeMap<String, String> = message
                .headers()
                .map(|headers| {
                    headers
                        .iter()
                        .map(|h| {
                            (
                                h.key.to_owned(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            // Every event a test sees is checked against the schema it claims.
            if let Some(schema) = headers.get("ce_dataschema") {
                crate::schemas::validate(schema, message.payload().unwrap_or_default())
                    .unwrap_or_else(|e| panic!("an event on the topic breaks its schema: {e}"));
            }
            self.messages.push(Received {
                partition: message.partition(),
                offset: message.offset(),
                key: message
                    .key()
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
                payload: message
                    .payload()
                    .map(|p| String::from_utf8_lossy(p).into_owned()),
                headers,
            });
        }
    }

    /// Reads until `done(messages)` holds; panics after `limit`.
    pub async fn read_until(
        &mut self,
        limit: Duration,
        what: &str,
        mut done: impl FnMut(&[Received]) -> bool,
    ) -> &[Received] {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            self.drain();
            if done(&self.messages) {
                return &self.messages;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "topic never showed {what} within {limit:?}; read {} messages",
                self.messages.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Messages whose header `id` is `id`.
    pub fn with_id(&self, id: &str) -> Vec<&Received> {
        self.messages
            .iter()
            .filter(|m| m.header("id") == Some(id))
            .collect()
    }
}

/// Publishes one event as the relay does: key and header `id` = the event id, the
/// CloudEvents headers, and the JSON payload.
pub async fn produce(kafka: &TestKafka, id: Uuid, event_type: &str, payload: &str) {
    let id = id.to_string();
    let headers = [
        ("id", id.as_str()),
        ("ce_specversion", "1.0"),
        ("ce_id", id.as_str()),
        ("ce_type", event_type),
        ("ce_source", "urn:charges"),
        ("ce_time", "2025-01-01T00:00:00.000000Z"),
        ("content-type", "application/json"),
    ];
    produce_raw(kafka, &headers, payload).await;
}

/// Publishes `payload` with exactly `headers` (keyed by the `id` header when there is
/// one): for messages no relay would send.
pub async fn produce_raw(kafka: &TestKafka, headers: &[(&str, &str)], payload: &str) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &kafka.bootstrap)
        .set("message.timeout.ms", "10000")
        .create()
        .expect("producer");
    let key = headers
        .iter()
        .find(|(name, _)| *name == "id")
        .map_or("no-id", |(_, value)| *value);
    let owned = headers
        .iter()
        .fold(OwnedHeaders::new(), |owned, (key, value)| {
            owned.insert(Header {
                key,
                value: Some(*value),
            })
        });
    producer
        .send(
            FutureRecord::to(&kafka.topic)
                .key(key)
                .payload(payload)
                .headers(owned),
            Duration::from_secs(10),
        )
        .await
        .unwrap_or_else(|(e, _)| panic!("produce {key}: {e}"));
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

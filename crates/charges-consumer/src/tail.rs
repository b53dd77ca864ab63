//! `charges-consumer tail`: every message on the topic, read without a group.

use std::io::Write;
use std::time::Duration;

use charges_runtime::secrets::ExposeSecret;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use uuid::Uuid;

use crate::ConsumerError;
use crate::config::TailArgs;

/// `charges-consumer tail`: prints `partition offset id ce_type` per message.
pub async fn tail(args: TailArgs) -> Result<(), ConsumerError> {
    tokio::task::spawn_blocking(move || tail_blocking(&args))
        .await
        .map_err(|e| ConsumerError::Output(std::io::Error::other(e)))?
}

fn tail_blocking(args: &TailArgs) -> Result<(), ConsumerError> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.kafka_brokers)
        // A group id of its own that never commits: tail reads, it never moves a group.
        .set(
            "group.id",
            format!("charges-consumer-tail-{}", Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    for (key, value) in &args.kafka.resolved {
        config.set(key, value.expose_secret());
    }
    let consumer: BaseConsumer = config.create()?;
    let metadata = consumer.fetch_metadata(Some(&args.topic), Duration::from_secs(10))?;
    let start = if args.from_beginning {
        Offset::Beginning
    } else {
        Offset::End
    };
    // Asking for a topic that does not exist returns it with an error and no
    // partitions (or auto-creates it, where the broker allows that).
    let topic = metadata
        .topics()
        .iter()
        .find(|t| t.name() == args.topic && t.error().is_none() && !t.partitions().is_empty())
        .ok_or_else(|| ConsumerError::NoSuchTopic(args.topic.clone()))?;
    let mut assignment = TopicPartitionList::new();
    for partition in topic.partitions() {
        assignment.add_partition_offset(topic.name(), partition.id(), start)?;
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

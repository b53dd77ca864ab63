//! `charges-consumer` end to end: the real binary, a real Postgres (a database per test)
//! and a real Kafka protocol peer (librdkafka's mock cluster, a topic per test), with
//! messages produced by a real producer carrying the relay's headers.

use std::time::Duration;

use charges_tests::kafka::TestKafka;
use charges_tests::kafka::produce;
use charges_tests::{TestDb, poll_until, start_consumer};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use uuid::Uuid;

fn charge_created(id: Uuid, amount: i32) -> String {
    format!(
        r#"{{"eventId":"{id}","chargeId":"{}","amountCents":{amount},"currency":"EUR","occurredAt":"2025-01-01T00:00:00Z"}}"#,
        Uuid::now_v7()
    )
}

fn charge_refunded(id: Uuid, amount: i32) -> String {
    format!(
        r#"{{"eventId":"{id}","chargeId":"{}","refundId":"{}","amountCents":{amount},"currency":"EUR","refundedCents":{amount},"occurredAt":"2025-01-01T00:00:01Z"}}"#,
        Uuid::now_v7(),
        Uuid::now_v7()
    )
}

/// One charge's `ChargeCreated` (`created_copies` times, as a relay that published it
/// again would) and its `ChargeRefunded`: 4900 charged, 900 refunded.
async fn produce_a_charge_and_its_refund(kafka: &TestKafka, created_copies: usize) {
    let charge = Uuid::now_v7();
    let refund = Uuid::now_v7();
    let created = charge_created(charge, 4900);
    for _ in 0..created_copies {
        produce(kafka, charge, "ChargeCreated", &created).await;
    }
    produce(
        kafka,
        refund,
        "ChargeRefunded",
        &charge_refunded(refund, 900),
    )
    .await;
}

/// `(charged_cents, refunded_cents, events)` of the EUR ledger row.
async fn eur_ledger(db: &TestDb) -> (i64, i64, i64) {
    let row = db
        .client()
        .query_one(
            "SELECT charged_cents, refunded_cents, events FROM ledger WHERE currency = 'EUR'",
            &[],
        )
        .await
        .expect("the EUR ledger row");
    (row.get(0), row.get(1), row.get(2))
}

/// The offset `group` has committed on partition 0, as the broker reports it.
fn committed_offset(kafka: &TestKafka, group: &str) -> Offset {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &kafka.bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer for the committed offsets");
    let mut partitions = TopicPartitionList::new();
    partitions.add_partition(&kafka.topic, 0);
    let committed = consumer
        .committed_offsets(partitions, Duration::from_secs(10))
        .expect("committed offsets");
    committed
        .find_partition(&kafka.topic, 0)
        .expect("partition 0")
        .offset()
}

/// Waits until `group` has committed `offset` on partition 0.
async fn wait_for_commit(kafka: &TestKafka, group: &str, offset: i64) {
    poll_until(&format!("offset {offset} committed"), async || {
        (committed_offset(kafka, group) == Offset::Offset(offset)).then_some(())
    })
    .await;
}

/// 1. The same event delivered twice (the relay published it twice) changes the
///    ledger once; the consumer's schema lives beside the API's with its own history.
#[tokio::test]
async fn the_same_event_delivered_twice_changes_the_ledger_once() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    produce_a_charge_and_its_refund(&kafka, 2).await;

    let group = format!("ledger-{}", Uuid::new_v4().simple());
    let consumer = start_consumer(&db, &kafka, &group, &[]).await;
    consumer.wait_for_log("event applied", 2).await;
    consumer.wait_for_log("duplicate event skipped", 1).await;

    assert_eq!(eur_ledger(&db).await, (4900, 900, 2));
    assert_eq!(db.count("processed_events").await, 2);
    assert_eq!(
        db.count("consumer_schema_history").await,
        3,
        "the consumer's migrations (V1–V3) have their own history table"
    );
    // Offsets are committed after each message: all three are done for the group.
    wait_for_commit(&kafka, &group, 3).await;
}

/// 2. The consumer dies after its database commits but before Kafka heard about the
///    offsets (SIGKILL, with offset commits deferred by --commit-interval, which widens
///    the window every consumer has between the two commits). Restarted in the same
///    group, it reads the messages again and skips them: the ledger changes once.
#[tokio::test]
async fn a_redelivery_after_a_crash_before_the_offset_commit_changes_the_ledger_once() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    produce_a_charge_and_its_refund(&kafka, 1).await;
    let group = format!("ledger-{}", Uuid::new_v4().simple());

    let mut first = start_consumer(&db, &kafka, &group, &["--commit-interval", "1h"]).await;
    first.wait_for_log("event applied", 2).await;
    assert_eq!(
        eur_ledger(&db).await,
        (4900, 900, 2),
        "both effects committed"
    );
    assert_eq!(
        committed_offset(&kafka, &group),
        Offset::Invalid,
        "no offset reached Kafka before the crash"
    );
    first.kill9().await;

    let second = start_consumer(&db, &kafka, &group, &[]).await;
    second.wait_for_log("duplicate event skipped", 2).await;
    assert!(
        !second.output_text().contains("event applied"),
        "the redelivered events must not be applied again:\n{}",
        second.output_text()
    );
    assert_eq!(
        eur_ledger(&db).await,
        (4900, 900, 2),
        "the ledger changed once"
    );
    assert_eq!(db.count("processed_events").await, 2);
    wait_for_commit(&kafka, &group, 2).await;
}

fn charge_event(event_type: &str, id: Uuid, charge: Uuid, sequence: i64) -> String {
    match event_type {
        "ChargeCreated" => format!(
            r#"{{"eventId":"{id}","chargeId":"{charge}","sequence":{sequence},"amountCents":1000,"currency":"EUR","occurredAt":"2025-01-01T00:00:00Z"}}"#
        ),
        _ => format!(
            r#"{{"eventId":"{id}","chargeId":"{charge}","sequence":{sequence},"refundId":"{}","amountCents":10,"currency":"EUR","refundedCents":10,"occurredAt":"2025-01-01T00:00:01Z"}}"#,
            Uuid::now_v7()
        ),
    }
}

/// `--ordering per-aggregate`: a charge's events arriving as 1, 3, 2 are all applied,
/// and the two that came before their predecessor (3 before 2, then 2 after 3) are
/// counted and logged; a duplicate of 1 is neither.
#[tokio::test]
async fn events_arriving_before_their_predecessor_are_counted() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let charge = Uuid::now_v7();
    let first = Uuid::now_v7();
    for (id, event_type, sequence) in [
        (first, "ChargeCreated", 1),
        (Uuid::now_v7(), "ChargeRefunded", 3),
        (Uuid::now_v7(), "ChargeRefunded", 2),
        (first, "ChargeCreated", 1),
    ] {
        let payload = charge_event(event_type, id, charge, sequence);
        produce(&kafka, id, event_type, &payload).await;
    }
    let group = format!("ledger-{}", Uuid::new_v4().simple());
    let consumer = start_consumer(&db, &kafka, &group, &["--ordering", "per-aggregate"]).await;
    consumer.wait_for_log("duplicate event skipped", 1).await;
    let log = consumer.output_text();
    assert_eq!(
        log.matches("event applied before its predecessor").count(),
        2,
        "{log}"
    );
    assert_eq!(log.matches("event applied").count(), 3, "{log}");
    let line = log
        .lines()
        .find(|l| l.contains("consumer started"))
        .expect("started line");
    let addr = charges_tests::log_field(line, "metrics_addr").expect("metrics_addr");
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("charges_consumer_out_of_order_total 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("charges_consumer_events_total{outcome=\"applied\"} 3"),
        "{metrics}"
    );
    charges_tests::metrics::assert_exports_build_process_and_pool(&metrics, "charges-consumer");
    // Lag comes from librdkafka's statistics, every 5 s: wait for the first report.
    charges_tests::metrics::scrape_until(
        &reqwest::Client::new(),
        &format!("http://{addr}/metrics"),
        "the consumer's lag per partition",
        |text| text.contains(r#"charges_consumer_lag_messages{partition="0"} 0"#),
    )
    .await;
    let position: i64 = db
        .client()
        .query_one(
            "SELECT last_sequence FROM aggregate_positions WHERE aggregate_id = $1",
            &[&charge],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(position, 3);
}

fn charges_consumer(db: &TestDb, args: &[&str]) -> String {
    let output = std::process::Command::new(charges_tests::binary("charges-consumer"))
        .args(args)
        .env("DATABASE_URL", &db.url)
        .output()
        .expect("run charges-consumer");
    assert!(
        output.status.success(),
        "charges-consumer {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A handled type in a payload version the consumer does not know, and a message
/// without an id, are parked (not applied, not lost); the partition goes on, and the
/// next event is applied.
#[tokio::test]
async fn unknown_versions_and_poison_are_parked_and_the_partition_goes_on() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let future = Uuid::now_v7();
    let future_id = future.to_string();
    charges_tests::kafka::produce_raw(
        &kafka,
        &[
            ("id", &future_id),
            ("ce_type", "io.charges.charge.created"),
            (
                "ce_dataschema",
                "urn:charges:schemas:events:charge-created:v2",
            ),
        ],
        &charge_created(future, 100),
    )
    .await;
    charges_tests::kafka::produce_raw(&kafka, &[("ce_type", "ChargeCreated")], "{}").await;
    let applied = Uuid::now_v7();
    produce(
        &kafka,
        applied,
        "ChargeCreated",
        &charge_created(applied, 4900),
    )
    .await;

    let group = format!("ledger-{}", Uuid::new_v4().simple());
    let consumer = start_consumer(&db, &kafka, &group, &[]).await;
    consumer.wait_for_log("event applied", 1).await;
    assert_eq!(consumer.output_text().matches("event parked").count(), 2);
    assert_eq!(
        eur_ledger(&db).await,
        (4900, 0, 1),
        "only the known event applied"
    );

    let listed = charges_consumer(&db, &["parked", "list"]);
    assert!(listed.contains(&future_id), "{listed}");
    assert!(listed.contains("charge-created:v2"), "{listed}");
    assert!(listed.contains("no header `id`"), "{listed}");
    // Replaying cannot apply them yet: they stay, with their reason.
    let replayed = charges_consumer(&db, &["parked", "replay"]);
    assert_eq!(replayed.matches("still parked").count(), 2, "{replayed}");
    assert_eq!(db.count("parked_events").await, 2);
}

/// An event whose effect keeps failing for a reason other than an unreachable
/// database (here a constraint its currency breaks) is tried --max-apply-attempts
/// times, parked, and the partition goes on; once the cause is fixed, `parked replay`
/// applies it and it leaves the table.
#[tokio::test]
async fn an_event_that_keeps_failing_is_parked_then_replayed_once_fixed() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let stuck = Uuid::now_v7();
    produce(
        &kafka,
        stuck,
        "ChargeCreated",
        &charge_created(stuck, 300).replace("\"EUR\"", "\"eur\""),
    )
    .await;
    let next = Uuid::now_v7();
    produce(&kafka, next, "ChargeCreated", &charge_created(next, 4900)).await;

    let group = format!("ledger-{}", Uuid::new_v4().simple());
    let consumer = start_consumer(&db, &kafka, &group, &["--max-apply-attempts", "2"]).await;
    consumer.wait_for_log("event applied", 1).await;
    assert_eq!(
        consumer
            .output_text()
            .matches("applying the event failed")
            .count(),
        1
    );
    assert!(consumer.output_text().contains("applying failed 2 times"));
    assert_eq!(eur_ledger(&db).await, (4900, 0, 1));

    db.client()
        .batch_execute("ALTER TABLE ledger DROP CONSTRAINT ledger_currency_check")
        .await
        .unwrap();
    let replayed = charges_consumer(&db, &["parked", "replay"]);
    assert!(replayed.contains("applied: removed"), "{replayed}");
    assert_eq!(db.count("parked_events").await, 0);
    let lower: i64 = db
        .client()
        .query_one(
            "SELECT charged_cents FROM ledger WHERE currency = 'eur'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(lower, 300);
    assert_eq!(db.count("processed_events").await, 2);
}

/// The consumer's database may be one of its own: migrated with its own sets (its
/// schema, then the inbox's), it is ready without any of the API's tables.
#[tokio::test]
async fn a_consumer_on_a_database_of_its_own_migrates_its_sets_and_is_ready() {
    let db = TestDb::unmigrated().await;
    let kafka = TestKafka::new(1).await;
    let group = format!("ledger-{}", Uuid::new_v4().simple());
    let consumer = start_consumer(&db, &kafka, &group, &[]).await;
    assert_eq!(db.count("consumer_schema_history").await, 3);
    assert_eq!(db.count("inbox_schema_history").await, 1);
    let log = consumer.output_text();
    let line = log
        .lines()
        .find(|l| l.contains("consumer started"))
        .expect("started line");
    let addr = charges_tests::log_field(line, "metrics_addr").expect("metrics_addr");
    let readyz = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    let status = readyz.status().as_u16();
    assert_eq!(status, 200, "{}", readyz.text().await.unwrap());
}

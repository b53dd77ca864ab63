//! `--ordering per-aggregate`: for every charge, the first occurrences of its events on
//! the topic carry `ce_sequence` 1, 2, 3 … with no inversion, whatever relays do: three
//! of them with two batch loops each, one refusing some messages (so those rows are
//! retried while their successors wait), one killed with SIGKILL mid-run. And a dead
//! event holds back its own charge's later events, and only those.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use charges_tests::kafka::{BrokerKind, Received, TestKafka};
use charges_tests::outbox::count_outbox;
use charges_tests::{DEADLINE, TestApi, TestDb, new_key, poll_until, relay_command, start_relay};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use reqwest::StatusCode;
use serde_json::Value;

const CHARGES: usize = 50;
const REFUNDS_PER_CHARGE: usize = 10;

async fn create_charge(api: &TestApi, amount: i64) -> String {
    let response = api
        .post_charge(
            Some(&new_key()),
            &format!(r#"{{"amountCents":{amount},"currency":"EUR"}}"#),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let charge: Value = response.json().await.unwrap();
    charge["id"].as_str().unwrap().to_owned()
}

/// `refunds` refunds of 10 cents on each charge, a charge's refunds all sent at once:
/// they race for its row lock, so their commit order is not their start order. Like
/// any client, a refund answered 409 or 503 is retried with its key.
async fn refund_concurrently(api: &TestApi, charges: &[String], refunds: usize) {
    use futures::StreamExt;
    let requests = charges.iter().flat_map(|charge| {
        (0..refunds).map(move |_| async move {
            let key = new_key();
            loop {
                let response = api.post_refund(charge, &key, r#"{"amountCents":10}"#).await;
                match response.status() {
                    StatusCode::CREATED => return,
                    StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    other => panic!("refund answered {other}"),
                }
            }
        })
    });
    // Three charges' refunds at a time: enough to race, few enough for the pool.
    futures::stream::iter(requests)
        .buffer_unordered(3 * refunds)
        .collect::<Vec<()>>()
        .await;
}

/// A relay allows 1 000 rejections per row unless `extra` says otherwise (the last
/// `--max-attempts` wins). The picky relay's refusals count on the row itself, so with
/// the default of 10, one rejection that the mock broker injects into another relay's
/// produce request could be a padded row's tenth and make it dead: by design, its
/// charge's later events would then never go out.
fn ordered_relay_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--max-attempts",
        "1000",
        "--ordering",
        "per-aggregate",
        "--concurrency",
        "2",
        "--batch-size",
        "25",
        "--poll-interval",
        "100ms",
        "--publish-timeout",
        "2s",
        "--backoff-base",
        "20ms",
        "--backoff-max",
        "100ms",
    ];
    args.extend_from_slice(extra);
    args
}

/// Per charge (the message key), the `ce_sequence` of each event's first occurrence,
/// in topic order. One charge's events share a partition, read in offset order.
fn first_occurrences(messages: &[Received]) -> BTreeMap<String, Vec<i64>> {
    let mut seen = HashSet::new();
    let mut by_charge: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for message in messages {
        let id = message.header("id").expect("id header").to_owned();
        if !seen.insert(id) {
            continue;
        }
        let sequence: i64 = message
            .header("ce_sequence")
            .expect("ce_sequence header")
            .parse()
            .expect("ce_sequence is digits");
        let key = message.key.clone().expect("message key");
        assert_eq!(Some(key.as_str()), message.header("aggregate_id"));
        by_charge.entry(key).or_default().push(sequence);
    }
    by_charge
}

async fn ordered_delivery(kind: BrokerKind) {
    let db = TestDb::new().await;
    let kafka = TestKafka::of(kind, 3).await;
    let api = TestApi::start(&db, &[]).await;
    let mut charges = Vec::new();
    for _ in 0..CHARGES {
        charges.push(create_charge(&api, 1000).await);
    }
    refund_concurrently(&api, &charges, REFUNDS_PER_CHARGE).await;
    let events = (CHARGES * (1 + REFUNDS_PER_CHARGE)) as i64;
    assert_eq!(count_outbox(&db, "true").await, events);
    // A quarter of the events are made too big for the first relay's producer, which
    // refuses them (a rejection, retried later) while the other relays take them.
    db.client()
        .batch_execute(
            "UPDATE outbox SET data = (data::jsonb || jsonb_build_object('pad', repeat('x', 3000)))::text
              WHERE sequence % 4 = 0",
        )
        .await
        .unwrap();

    let picky = ["--kafka-config", "message.max.bytes=2000"];
    let _picky = start_relay(&db, &kafka, &ordered_relay_args(&picky)).await;
    // Alone at first, so that it surely meets an event it cannot send before the
    // others could publish them all.
    poll_until("the picky relay to refuse an event", async || {
        (count_outbox(&db, "rejections > 0").await > 0).then_some(())
    })
    .await;
    let (mut doomed, _) = start_relay(&db, &kafka, &ordered_relay_args(&[])).await;
    let _steady = start_relay(&db, &kafka, &ordered_relay_args(&[])).await;
    if let Some(mock) = kafka.mock() {
        // The broker itself refuses a few produce requests too.
        mock.request_errors(
            RDKafkaApiKey::Produce,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_RECORD; 5],
        );
    }
    poll_until("a third of the events published", async || {
        (count_outbox(&db, "published_at IS NOT NULL").await >= events / 3).then_some(())
    })
    .await;
    doomed.kill9().await;
    poll_until("every event published", async || {
        let dead = count_outbox(&db, "dead_at IS NOT NULL").await;
        assert_eq!(
            dead, 0,
            "rows went dead: their charges' later events stay held"
        );
        (count_outbox(&db, "published_at IS NULL").await == 0).then_some(())
    })
    .await;
    // Sequence order is commit order: each refund's running total, computed under the
    // charge's row lock, grows with its sequence.
    let misnumbered = count_outbox(
        &db,
        "event_type = 'ChargeRefunded'
         AND (data::jsonb ->> 'refundedCents')::bigint <> 10 * (sequence - 1)",
    )
    .await;
    assert_eq!(
        misnumbered, 0,
        "a sequence number does not follow commit order"
    );

    let ids: Vec<String> = db
        .client()
        .query("SELECT id::text FROM outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut reader = kafka.reader();
    let messages = reader
        .read_until(DEADLINE, "every event", |messages| {
            let on_topic: HashSet<&str> = messages.iter().filter_map(|m| m.header("id")).collect();
            ids.iter().all(|id| on_topic.contains(id.as_str()))
        })
        .await;
    let by_charge = first_occurrences(messages);
    assert_eq!(by_charge.len(), CHARGES);
    let expected: Vec<i64> = (1..=(1 + REFUNDS_PER_CHARGE as i64)).collect();
    for (charge, sequences) in &by_charge {
        assert_eq!(sequences, &expected, "charge {charge}: events out of order");
    }
}

#[tokio::test]
async fn mock_first_occurrences_follow_each_charges_commit_order() {
    ordered_delivery(BrokerKind::Mock).await;
}

#[tokio::test]
async fn tansu_first_occurrences_follow_each_charges_commit_order() {
    ordered_delivery(BrokerKind::Tansu).await;
}

/// `(id, sequence, published, dead, attempts)` of a charge's events.
async fn events_of(db: &TestDb, charge: &str) -> Vec<(String, i64, bool, bool, i32)> {
    db.client()
        .query(
            "SELECT id::text, sequence, published_at IS NOT NULL, dead_at IS NOT NULL, attempts
               FROM outbox WHERE aggregate_id = $1::text::uuid ORDER BY sequence",
            &[&charge],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4)))
        .collect()
}

/// A dead `ChargeCreated` holds back its charge's refunds (never even claimed) while
/// every other charge's events go out; once requeued, the held events follow in order.
#[tokio::test]
async fn a_dead_event_holds_back_only_its_own_charges_later_events() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(3).await;
    let api = TestApi::start(&db, &[]).await;
    let blocked = create_charge(&api, 1000).await;
    let free = create_charge(&api, 1000).await;
    refund_concurrently(&api, &[blocked.clone(), free.clone()], 3).await;
    db.client()
        .execute(
            "UPDATE outbox SET data = (data::jsonb || jsonb_build_object('pad', repeat('x', 3000)))::text
              WHERE aggregate_id = $1::text::uuid AND sequence = 1",
            &[&blocked],
        )
        .await
        .unwrap();
    let small = [
        "--kafka-config",
        "message.max.bytes=2000",
        "--max-attempts",
        "2",
    ];
    let (mut relay, _) = start_relay(&db, &kafka, &ordered_relay_args(&small)).await;
    poll_until("the blocked charge's ChargeCreated is dead", async || {
        events_of(&db, &blocked).await[0].3.then_some(())
    })
    .await;
    // A charge created after the death is published: the relay kept claiming, and the
    // blocked charge's refunds were passed over, not merely not reached yet.
    let later = create_charge(&api, 1000).await;
    poll_until("the other charges' events are published", async || {
        let free_done = events_of(&db, &free).await.iter().all(|e| e.2);
        (free_done && events_of(&db, &later).await[0].2).then_some(())
    })
    .await;
    for (id, sequence, published, dead, attempts) in &events_of(&db, &blocked).await[1..] {
        assert!(!published && !dead, "event {sequence} ({id}) was published");
        assert_eq!(
            *attempts, 0,
            "event {sequence} ({id}) was claimed behind a dead one"
        );
    }
    relay.stop().await;

    let dead_id = events_of(&db, &blocked).await[0].0.clone();
    let requeued = relay_command(&db, &["dead", "requeue", "--id", &dead_id]);
    assert!(requeued.contains("requeued 1"), "{requeued}");
    let _relay = start_relay(&db, &kafka, &ordered_relay_args(&[])).await;
    poll_until("the held events follow", async || {
        events_of(&db, &blocked)
            .await
            .iter()
            .all(|e| e.2)
            .then_some(())
    })
    .await;
    let mut reader = kafka.reader();
    let messages = reader
        .read_until(DEADLINE, "the blocked charge's four events", |messages| {
            messages
                .iter()
                .filter(|m| m.key.as_deref() == Some(blocked.as_str()))
                .count()
                >= 4
        })
        .await;
    assert_eq!(first_occurrences(messages)[&blocked], vec![1, 2, 3, 4]);
}

//! The building blocks adopted by a second service (examples/orders, nothing of
//! charges in it): its Idempotency-Key contract over real HTTP and a real Postgres, and
//! its events through the relay engine to a real broker, applied once by its consumer
//! with the inbox.

use std::sync::atomic::Ordering;

use charges_tests::kafka::{TestKafka, read_to_end};
use charges_tests::orders::{OrdersPipeline, OrdersService};
use charges_tests::{DEADLINE, new_key, poll_until};
use serde_json::Value;

const ORDER: &str = r#"{"item":"apple","quantity":2}"#;

#[tokio::test]
async fn a_replayed_order_is_byte_identical() {
    let service = OrdersService::start().await;
    let key = new_key();
    let first = service.place(&key, ORDER).await;
    assert_eq!(first.status().as_u16(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let location = first.headers()["location"].clone();
    let body = first.bytes().await.unwrap();

    let again = service.place(&key, ORDER).await;
    assert_eq!(again.status().as_u16(), 201);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"], location);
    assert_eq!(again.bytes().await.unwrap(), body, "the replay's bytes");
    assert_eq!(service.count("orders").await, 1);
    assert_eq!(service.count("outbox").await, 1);
    service.stop().await;
}

#[tokio::test]
async fn concurrent_requests_with_one_key_make_one_order() {
    let service = OrdersService::start().await;
    let key = new_key();
    let answers = futures::future::join_all((0..16).map(|_| async {
        let response = service.place(&key, ORDER).await;
        (response.status().as_u16(), response.text().await.unwrap())
    }))
    .await;
    // Each is the order (created or replayed) or "in flight, retry".
    let created: Vec<&String> = answers
        .iter()
        .filter(|(status, _)| *status == 201)
        .map(|(_, body)| body)
        .collect();
    assert!(
        answers
            .iter()
            .all(|(status, _)| [201, 409].contains(status)),
        "{answers:?}"
    );
    assert!(!created.is_empty(), "{answers:?}");
    assert!(
        created.iter().all(|body| *body == created[0]),
        "{answers:?}"
    );
    assert_eq!(service.count("orders").await, 1);
    assert_eq!(service.count("outbox").await, 1);
    service.stop().await;
}

#[tokio::test]
async fn a_different_payload_with_the_same_key_is_refused() {
    let service = OrdersService::start().await;
    let key = new_key();
    // A body the service refuses leaves the key free: nothing was executed.
    let refused = service
        .place(&key, r#"{"item":"apple","quantity":0}"#)
        .await;
    assert_eq!(refused.status().as_u16(), 400);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(service.place(&key, ORDER).await.status().as_u16(), 201);

    let other = service.place(&key, r#"{"item":"pear","quantity":2}"#).await;
    assert_eq!(other.status().as_u16(), 422);
    let problem: Value = other.json().await.unwrap();
    assert_eq!(problem["type"], "/problems/idempotency-key-reused");
    let missing = service
        .http
        .post(format!("{}/orders", service.base_url))
        .body(ORDER)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status().as_u16(), 400, "no Idempotency-Key");
    assert_eq!(service.count("orders").await, 1);
    service.stop().await;
}

/// Each event reaches tansu through the relay engine and is applied once; every event
/// published a second time (a relay that crashed before marking would do that) is
/// recognised by the inbox and changes nothing.
#[tokio::test]
async fn tansu_orders_reach_a_real_broker_and_are_applied_once() {
    let service = OrdersService::start().await;
    let kafka = TestKafka::tansu(1).await;
    let pipeline = OrdersPipeline::start(&service, &kafka).await;
    for body in [
        r#"{"item":"apple","quantity":2}"#,
        r#"{"item":"apple","quantity":3}"#,
        r#"{"item":"pear","quantity":1}"#,
    ] {
        assert_eq!(service.place(&new_key(), body).await.status().as_u16(), 201);
    }
    let consumed = pipeline.consumed.clone();
    poll_until("three events applied", async || {
        (consumed.applied.load(Ordering::Relaxed) == 3).then_some(())
    })
    .await;

    service
        .db
        .client()
        .execute("UPDATE outbox SET published_at = NULL", &[])
        .await
        .unwrap();
    poll_until("the three copies recognised", async || {
        (consumed.duplicates.load(Ordering::Relaxed) == 3).then_some(())
    })
    .await;
    pipeline.stop().await;

    let totals: Vec<(String, i64)> = service
        .db
        .client()
        .query("SELECT item, quantity FROM item_totals ORDER BY item", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(totals, [("apple".to_owned(), 5), ("pear".to_owned(), 1)]);
    assert_eq!(service.count("processed_events").await, 3);
    assert_eq!(consumed.applied.load(Ordering::Relaxed), 3);
    let mut reader = kafka.reader();
    reader
        .read_until(DEADLINE, "both copies of each event", |m| m.len() >= 6)
        .await;
    read_to_end(&kafka, &mut reader).await;
    assert_eq!(reader.messages.len(), 6, "each event published twice");
    service.stop().await;
}

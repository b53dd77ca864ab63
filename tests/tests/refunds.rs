//! Refunds and reading a charge back, through the real `charges-api` binary and a real
//! Postgres. Refunds go through the same idempotency layer as charges.

use charges_tests::{TestApi, TestDb, expect_problem, new_key};
use reqwest::StatusCode;
use serde_json::Value;
use uuid::Uuid;

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

#[tokio::test]
async fn get_returns_the_charge_its_refunded_total_and_its_refunds() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let id = create_charge(&api, 1000).await;

    let fresh: Value = api
        .get(&format!("/charges/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(fresh["id"], id);
    assert_eq!(fresh["amountCents"], 1000);
    assert_eq!(fresh["currency"], "EUR");
    assert_eq!(fresh["refundedCents"], 0);
    assert_eq!(fresh["refunds"], serde_json::json!([]));

    let first = api
        .post_refund(&id, &new_key(), r#"{"amountCents":300}"#)
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(
        first.headers()["location"],
        format!("/charges/{id}").as_str()
    );
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["chargeId"], id);
    assert_eq!(first["amountCents"], 300);
    assert_eq!(first["currency"], "EUR");

    let rest = api.post_refund(&id, &new_key(), "{}").await;
    assert_eq!(rest.status(), StatusCode::CREATED);
    let rest: Value = rest.json().await.unwrap();
    assert_eq!(rest["amountCents"], 700, "the default is what remains");

    let response = api.get(&format!("/charges/{id}")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let charge: Value = response.json().await.unwrap();
    assert_eq!(charge["refundedCents"], 1000);
    let refunds = charge["refunds"].as_array().unwrap();
    assert_eq!(refunds.len(), 2);
    assert_eq!(refunds[0]["id"], first["id"]);
    assert_eq!(refunds[1]["id"], rest["id"]);

    let events: Vec<(String, Value)> = db
        .client()
        .query(
            "SELECT event_type, data::jsonb FROM outbox ORDER BY created_at, id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["ChargeCreated", "ChargeRefunded", "ChargeRefunded"]);
    let last = &events[2].1;
    assert_eq!(last["chargeId"], id);
    assert_eq!(last["refundId"], rest["id"]);
    assert_eq!(last["amountCents"], 700);
    assert_eq!(last["refundedCents"], 1000);
    assert_eq!(last["currency"], "EUR");
    assert_eq!(last["sequence"], 3);
    assert!(last["eventId"].is_string() && last["occurredAt"].is_string());
}

#[tokio::test]
async fn unknown_and_malformed_charge_ids() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let unknown = Uuid::new_v4().to_string();
    let missing = expect_problem(
        api.get(&format!("/charges/{unknown}")).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(missing["type"], "/problems/charge-not-found");
    let bad = expect_problem(
        api.get("/charges/not-a-uuid").await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(bad["type"], "/problems/invalid-charge-id");

    let key = new_key();
    let refund_unknown = api.post_refund(&unknown, &key, "{}").await;
    expect_problem(refund_unknown, StatusCode::NOT_FOUND).await;
    expect_problem(
        api.post_refund("42", &key, "{}").await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(
        db.count("idempotency_keys").await,
        0,
        "a 404 is not remembered"
    );
    assert_eq!(db.count("refunds").await, 0);

    let wrong_method = api
        .http
        .delete(api.url(&format!("/charges/{unknown}")))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.headers()["allow"], "GET");
    expect_problem(wrong_method, StatusCode::METHOD_NOT_ALLOWED).await;
}

/// Over-refund is 422 (not 409: this API's 409 means "in flight, retry"), and it is a
/// remembered outcome: the same key replays it.
#[tokio::test]
async fn over_refunds_are_refused_and_the_refusal_is_replayed() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let id = create_charge(&api, 500).await;
    let key = new_key();
    let too_much = expect_problem(
        api.post_refund(&id, &key, r#"{"amountCents":501}"#).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_eq!(too_much["type"], "/problems/refund-exceeds-charge");
    let replay = api.post_refund(&id, &key, r#"{"amountCents":501}"#).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(
        expect_problem(replay, StatusCode::UNPROCESSABLE_ENTITY).await,
        too_much
    );

    assert_eq!(
        api.post_refund(&id, &new_key(), "{}").await.status(),
        StatusCode::CREATED
    );
    let nothing_left = api.post_refund(&id, &new_key(), "{}").await;
    expect_problem(nothing_left, StatusCode::UNPROCESSABLE_ENTITY).await;
    for body in [
        "",
        "[]",
        r#"{"amountCents":0}"#,
        r#"{"amountCents":1.5}"#,
        r#"{"amountCents":1,"x":1}"#,
    ] {
        expect_problem(
            api.post_refund(&id, &new_key(), body).await,
            StatusCode::BAD_REQUEST,
        )
        .await;
    }
    assert_eq!(db.count("refunds").await, 1);
}

/// Many concurrent refunds with different keys never add up past the charge.
#[tokio::test]
async fn concurrent_refunds_never_exceed_the_charge() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &["--db-pool-size", "24"]).await;
    let id = create_charge(&api, 1000).await;
    let attempts = (0..40).map(|_| {
        let key = new_key();
        let (api, id) = (&api, &id);
        async move { api.post_refund(id, &key, r#"{"amountCents":70}"#).await }
    });
    let responses = futures::future::join_all(attempts).await;
    let mut created = 0;
    for response in responses {
        match response.status() {
            StatusCode::CREATED => created += 1,
            StatusCode::UNPROCESSABLE_ENTITY => {}
            other => panic!("unexpected {other}: {}", response.text().await.unwrap()),
        }
    }
    assert_eq!(created, 14, "14 × 70 = 980 fits in 1000, a 15th does not");
    let row = db
        .client()
        .query_one(
            "SELECT c.refunded_cents, (SELECT sum(amount_cents) FROM refunds)::int,
                    (SELECT count(*) FROM outbox WHERE event_type = 'ChargeRefunded')
               FROM charges c",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 980);
    assert_eq!(row.get::<_, i32>(1), 980);
    assert_eq!(row.get::<_, i64>(2), 14);
    let rest: Value = api
        .post_refund(&id, &new_key(), "{}")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(rest["amountCents"], 20);
}

/// The scope of a key is (key, endpoint), and the endpoint is the concrete path.
#[tokio::test]
async fn one_key_on_different_endpoints_is_independent_operations() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let key = new_key();
    let charge = api.post_charge(Some(&key), r#"{"amountCents":1000}"#).await;
    assert_eq!(charge.status(), StatusCode::CREATED);
    let a: Value = charge.json().await.unwrap();
    let a = a["id"].as_str().unwrap().to_owned();
    let b = create_charge(&api, 2000).await;

    let on_a = api.post_refund(&a, &key, "{}").await;
    assert_eq!(
        on_a.status(),
        StatusCode::CREATED,
        "same key as the charge, other endpoint"
    );
    assert!(on_a.headers().get("idempotent-replayed").is_none());
    let on_b = api.post_refund(&b, &key, "{}").await;
    assert_eq!(
        on_b.status(),
        StatusCode::CREATED,
        "same key, another charge's refunds"
    );
    assert!(on_b.headers().get("idempotent-replayed").is_none());
    let upper = api.post_refund(&a.to_uppercase(), &key, "{}").await;
    assert_eq!(
        upper.headers()["idempotent-replayed"],
        "true",
        "the path id is normalized"
    );

    let endpoints: Vec<String> = db
        .client()
        .query(
            "SELECT endpoint FROM idempotency_keys ORDER BY created_at, endpoint",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(endpoints.len(), 4);
    assert!(endpoints.contains(&"/charges".to_owned()));
    assert!(endpoints.contains(&format!("/charges/{a}/refunds")));
    assert!(endpoints.contains(&format!("/charges/{b}/refunds")));
    let sums: (i32, i32) = {
        let r = db
            .client()
            .query_one(
                "SELECT (SELECT refunded_cents FROM charges WHERE id = $1::text::uuid),
                        (SELECT refunded_cents FROM charges WHERE id = $2::text::uuid)",
                &[&a, &b],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(sums, (1000, 2000));
}

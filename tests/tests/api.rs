//! The Idempotency-Key contract of `POST /charges`, through the real `charges-api`
//! binary over HTTP, against a real Postgres database of each test's own.

use charges_tests::{TestApi, TestDb, expect_problem, new_key, poll_until};
use reqwest::StatusCode;
use serde_json::Value;
use uuid::Uuid;

const BODY: &str = r#"{"amountCents":4900,"currency":"EUR"}"#;

async fn counts(db: &TestDb) -> (i64, i64, i64) {
    (
        db.count("charges").await,
        db.count("outbox").await,
        db.count("idempotency_keys").await,
    )
}

#[tokio::test]
async fn first_request_creates_the_charge_its_outbox_event_and_the_key() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let response = api.post_charge(Some(&new_key()), BODY).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    assert!(response.headers().get("idempotent-replayed").is_none());
    let charge: Value = response.json().await.unwrap();
    assert_eq!(
        location,
        format!("/charges/{}", charge["id"].as_str().unwrap())
    );
    assert_eq!(charge["amountCents"], 4900);
    assert_eq!(charge["currency"], "EUR");
    assert!(charge["createdAt"].is_string());
    assert_eq!(counts(&db).await, (1, 1, 1));
    // The response is written before the charge's row: both carry the same instant,
    // to the microsecond Postgres keeps.
    let read: Value = api.get(&location).await.json().await.unwrap();
    assert_eq!(read["createdAt"], charge["createdAt"]);

    let id: Uuid = charge["id"].as_str().unwrap().parse().unwrap();
    let row = db
        .client()
        .query_one(
            "SELECT o.id, o.event_type, o.aggregate_type, o.data, o.payload IS NULL AS no_jsonb,
                    o.published_at IS NULL AS pending, k.status
               FROM outbox o, idempotency_keys k WHERE o.aggregate_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let event_id: Uuid = row.get("id");
    let payload: Value = serde_json::from_str(&row.get::<_, String>("data")).unwrap();
    assert!(
        row.get::<_, bool>("no_jsonb"),
        "the payload is stored as text only"
    );
    assert_eq!(row.get::<_, String>("event_type"), "ChargeCreated");
    assert_eq!(row.get::<_, String>("aggregate_type"), "charge");
    assert!(row.get::<_, bool>("pending"));
    assert_eq!(row.get::<_, String>("status"), "COMPLETED");
    assert_eq!(payload["eventId"], event_id.to_string());
    assert_eq!(payload["chargeId"], id.to_string());
    assert_eq!(payload["amountCents"], 4900);
    assert_eq!(payload["currency"], "EUR");
    assert_eq!(payload["occurredAt"], charge["createdAt"]);
}

/// Contract line 1.
#[tokio::test]
async fn missing_empty_or_invalid_key_is_400_and_stores_nothing() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let missing = api.post_charge(None, BODY).await;
    expect_problem(missing, StatusCode::BAD_REQUEST).await;
    for bad in [
        "",
        "   ",
        "not-a-uuid",
        "8e03978e40d543e8bc936894a57f9324",
        "\"8e03978e-40d5-43e8-bc93-6894a57f9324",
        "urn:uuid:8e03978e-40d5-43e8-bc93-6894a57f9324",
    ] {
        let response = api.post_charge(Some(bad), BODY).await;
        let problem = expect_problem(response, StatusCode::BAD_REQUEST).await;
        assert_eq!(
            problem["type"], "/problems/invalid-idempotency-key",
            "{bad:?}"
        );
    }
    let twice = api
        .http
        .post(api.url("/charges"))
        .header("content-type", "application/json")
        .header("idempotency-key", new_key())
        .header("idempotency-key", new_key())
        .body(BODY)
        .send()
        .await
        .unwrap();
    expect_problem(twice, StatusCode::BAD_REQUEST).await;
    assert_eq!(counts(&db).await, (0, 0, 0));
}

/// Contract line 1: the quoted RFC 8941 form and upper case name the same key.
#[tokio::test]
async fn bare_quoted_and_uppercase_keys_are_one_key() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let key = new_key();
    let first = api.post_charge(Some(&key), BODY).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first = first.text().await.unwrap();
    for form in [
        format!("\"{key}\""),
        key.to_uppercase(),
        format!("\"{}\"", key.to_uppercase()),
    ] {
        let again = api.post_charge(Some(&form), BODY).await;
        assert_eq!(again.status(), StatusCode::CREATED, "{form}");
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(again.text().await.unwrap(), first);
    }
    assert_eq!(counts(&db).await, (1, 1, 1));
    let stored: String = db
        .client()
        .query_one("SELECT key FROM idempotency_keys", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, key.to_lowercase());
}

/// Contract line 3: only the normalized fields make the fingerprint.
#[tokio::test]
async fn whitespace_field_order_and_currency_case_do_not_change_the_fingerprint() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let key = new_key();
    let first = api.post_charge(Some(&key), r#"{"amountCents":4900}"#).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    for same in [
        r#"{ "amountCents" : 4900 }"#,
        r#"{"currency":"USD","amountCents":4900}"#,
        "{\n\t\"amountCents\": 4900,\n\t\"currency\": \"usd\"\n}",
    ] {
        let again = api.post_charge(Some(&key), same).await;
        assert_eq!(again.status(), StatusCode::CREATED, "{same}");
        assert_eq!(again.headers()["idempotent-replayed"], "true", "{same}");
    }
    assert_eq!(counts(&db).await, (1, 1, 1));
}

/// Contract line 3: same key, different request → 422, nothing new stored.
#[tokio::test]
async fn same_key_with_a_different_payload_is_422() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let key = new_key();
    assert_eq!(
        api.post_charge(Some(&key), BODY).await.status(),
        StatusCode::CREATED
    );
    for different in [
        r#"{"amountCents":4901,"currency":"EUR"}"#,
        r#"{"amountCents":4900,"currency":"USD"}"#,
        r#"{"amountCents":4900}"#,
    ] {
        let response = api.post_charge(Some(&key), different).await;
        let problem = expect_problem(response, StatusCode::UNPROCESSABLE_ENTITY).await;
        assert_eq!(problem["type"], "/problems/idempotency-key-reused");
    }
    assert_eq!(counts(&db).await, (1, 1, 1));
}

/// Contract line 4: ≥ 50 identical requests at once → one charge.
#[tokio::test]
async fn fifty_identical_concurrent_requests_create_exactly_one_charge() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &["--db-pool-size", "32"]).await;
    let key = new_key();
    let requests = (0..64).map(|_| api.post_charge(Some(&key), BODY));
    let responses = futures::future::join_all(requests).await;
    let mut created = Vec::new();
    let mut in_flight = 0;
    for response in responses {
        match response.status() {
            StatusCode::CREATED => {
                let replayed = response.headers().get("idempotent-replayed").is_some();
                created.push((replayed, response.text().await.unwrap()));
            }
            StatusCode::CONFLICT => {
                assert_eq!(response.headers()["retry-after"], "1");
                expect_problem(response, StatusCode::CONFLICT).await;
                in_flight += 1;
            }
            other => panic!("unexpected {other}: {}", response.text().await.unwrap()),
        }
    }
    let originals = created.iter().filter(|(replayed, _)| !replayed).count();
    assert_eq!(originals, 1, "exactly one request executed");
    assert!(
        created.windows(2).all(|w| w[0].1 == w[1].1),
        "every 201 has the same body"
    );
    assert_eq!(created.len() + in_flight, 64);
    assert_eq!(counts(&db).await, (1, 1, 1));
}

/// Contract line 4: the loser gets 409 while the winner is still inside its
/// transaction — it does not wait for it. The winner is held by a table lock this test
/// owns, so the order of events is forced, not timed.
#[tokio::test]
async fn a_key_in_flight_answers_409_without_waiting_for_the_winner() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let key = new_key();

    let blocker = db.session().await;
    blocker
        .batch_execute("BEGIN; LOCK TABLE charges IN EXCLUSIVE MODE")
        .await
        .unwrap();

    let winner = tokio::spawn({
        let (http, url, key) = (api.http.clone(), api.url("/charges"), key.clone());
        async move {
            http.post(url)
                .header("content-type", "application/json")
                .header("idempotency-key", key)
                .body(BODY)
                .send()
                .await
                .unwrap()
        }
    });
    // Wait until the winner has reserved the key and is blocked on the charge insert
    // (inside the one statement of a new charge: the only one waiting on a table).
    db.wait_for(
        "SELECT count(*) = 1 FROM pg_stat_activity
          WHERE datname = current_database()
            AND wait_event_type = 'Lock' AND wait_event = 'relation'",
        &[],
        "the winner reached the charge insert",
    )
    .await;

    let loser = api.post_charge(Some(&key), BODY).await;
    assert!(
        !winner.is_finished(),
        "the winner must still be in its transaction"
    );
    let problem = expect_problem(loser, StatusCode::CONFLICT).await;
    assert_eq!(problem["type"], "/problems/idempotency-key-in-flight");
    // A different payload cannot be judged while the first is in flight: also 409.
    let other = api.post_charge(Some(&key), r#"{"amountCents":1}"#).await;
    expect_problem(other, StatusCode::CONFLICT).await;
    assert!(!winner.is_finished());

    blocker.batch_execute("ROLLBACK").await.unwrap();
    let winner = winner.await.unwrap();
    assert_eq!(winner.status(), StatusCode::CREATED);
    let winner_body = winner.text().await.unwrap();
    let retry = api.post_charge(Some(&key), BODY).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.text().await.unwrap(), winner_body);
    assert_eq!(counts(&db).await, (1, 1, 1));
}

/// Contract line 5: status, body (byte for byte) and Location, plus the replay marker.
#[tokio::test]
async fn a_completed_key_replays_the_stored_response_byte_for_byte() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let key = new_key();
    let first = api.post_charge(Some(&key), BODY).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let location = first.headers()["location"].clone();
    let body = first.bytes().await.unwrap();
    for _ in 0..3 {
        let replay = api.post_charge(Some(&key), BODY).await;
        assert_eq!(replay.status(), StatusCode::CREATED);
        assert_eq!(replay.headers()["idempotent-replayed"], "true");
        assert_eq!(replay.headers()["location"], location);
        assert_eq!(replay.headers()["content-type"], "application/json");
        assert_eq!(replay.bytes().await.unwrap(), body);
    }
    let stored: String = db
        .client()
        .query_one("SELECT response_body FROM idempotency_keys", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored.as_bytes(), &body[..]);
    assert_eq!(counts(&db).await, (1, 1, 1));
}

/// Contract line 6: after the TTL the same key is a new request. The shortest TTL
/// the API accepts is a minute, so instead of waiting, the test moves the stored key a
/// TTL into the past: the API judges expiry by the database's clock. (The in-process
/// replay cache is off here: its entries die by their own deadline, which no database
/// write can move; `replay_cache` tests that.)
#[tokio::test]
async fn an_expired_key_is_treated_as_new() {
    let db = TestDb::new().await;
    let api = TestApi::start(
        &db,
        &["--idempotency-ttl", "1m", "--replay-cache-entries", "0"],
    )
    .await;
    let key = new_key();
    let first = api.post_charge(Some(&key), BODY).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    let window: f64 = db
        .client()
        .query_one(
            "SELECT extract(epoch FROM expires_at - created_at)::float8 FROM idempotency_keys",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(window, 60.0);
    let replay = api.post_charge(Some(&key), BODY).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");

    db.client()
        .batch_execute(
            "UPDATE idempotency_keys SET created_at = created_at - interval '1 minute',
                                         expires_at = expires_at - interval '1 minute'",
        )
        .await
        .unwrap();
    let after = api.post_charge(Some(&key), r#"{"amountCents":100}"#).await;
    assert_eq!(
        after.status(),
        StatusCode::CREATED,
        "a different payload is fine once expired"
    );
    assert!(after.headers().get("idempotent-replayed").is_none());
    let after: Value = after.json().await.unwrap();
    assert_ne!(after["id"], first["id"]);
    assert_eq!(counts(&db).await, (2, 2, 1));
}

/// Contract line 7 (and 8 for their bodies): refused input stores nothing, so the key
/// is still free for a valid request afterwards.
#[tokio::test]
async fn bad_input_is_refused_with_a_problem_and_leaves_the_key_free() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &["--max-body-bytes", "1024"]).await;
    let key = new_key();
    let bad_bodies = [
        "",
        "{",
        "[]",
        "null",
        "{}",
        r#"{"currency":"EUR"}"#,
        r#"{"amountCents":"4900"}"#,
        r#"{"amountCents":null}"#,
        r#"{"amountCents":4900,"note":"x"}"#,
        r#"{"amountCents":1,"amountCents":2}"#,
        r#"{"amountCents":0}"#,
        r#"{"amountCents":-1}"#,
        r#"{"amountCents":2147483648}"#,
        r#"{"amountCents":4900.0}"#,
        r#"{"amountCents":4900.5}"#,
        r#"{"amountCents":1e3}"#,
        r#"{"amountCents":-0}"#,
        r#"{"amountCents":4900,"currency":"EURO"}"#,
        r#"{"amountCents":4900,"currency":"XYZ"}"#,
        r#"{"amountCents":4900,"currency":"E'R"}"#,
        r#"{"amountCents":4900,"currency":7}"#,
        "{\"amountCents\":4900,\"currency\":\"EU\u{0}\"}",
    ];
    for body in bad_bodies {
        let response = api.post_charge(Some(&key), body).await;
        let problem = expect_problem(response, StatusCode::BAD_REQUEST).await;
        assert_eq!(problem["type"], "/problems/invalid-request-body", "{body}");
    }
    let invalid_utf8 = api
        .http
        .post(api.url("/charges"))
        .header("content-type", "application/json")
        .header("idempotency-key", &key)
        .body(vec![b'{', 0xff, 0xfe, b'}'])
        .send()
        .await
        .unwrap();
    expect_problem(invalid_utf8, StatusCode::BAD_REQUEST).await;

    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let mut request = api
            .http
            .post(api.url("/charges"))
            .header("idempotency-key", &key)
            .body(BODY);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let response = request.send().await.unwrap();
        expect_problem(response, StatusCode::UNSUPPORTED_MEDIA_TYPE).await;
    }
    let charset = api
        .http
        .post(api.url("/charges"))
        .header("content-type", "application/json; charset=utf-8")
        .header("idempotency-key", new_key())
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(
        charset.status(),
        StatusCode::CREATED,
        "parameters on the media type are fine"
    );

    let huge = format!(
        r#"{{"amountCents":4900,"currency":"EUR","pad":"{}"}}"#,
        "x".repeat(2048)
    );
    let too_large = api.post_charge(Some(&key), &huge).await;
    expect_problem(too_large, StatusCode::PAYLOAD_TOO_LARGE).await;
    let chunked = api
        .http
        .post(api.url("/charges"))
        .header("content-type", "application/json")
        .header("idempotency-key", &key)
        .body(reqwest::Body::wrap_stream(futures::stream::iter(
            (0..8).map(|_| Ok::<_, std::io::Error>(vec![b' '; 512])),
        )))
        .send()
        .await
        .unwrap();
    expect_problem(chunked, StatusCode::PAYLOAD_TOO_LARGE).await;

    assert_eq!(
        counts(&db).await,
        (1, 1, 1),
        "only the charset request was stored"
    );
    let valid = api.post_charge(Some(&key), BODY).await;
    assert_eq!(valid.status(), StatusCode::CREATED);
    assert!(valid.headers().get("idempotent-replayed").is_none());
    assert_eq!(counts(&db).await, (2, 2, 2));
}

/// Contract line 8: unknown routes and methods are problems too.
#[tokio::test]
async fn unknown_routes_and_methods_are_problems() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let missing = api.http.get(api.url("/nope")).send().await.unwrap();
    expect_problem(missing, StatusCode::NOT_FOUND).await;
    let wrong_method = api.http.delete(api.url("/charges")).send().await.unwrap();
    expect_problem(wrong_method, StatusCode::METHOD_NOT_ALLOWED).await;
}

/// Contract lines 8 and 9: a failure after the charge insert (here: the outbox insert
/// fails) rolls back the key, the charge and the outbox row together, answers an
/// opaque 500, and the same key works once the fault is gone.
#[tokio::test]
async fn a_failure_after_the_charge_insert_leaves_no_row_at_all() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    db.client()
        .batch_execute(
            "CREATE FUNCTION fail_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'injected-secret-failure'; END $$;
             CREATE TRIGGER fail_outbox BEFORE INSERT ON outbox
                FOR EACH ROW EXECUTE FUNCTION fail_outbox();",
        )
        .await
        .unwrap();
    let key = new_key();
    let response = api.post_charge(Some(&key), BODY).await;
    let problem = expect_problem(response, StatusCode::INTERNAL_SERVER_ERROR).await;
    let text = problem.to_string();
    assert!(!text.contains("injected"), "internals leaked: {text}");
    assert!(
        !text.to_lowercase().contains("outbox"),
        "internals leaked: {text}"
    );
    assert_eq!(counts(&db).await, (0, 0, 0));

    db.client()
        .batch_execute("DROP TRIGGER fail_outbox ON outbox")
        .await
        .unwrap();
    let retry = api.post_charge(Some(&key), BODY).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(counts(&db).await, (1, 1, 1));
}

/// Contract line 8: a database that cannot be reached is a 503 with Retry-After (not a
/// hang, not a leak), and the API recovers by itself.
#[tokio::test]
async fn an_unreachable_database_is_503_and_the_api_recovers() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &["--db-acquire-timeout", "1s"]).await;
    assert_eq!(
        api.post_charge(Some(&new_key()), BODY).await.status(),
        StatusCode::CREATED
    );

    let name = &db.name;
    db.refuse_connections(Some("charges-api")).await;
    let key = new_key();
    let response = api.post_charge(Some(&key), BODY).await;
    assert_eq!(response.headers()["retry-after"], "1");
    let problem = expect_problem(response, StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(
        !problem.to_string().contains(name.as_str()),
        "internals leaked: {problem}"
    );

    // Recovered means: a client retrying as told (same key, after Retry-After) gets its
    // charge once the database is back, without a restart. A connection the pool still
    // held, or one slow to open under load, may cost that client one more 503 first.
    db.allow_connections().await;
    poll_until(
        "the API serves again after the database came back",
        async || {
            let retried = api.post_charge(Some(&key), BODY).await;
            match retried.status() {
                StatusCode::CREATED => Some(()),
                StatusCode::SERVICE_UNAVAILABLE => {
                    assert_eq!(retried.headers()["retry-after"], "1");
                    None
                }
                other => panic!("{other}: {}", retried.text().await.unwrap_or_default()),
            }
        },
    )
    .await;
    assert_eq!(counts(&db).await, (2, 2, 2), "retries charged once");
}

/// Completed keys are remembered in process: a replay is answered without the
/// database (here: while the database refuses every connection), and so is a changed
/// payload, while a new key — which needs the database — gets 503.
#[tokio::test]
async fn replays_of_completed_keys_do_not_need_the_database() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &["--db-acquire-timeout", "1s"]).await;
    let key = new_key();
    let first = api.post_charge(Some(&key), BODY).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let body = first.text().await.unwrap();

    db.refuse_connections(Some("charges-api")).await;
    let replay = api.post_charge(Some(&key), BODY).await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.text().await.unwrap(), body);
    let changed = api.post_charge(Some(&key), r#"{"amountCents":1}"#).await;
    expect_problem(changed, StatusCode::UNPROCESSABLE_ENTITY).await;
    let new = api.post_charge(Some(&new_key()), BODY).await;
    expect_problem(new, StatusCode::SERVICE_UNAVAILABLE).await;
    db.allow_connections().await;
}

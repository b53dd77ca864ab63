//! One classification of storage failures (`StoreError::is_unavailable`): only a
//! database that cannot be reached, or a connection that broke, is "unavailable" (503
//! with Retry-After, retried by the relay and the consumer). Everything else is a bug
//! or a broken schema, which a retry repeats: 500, no Retry-After. Each kind is forced
//! here against a real Postgres, at the store and through the API.

use std::time::Duration;

use charges_store::{PoolSettings, StoreError};
use charges_tests::{TestApi, TestDb, new_key};
use reqwest::StatusCode;

const BODY: &str = r#"{"amountCents":4900,"currency":"EUR"}"#;

fn settings(max_size: usize) -> PoolSettings {
    PoolSettings {
        max_size,
        acquire_timeout: Duration::from_millis(300),
        statement_timeout: Duration::from_millis(200),
        ..PoolSettings::default()
    }
}

async fn pool(db: &TestDb, max_size: usize) -> charges_store::Pool {
    charges_store::connect(&db.url, &settings(max_size))
        .await
        .expect("pool")
}

/// Runs `sql` and reads column `x` as an `i32`, the way the stores read rows.
async fn read_i32(pool: &charges_store::Pool, sql: &str) -> Result<i32, StoreError> {
    let client = pool.get().await?;
    let row = client.query_one(sql, &[]).await?;
    Ok(row.try_get("x")?)
}

#[tokio::test]
async fn bugs_and_broken_schemas_are_not_unavailable() {
    let db = TestDb::new().await;
    let pool = pool(&db, 2).await;
    let cases = [
        ("a column of another type", "SELECT 1::bigint AS x"),
        ("a missing column", "SELECT 1 AS y"),
        ("no row where one was expected", "SELECT 1 AS x WHERE false"),
        ("a NULL where a value was expected", "SELECT NULL::int AS x"),
        (
            "a constraint violation",
            "INSERT INTO charges (id, amount_cents, currency) VALUES (gen_random_uuid(), -1, 'EUR') RETURNING amount_cents AS x",
        ),
        ("an unknown table", "SELECT x FROM no_such_table"),
    ];
    for (what, sql) in cases {
        let error = read_i32(&pool, sql).await.expect_err(what);
        assert!(
            !error.is_unavailable(),
            "{what} is classified unavailable: {error:?}"
        );
    }
}

#[tokio::test]
async fn timeouts_closed_connections_and_refusals_are_unavailable() {
    let db = TestDb::new().await;
    let pool = pool(&db, 1).await;

    let error = read_i32(&pool, "SELECT 1 AS x FROM pg_sleep(5)")
        .await
        .expect_err("statement_timeout");
    assert!(error.is_unavailable(), "statement timeout: {error:?}");

    // The pool's only connection is taken: waiting for it times out.
    let held = pool.get().await.expect("first connection");
    let error = read_i32(&pool, "SELECT 1 AS x")
        .await
        .expect_err("pool wait");
    assert!(matches!(error, StoreError::Pool(_)) && error.is_unavailable());

    // The server ends the session under the held connection.
    db.client()
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = $1",
            &[&settings(1).application_name],
        )
        .await
        .unwrap();
    let error = held
        .query_one("SELECT 1 AS x", &[])
        .await
        .map_err(StoreError::from)
        .expect_err("terminated session");
    assert!(error.is_unavailable(), "closed connection: {error:?}");
    drop(held);

    // Nothing listens on the port: connecting fails.
    let refused = charges_store::connect("postgres://postgres@127.0.0.1:1/none", &settings(1))
        .await
        .expect_err("connection refused");
    assert!(refused.is_unavailable(), "refused: {refused:?}");

    let bad_url = charges_store::connect("postgres://[::1", &settings(1))
        .await
        .expect_err("bad url");
    assert!(!bad_url.is_unavailable(), "a bad URL: {bad_url:?}");
}

/// Through the API: a schema that no longer matches the code (a column's type changed
/// under it) answers 500 without Retry-After on the read path and on a replay, where a
/// database that cannot be reached answers 503 with Retry-After
/// (`api::an_unreachable_database_is_503_and_the_api_recovers`). The replay is a
/// refund's, which reads the key's row itself; a charge's goes through
/// `charges_create_idempotent`, whose declared result type stands between it and the table.
#[tokio::test]
async fn a_column_of_the_wrong_type_is_a_500_not_a_503() {
    let db = TestDb::new().await;
    // Replays must come from the database, not from the in-process cache.
    let api = TestApi::start(&db, &["--replay-cache-entries", "0"]).await;
    let created = api.post_charge(Some(&new_key()), BODY).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let location = created.headers()["location"].to_str().unwrap().to_owned();
    let charge_id = location.trim_start_matches("/charges/").to_owned();
    let key = new_key();
    let refund = r#"{"amountCents":300}"#;
    let refunded = api.post_refund(&charge_id, &key, refund).await;
    assert_eq!(refunded.status(), StatusCode::CREATED);

    db.client()
        .batch_execute(
            "ALTER TABLE charges ALTER COLUMN amount_cents TYPE bigint;
             ALTER TABLE idempotency_keys ALTER COLUMN response_status TYPE bigint;",
        )
        .await
        .unwrap();
    let read = api.get(&location).await;
    let replay = api.post_refund(&charge_id, &key, refund).await;
    for (what, response) in [("GET", read), ("replay", replay)] {
        assert_eq!(
            response.status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "{what}"
        );
        assert!(
            response.headers().get("retry-after").is_none(),
            "{what}: a bug must not invite retries"
        );
        let problem: serde_json::Value = response.json().await.unwrap();
        assert_eq!(problem["type"], "/problems/internal-error", "{what}");
    }
}

/// A refund whose running-total UPDATE finds no row (a trigger swallows it) is an
/// invariant the row lock rules out: 500, nothing stored, no Retry-After.
#[tokio::test]
async fn a_statement_that_returns_no_row_is_a_500_not_a_503() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let created = api.post_charge(Some(&new_key()), BODY).await;
    let location = created.headers()["location"].to_str().unwrap().to_owned();
    let charge_id = location.trim_start_matches("/charges/");
    db.client()
        .batch_execute(
            "CREATE FUNCTION swallow_update() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RETURN NULL; END $$;
             CREATE TRIGGER swallow_update BEFORE UPDATE ON charges
                FOR EACH ROW EXECUTE FUNCTION swallow_update();",
        )
        .await
        .unwrap();
    let refund = api
        .post_refund(charge_id, &new_key(), r#"{"amountCents":100}"#)
        .await;
    assert_eq!(refund.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(refund.headers().get("retry-after").is_none());
    assert_eq!(db.count("refunds").await, 0);
}

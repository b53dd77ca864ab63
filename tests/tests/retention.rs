//! The retention statements delete one batch by reading one batch, however large the
//! backlog: per batch the work must not grow with the table, or a backlog makes every
//! batch slower until the statement times out and the table grows without bound (what
//! `make soak` caught: 255 000 rows read per batch of 1 000).
//!
//! The backlog here is built so that the planner knows it is large (fresh statistics);
//! with a join on the key columns it chose a hash join over a sequential scan of the
//! whole table, which these tests refuse.

use charges_tests::TestDb;
use serde_json::Value;

const BACKLOG: i64 = 50_000;
const BATCH: i64 = 1_000;

/// Rows read from `table` by every scan node of an `EXPLAIN (ANALYZE, FORMAT JSON)`.
fn rows_read(plan: &Value, table: &str) -> i64 {
    let mut total = 0;
    if plan["Relation Name"] == table
        && plan["Node Type"]
            .as_str()
            .is_some_and(|t| t.contains("Scan"))
    {
        total +=
            plan["Actual Rows"].as_i64().unwrap_or(0) * plan["Actual Loops"].as_i64().unwrap_or(1);
        total += plan["Rows Removed by Filter"].as_i64().unwrap_or(0);
    }
    if let Some(children) = plan["Plans"].as_array() {
        total += children
            .iter()
            .map(|child| rows_read(child, table))
            .sum::<i64>();
    }
    total
}

/// Runs `sql` under EXPLAIN ANALYZE in a transaction that is rolled back; returns
/// (rows deleted, rows read from `table`, the plan).
async fn explain_delete(
    db: &TestDb,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    table: &str,
) -> (i64, i64, Value) {
    let client = db.session().await;
    client.batch_execute("BEGIN").await.unwrap();
    let row = client
        .query_one(&format!("EXPLAIN (ANALYZE, FORMAT JSON) {sql}"), params)
        .await
        .unwrap();
    client.batch_execute("ROLLBACK").await.unwrap();
    let explained: Value = row.get(0);
    let plan = explained[0]["Plan"].clone();
    let deleted = plan["Plans"]
        .as_array()
        .and_then(|children| children.first())
        .map_or(0, |child| child["Actual Rows"].as_i64().unwrap_or(0));
    (deleted, rows_read(&plan, table), plan)
}

#[tokio::test]
async fn purging_expired_keys_reads_one_batch_not_the_backlog() {
    let db = TestDb::new().await;
    db.client()
        .batch_execute(&format!(
            "INSERT INTO idempotency_keys (key, endpoint, request_hash, status, response_status,
                                           response_headers, response_body, created_at, expires_at)
             SELECT gen_random_uuid()::text, '/charges', 'h', 'COMPLETED', 201, '[]', 'b',
                    now() - interval '2 hours', now() - interval '1 hour' + g * interval '10 ms'
               FROM generate_series(1, {BACKLOG}) g;
             ANALYZE idempotency_keys;"
        ))
        .await
        .unwrap();
    let (deleted, read, plan) = explain_delete(
        &db,
        charges_store::idempotency_keys::PURGE_EXPIRED.text,
        &[&BATCH],
        "idempotency_keys",
    )
    .await;
    assert_eq!(deleted, BATCH, "{plan:#}");
    assert!(
        read <= 3 * BATCH,
        "read {read} rows for a batch of {BATCH}: {plan:#}"
    );
}

#[tokio::test]
async fn deleting_published_events_reads_one_batch_not_the_backlog() {
    let db = TestDb::new().await;
    db.client()
        .batch_execute(&format!(
            "INSERT INTO charges (id, amount_cents, currency)
             SELECT md5('c' || g)::uuid, 4900, 'EUR' FROM generate_series(1, {BACKLOG}) g;
             INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload,
                                 created_at, published_at)
             SELECT md5('o' || g)::uuid, 'charge', md5('c' || g)::uuid, 'ChargeCreated', '{{}}',
                    now() - interval '2 hours', now() - interval '1 hour' + g * interval '10 ms'
               FROM generate_series(1, {BACKLOG}) g;
             ANALYZE outbox;"
        ))
        .await
        .unwrap();
    let (deleted, read, plan) = explain_delete(
        &db,
        charges_store::outbox::DELETE_PUBLISHED.text,
        &[&1.0f64, &BATCH],
        "outbox",
    )
    .await;
    assert_eq!(deleted, BATCH, "{plan:#}");
    assert!(
        read <= 3 * BATCH,
        "read {read} rows for a batch of {BATCH}: {plan:#}"
    );
}

//! An outage of any length kills no event: with `--max-attempts 2`, the broker
//! refusing connections or hanging for 20× the time two attempts take leaves every row
//! pending (none dead), holds no row lock once the outage is known, costs at most one
//! UPDATE per row, and everything is published once the broker is back. On
//! librdkafka's mock cluster and on a real broker (tansu).

use std::time::Duration;

use charges_tests::kafka::{BrokerKind, TestKafka};
use charges_tests::metrics::scrape;
use charges_tests::outbox::{count_outbox, insert_pending};
use charges_tests::{DEADLINE, TestDb, poll_until, start_relay};
use uuid::Uuid;

/// The relay's timeouts in these tests: two attempts take about 2 × (publish timeout
/// + the largest backoff) = 1.2 s.
const PUBLISH_TIMEOUT: &str = "500ms";
const BACKOFF_MAX: &str = "100ms";
const TWO_ATTEMPTS: Duration = Duration::from_millis(1200);
const ROWS: i32 = 60;

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Connections refused and reset.
    Refused,
    /// Connections kept, nothing answered.
    Hung,
}

async fn scalar(db: &TestDb, sql: &str) -> i64 {
    db.client()
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// Every UPDATE of an outbox row counts one on a sequence (sequences are not
/// transactional, so rolled-back batches count too).
async fn count_updates(db: &TestDb) {
    db.client()
        .batch_execute(
            "CREATE SEQUENCE outbox_updates;
             CREATE FUNCTION count_outbox_update() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM nextval('outbox_updates'); RETURN NEW; END $$;
             CREATE TRIGGER count_outbox_update BEFORE UPDATE ON outbox
                FOR EACH ROW EXECUTE FUNCTION count_outbox_update();
             SELECT nextval('outbox_updates');",
        )
        .await
        .expect("count updates");
}

async fn updates(db: &TestDb) -> i64 {
    scalar(db, "SELECT last_value FROM outbox_updates").await
}

/// Rows nobody holds a lock on, among the unpublished ones, against all of them.
async fn unlocked_and_unpublished(db: &TestDb) -> (i64, i64) {
    let session = db.session().await;
    let row = session
        .query_one(
            "SELECT (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE published_at IS NULL
                                            FOR UPDATE SKIP LOCKED) free),
                    (SELECT count(*) FROM outbox WHERE published_at IS NULL)",
            &[],
        )
        .await
        .expect("count locked rows");
    (row.get(0), row.get(1))
}

async fn metric(url: &str, name: &str) -> f64 {
    charges_tests::metrics::sample(&scrape(&reqwest::Client::new(), url).await, name, &[])
}

async fn outage(kind: BrokerKind, fault: Fault) {
    let db = TestDb::new().await;
    count_updates(&db).await;
    let kafka = TestKafka::of(kind, 3).await;
    let (relay, metrics) = start_relay(
        &db,
        &kafka,
        &[
            "--max-attempts",
            "2",
            "--publish-timeout",
            PUBLISH_TIMEOUT,
            "--backoff-base",
            "50ms",
            "--backoff-max",
            BACKOFF_MAX,
            "--broker-probe-max",
            "1s",
            "--poll-interval",
            "100ms",
            "--batch-size",
            "20",
        ],
    )
    .await;
    let warm_up = insert_pending(&db, 1, 0).await;
    poll_until("the first row is published", async || {
        (count_outbox(&db, "published_at IS NOT NULL").await == 1).then_some(())
    })
    .await;

    // A broker that has just created the topic may turn the first messages away, an
    // outage of its own (seen on tansu under load): count what the log holds already.
    let outages_before = relay.output_text().matches("broker unavailable").count();
    let recoveries_before = relay
        .output_text()
        .matches("broker available again")
        .count();
    match fault {
        Fault::Refused => kafka.refuse(),
        Fault::Hung => kafka.hang(),
    }
    let ids = insert_pending(&db, ROWS, 0).await;
    relay
        .wait_for_log("broker unavailable", outages_before + 1)
        .await;
    // Batches that were waiting for acknowledgements release their rows at once.
    poll_until("no row locked once the outage is known", async || {
        let (unlocked, unpublished) = unlocked_and_unpublished(&db).await;
        (unlocked == unpublished).then_some(())
    })
    .await;
    let updates_at_start = updates(&db).await;
    assert_eq!(
        metric(&metrics, "charges_relay_broker_available").await,
        0.0,
        "{}",
        relay.output_text()
    );

    // The outage lasts 20× what two attempts take (the scenario, not a wait for an
    // event); sampled throughout.
    let until = tokio::time::Instant::now() + TWO_ATTEMPTS * 20;
    while tokio::time::Instant::now() < until {
        let (unlocked, unpublished) = unlocked_and_unpublished(&db).await;
        assert_eq!(unlocked, unpublished, "a row lock held during the outage");
        assert_eq!(
            unpublished,
            i64::from(ROWS),
            "rows went missing or were published"
        );
        assert_eq!(
            count_outbox(&db, "dead_at IS NOT NULL").await,
            0,
            "a row died of the outage"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let churn = updates(&db).await - updates_at_start;
    assert!(
        churn <= i64::from(ROWS),
        "{churn} outbox UPDATEs during the outage for {ROWS} rows: per-row retries"
    );
    let attempts = scalar(&db, "SELECT coalesce(max(attempts), 0)::bigint FROM outbox").await;
    assert!(
        attempts <= 2,
        "a row was attempted {attempts} times during the outage"
    );
    let recorded = count_outbox(
        &db,
        "published_at IS NULL AND attempts >= 1 AND rejections = 0
         AND last_error LIKE 'unavailable: %'",
    )
    .await;
    assert!(recorded > 0, "the outage is not visible on the rows");

    kafka.restore();
    poll_until("every row is published after the outage", async || {
        (count_outbox(&db, "published_at IS NULL").await == 0).then_some(())
    })
    .await;
    assert_eq!(count_outbox(&db, "dead_at IS NOT NULL").await, 0);
    relay
        .wait_for_log("broker available again", recoveries_before + 1)
        .await;
    assert_eq!(
        metric(&metrics, "charges_relay_broker_available").await,
        1.0
    );
    assert!(metric(&metrics, "charges_relay_broker_outages_total").await >= 1.0);

    let mut reader = kafka.reader();
    let all: Vec<String> = warm_up.iter().chain(&ids).map(Uuid::to_string).collect();
    reader
        .read_until(DEADLINE, "every id", |messages| {
            all.iter()
                .all(|id| messages.iter().any(|m| m.header("id") == Some(id.as_str())))
        })
        .await;
}

#[tokio::test]
async fn mock_broker_refusing_connections_kills_no_row() {
    outage(BrokerKind::Mock, Fault::Refused).await;
}

#[tokio::test]
async fn mock_broker_hanging_kills_no_row() {
    outage(BrokerKind::Mock, Fault::Hung).await;
}

#[tokio::test]
async fn tansu_refusing_connections_kills_no_row() {
    outage(BrokerKind::Tansu, Fault::Refused).await;
}

#[tokio::test]
async fn tansu_hanging_kills_no_row() {
    outage(BrokerKind::Tansu, Fault::Hung).await;
}

//! The maintenance jobs and readiness, as an operator relies on them: a job that keeps
//! failing makes the relay unready and says why; reconciliation never raises a false
//! alarm because of retention, whatever retention ran before, nor for an event an
//! operator discarded; one relay per interval pays for reconciliation's whole-table
//! reads, and every relay exports its result; a relay deployed before its migration
//! waits, unready, instead of failing batch after batch.

use charges_tests::kafka::TestKafka;
use charges_tests::metrics::{sample, scrape_until, scrape_until_job_succeeded};
use charges_tests::outbox::{count_outbox, insert_dead, insert_pending};
use charges_tests::{Process, TestDb, log_field, poll_until, relay_command, start_relay};
use reqwest::StatusCode;

/// Polls `GET url` until it answers `status`; returns the body.
async fn wait_for_status(url: &str, status: StatusCode, what: &str) -> String {
    let http = reqwest::Client::new();
    poll_until(what, async || {
        let response = http.get(url).send().await.ok()?;
        (response.status() == status).then_some(())?;
        response.text().await.ok()
    })
    .await
}

fn readyz(metrics_url: &str) -> String {
    metrics_url.replace("/metrics", "/readyz")
}

/// A job that keeps failing for a reason other than an unreachable database (here: its
/// table was renamed away, as a missing grant or a botched migration would) turns
/// `/readyz` 503 naming the job, logs why, and the relay is ready again once the job
/// works again.
#[tokio::test]
async fn a_maintenance_job_that_keeps_failing_makes_the_relay_unready() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let (relay, metrics) = start_relay(&db, &kafka, &["--cleanup-interval", "100ms"]).await;
    let ready = readyz(&metrics);
    wait_for_status(&ready, StatusCode::OK, "the relay is ready").await;

    db.client()
        .batch_execute("ALTER TABLE idempotency_keys RENAME TO idempotency_keys_away")
        .await
        .unwrap();
    let body = wait_for_status(
        &ready,
        StatusCode::SERVICE_UNAVAILABLE,
        "the relay is unready while a job fails",
    )
    .await;
    assert!(body.contains("purge_expired_keys keeps failing"), "{body}");
    assert!(body.contains("idempotency_keys"), "{body}");
    relay
        .wait_for_log("not ready: a component keeps failing", 1)
        .await;

    db.client()
        .batch_execute("ALTER TABLE idempotency_keys_away RENAME TO idempotency_keys")
        .await
        .unwrap();
    wait_for_status(&ready, StatusCode::OK, "ready again once the job works").await;
    relay.wait_for_log("component works again", 1).await;
}

/// Events published and deleted under a short retention leave charges "without" their
/// outbox row. A relay restarted with the default (7 days) retention must not count
/// them: retention recorded how far it deleted. A charge that really lacks its event
/// is still counted.
#[tokio::test]
async fn reconciliation_ignores_what_any_earlier_retention_deleted() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    insert_pending(&db, 3, 0).await;
    let (mut short, _) = start_relay(
        &db,
        &kafka,
        &["--published-retention", "1s", "--cleanup-interval", "100ms"],
    )
    .await;
    poll_until(
        "the published events are deleted by retention",
        async || (count_outbox(&db, "true").await == 0).then_some(()),
    )
    .await;
    short.stop().await;

    let (relay, metrics) = start_relay(&db, &kafka, &["--reconcile-interval", "100ms"]).await;
    let http = reqwest::Client::new();
    let page = scrape_until_job_succeeded(&http, &metrics, "reconcile").await;
    assert_eq!(
        sample(&page, "charges_reconcile_charges_without_outbox", &[]),
        0.0,
        "{page}"
    );
    assert!(
        !relay.output_text().contains("broken invariants"),
        "{}",
        relay.output_text()
    );

    // The check still sees a charge that never had its event.
    db.client()
        .batch_execute(
            "INSERT INTO charges (id, amount_cents, currency) VALUES (gen_random_uuid(), 100, 'EUR')",
        )
        .await
        .unwrap();
    scrape_until(&http, &metrics, "the charge without its event", |page| {
        sample(page, "charges_reconcile_charges_without_outbox", &[]) == 1.0
    })
    .await;
}

/// Reconciliation is counted once per interval for all relays: a relay that starts
/// while a recent result exists exports that result (with when it was counted) instead
/// of reading the tables again; a relay whose interval says the result is due counts
/// again, and the new result is everyone's.
#[tokio::test]
async fn reconciliation_is_counted_once_per_interval_for_every_relay() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let hourly = ["--reconcile-interval", "1h"];
    let http = reqwest::Client::new();
    let (_first, first_metrics) = start_relay(&db, &kafka, &hourly).await;
    let page = scrape_until(&http, &first_metrics, "the first relay counted", |page| {
        sample(page, "charges_reconcile_checked_at_timestamp_seconds", &[]) > 0.0
    })
    .await;
    let counted_at = sample(&page, "charges_reconcile_checked_at_timestamp_seconds", &[]);
    let recorded = || async {
        let row = db
            .client()
            .query_one(
                "SELECT extract(epoch FROM checked_at)::float8, charges_without_outbox
                   FROM reconciliation_result",
                &[],
            )
            .await
            .expect("the shared result");
        (row.get::<_, f64>(0), row.get::<_, i64>(1))
    };
    let (first_at, first_count) = recorded().await;
    assert_eq!(first_count, 0);
    assert!(
        (first_at - counted_at).abs() < 0.002,
        "{first_at} vs {counted_at}"
    );

    // Broken now; a second hourly relay must not see it: it does not count.
    db.client()
        .batch_execute(
            "INSERT INTO charges (id, amount_cents, currency) VALUES (gen_random_uuid(), 100, 'EUR')",
        )
        .await
        .unwrap();
    let (second, second_metrics) = start_relay(&db, &kafka, &hourly).await;
    let page = scrape_until_job_succeeded(&http, &second_metrics, "reconcile").await;
    assert_eq!(
        sample(&page, "charges_reconcile_checked_at_timestamp_seconds", &[]),
        counted_at,
        "the second relay exports the first one's result: {page}"
    );
    assert_eq!(
        sample(&page, "charges_reconcile_charges_without_outbox", &[]),
        0.0
    );
    assert_eq!(recorded().await, (first_at, 0), "nothing was counted again");
    assert!(!second.output_text().contains("broken invariants"));

    // A relay for which the result is due counts, and records what it found.
    let (_third, third_metrics) =
        start_relay(&db, &kafka, &["--reconcile-interval", "100ms"]).await;
    scrape_until(
        &http,
        &third_metrics,
        "the charge without its event",
        |page| sample(page, "charges_reconcile_charges_without_outbox", &[]) == 1.0,
    )
    .await;
    let (later_at, count) = recorded().await;
    assert!(later_at > first_at, "{later_at} after {first_at}");
    assert_eq!(count, 1);
}

/// A relay (`--reconcile-interval 1h`, so its first count is its only one) whose
/// reconciliation count has waited at least `waited_secs` for a lock on `charges`, its
/// metrics URL, and the session holding that lock in an open transaction (`COMMIT` or
/// `ROLLBACK` lets the count go on).
async fn relay_with_its_count_held_back(
    db: &TestDb,
    kafka: &TestKafka,
    waited_secs: f64,
) -> (Process, String, tokio_postgres::Client) {
    let blocker = db.session().await;
    blocker
        .batch_execute("BEGIN; LOCK TABLE charges IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let (relay, metrics) = start_relay(db, kafka, &["--reconcile-interval", "1h"]).await;
    db.wait_for(
        "SELECT count(*) > 0 FROM pg_stat_activity
          WHERE application_name = 'charges-relay' AND wait_event_type = 'Lock'
            AND query LIKE '%without_outbox%'
            AND clock_timestamp() - query_start >= $1::float8 * interval '1 second'",
        &[&waited_secs],
        "the count waited for the lock on charges",
    )
    .await;
    (relay, metrics, blocker)
}

/// A count reads whole tables and may take longer than a batch transaction may (the
/// relay's statement timeout, `--publish-timeout` + 2 s): at 5 million rows `make bench`
/// saw every count cancelled by it, which would leave the gauges stale for good. Here a
/// lock holds the count back past that timeout; it finishes once the lock goes.
#[tokio::test]
async fn a_reconciliation_count_may_outlast_a_batch_transaction() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    // start_relay's --publish-timeout is 2s: batch transactions end within 4 s.
    let (relay, metrics, blocker) = relay_with_its_count_held_back(&db, &kafka, 5.0).await;
    blocker.batch_execute("COMMIT").await.unwrap();
    let page = scrape_until(
        &reqwest::Client::new(),
        &metrics,
        "the count finished",
        |page| sample(page, "charges_reconcile_checked_at_timestamp_seconds", &[]) > 0.0,
    )
    .await;
    assert_eq!(
        sample(&page, "charges_reconcile_charges_without_outbox", &[]),
        0.0
    );
    assert!(
        !relay.output_text().contains("maintenance job failed"),
        "{}",
        relay.output_text()
    );
}

/// A count that may run for its whole interval must not hold up a relay's exit: on
/// SIGTERM it is dropped after a batch's bound (its transaction rolls back; it is a read
/// the next relay repeats) and the relay exits 0, saying so. Nor may it outlive the
/// relay in Postgres, still reading and holding the check's lock.
#[tokio::test]
async fn sigterm_does_not_wait_for_a_long_reconciliation_count() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let (mut relay, _, blocker) = relay_with_its_count_held_back(&db, &kafka, 0.0).await;
    // The count may wait an hour; the exit must not.
    relay.stop().await;
    assert!(
        relay
            .output_text()
            .contains("a maintenance job still running at shutdown was stopped"),
        "{}",
        relay.output_text()
    );
    wait_until_no_count_runs(&db).await;
    blocker.batch_execute("ROLLBACK").await.unwrap();
}

/// A relay killed outright (SIGKILL, the OOM killer) while it counts: Postgres ends the
/// count by itself, instead of reading whole tables for the count's timeout (the
/// interval, 5 min by default) with nobody to read the result, and holding the check's
/// lock so that no other relay counts meanwhile.
#[tokio::test]
async fn a_count_ends_with_its_killed_relay() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let (mut relay, _, blocker) = relay_with_its_count_held_back(&db, &kafka, 0.0).await;
    relay.kill9().await;
    // While the blocker holds its lock the count can only wait: if its backend ends
    // now, Postgres noticed the relay was gone.
    wait_until_no_count_runs(&db).await;
    blocker.batch_execute("ROLLBACK").await.unwrap();
}

async fn wait_until_no_count_runs(db: &TestDb) {
    db.wait_for(
        "SELECT count(*) = 0 FROM pg_stat_activity
          WHERE application_name = 'charges-relay' AND query LIKE '%without_outbox%'",
        &[],
        "the count's backend ended after its relay",
    )
    .await;
}

/// `dead discard`: refused without `--yes` off a terminal and for a row that is not
/// dead; with `--yes` the row moves to `outbox_discarded` with who and when, the audit
/// line names it, and reconciliation counts its charge as accounted for.
#[tokio::test]
async fn a_discarded_event_is_kept_aside_and_accounted_for() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let poisoned = insert_dead(&db, &kafka).await;
    let healthy = insert_pending(&db, 1, 0).await[0];

    let id = poisoned.to_string();
    let unconfirmed = charges_relay(&db, &["dead", "discard", &id]);
    assert_eq!(unconfirmed.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unconfirmed.stderr).contains("--yes"));
    let not_dead = charges_relay(&db, &["dead", "discard", "--yes", &healthy.to_string()]);
    assert_eq!(not_dead.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&not_dead.stderr).contains(&healthy.to_string()));
    assert_eq!(count_outbox(&db, "true").await, 2, "nothing was discarded");

    let out = relay_command(&db, &["dead", "discard", "--yes", "--by", "alice", &id]);
    assert!(
        out.contains(&format!("discarded {id}")) && out.contains("by alice"),
        "{out}"
    );
    let row = db
        .client()
        .query_one(
            "SELECT discarded_by, database_role, last_error IS NOT NULL FROM outbox_discarded
              WHERE id = $1",
            &[&poisoned],
        )
        .await
        .expect("the discarded row is kept");
    assert_eq!(row.get::<_, String>(0), "alice");
    assert_eq!(row.get::<_, String>(1), "postgres");
    assert!(row.get::<_, bool>(2));
    assert_eq!(count_outbox(&db, &format!("id = '{id}'")).await, 0);

    let (_relay, metrics) = start_relay(&db, &kafka, &["--reconcile-interval", "100ms"]).await;
    let page = scrape_until_job_succeeded(&reqwest::Client::new(), &metrics, "reconcile").await;
    assert_eq!(
        sample(&page, "charges_reconcile_charges_without_outbox", &[]),
        0.0
    );
}

fn charges_relay(db: &TestDb, args: &[&str]) -> std::process::Output {
    std::process::Command::new(charges_tests::binary("charges-relay"))
        .args(args)
        .env("DATABASE_URL", &db.url)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run charges-relay")
}

/// A relay started before the migration it needs waits, unready and saying so, and
/// starts by itself once the schema is there.
#[tokio::test]
async fn a_relay_waits_for_its_schema() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let latest = db.forget_latest_migration().await;
    let id = insert_pending(&db, 1, 0).await[0];
    let (relay, line) = Process::start(
        "charges-relay",
        &[
            "--database-url",
            db.url.as_str(),
            "--kafka-brokers",
            kafka.bootstrap.as_str(),
            "--topic",
            kafka.topic.as_str(),
            "--metrics-listen",
            "127.0.0.1:0",
            "--poll-interval",
            "100ms",
        ],
        &[],
        "operations port listening",
    )
    .await;
    let addr = log_field(&line, "metrics_addr").expect("metrics_addr");
    relay
        .wait_for_log("waiting for the database schema", 1)
        .await;
    let body = wait_for_status(
        &format!("http://{addr}/readyz"),
        StatusCode::SERVICE_UNAVAILABLE,
        "unready while the schema is behind",
    )
    .await;
    assert!(body.contains("schema"), "{body}");
    assert!(!relay.output_text().contains("relay started"));

    db.restore_migration(&latest).await;
    relay.wait_for_log("relay started", 1).await;
    db.wait_for(
        "SELECT published_at IS NOT NULL FROM outbox WHERE id = $1",
        &[&id],
        "the waiting row is published",
    )
    .await;
    wait_for_status(&format!("http://{addr}/readyz"), StatusCode::OK, "ready").await;
}

//! Every binary behind a real PgBouncer 1.18 in transaction pooling, its settings at
//! their defaults but the pool size (tests/src/pgbouncer.rs): what works, what the
//! timeouts still bound, what is refused with the fix named, and how the relay wakes.

use std::collections::BTreeSet;
use std::time::Duration;

use charges_tests::kafka::{BrokerKind, TestKafka};
use charges_tests::metrics::{sample, scrape_until};
use charges_tests::outbox::count_outbox;
use charges_tests::pgbouncer::{
    PgBouncerSettings, TestPgBouncer, assert_statements_stay_prepared, bound_server_sessions,
};
use charges_tests::{
    DEADLINE, Process, TestApi, TestDb, binary, expect_problem, new_key, poll_until,
    start_consumer, start_relay,
};
use futures::future::join_all;
use reqwest::StatusCode;
use uuid::Uuid;

const POOLED: [&str; 2] = ["--db-pooler", "transaction"];
const POOLED_PREPARED: [&str; 2] = ["--db-pooler", "transaction-prepared"];

/// Which PgBouncer sits in front, and the `--db-pooler` that goes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bouncer {
    /// Debian bookworm's 1.18, at its defaults: statements go unnamed.
    Debian,
    /// The pinned one the images ship, with `max_prepared_statements`: statements are
    /// prepared through it.
    KeepsPreparedStatements,
}

impl Bouncer {
    fn pooler_args(self) -> &'static [&'static str] {
        match self {
            Bouncer::Debian => &POOLED,
            Bouncer::KeepsPreparedStatements => &POOLED_PREPARED,
        }
    }
}

/// A test database whose server sessions are bounded as a deployment's roles are, and
/// a PgBouncer in front of it (8 server connections); returns both and the pooled URL.
async fn behind_pgbouncer(statement: Duration) -> (TestDb, TestPgBouncer, String) {
    behind(Bouncer::Debian, statement).await
}

async fn behind(kind: Bouncer, statement: Duration) -> (TestDb, TestPgBouncer, String) {
    let db = TestDb::new().await;
    bound_server_sessions(&db, statement, statement * 2).await;
    let bouncer = TestPgBouncer::start_with(PgBouncerSettings {
        keeps_prepared_statements: kind == Bouncer::KeepsPreparedStatements,
        ..PgBouncerSettings::default()
    })
    .await;
    let url = bouncer.url(&db);
    (db, bouncer, url)
}

/// Runs a binary to its end; returns whether it succeeded and what it printed.
fn run(name: &str, args: &[&str]) -> (bool, String) {
    let output = std::process::Command::new(binary(name))
        .args(args)
        .env_remove("DATABASE_URL")
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// A charge and its replay, then a read, then (every third charge) a refund and its
/// replay; returns every status seen.
async fn one_customer(api: &TestApi, n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    let key = new_key();
    let body = format!(r#"{{"amountCents":{}}}"#, 1000 + n);
    let created = api.post_charge(Some(&key), &body).await;
    statuses.push(created.status().as_u16());
    let location = created
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let replay = api.post_charge(Some(&key), &body).await;
    statuses.push(replay.status().as_u16());
    assert_eq!(
        replay
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "the retry is a replay"
    );
    statuses.push(api.get(&location).await.status().as_u16());
    if n.is_multiple_of(3) {
        let charge_id = location.trim_start_matches("/charges/");
        let refund_key = new_key();
        for _ in 0..2 {
            let refund = api.post_refund(charge_id, &refund_key, "{}").await;
            statuses.push(refund.status().as_u16());
        }
    }
    statuses
}

/// The API with a pool of 32, two relays, and the consumer, all through a PgBouncer
/// of 8 server connections: charges, replays, reads, refunds and a same-key burst
/// answer without a 5xx, each key makes one charge, every event is published once
/// acknowledged and applied once, and Postgres never sees more than 8 sessions from
/// the pooler.
#[tokio::test]
async fn every_binary_works_through_pgbouncer_with_fewer_server_connections() {
    through_pgbouncer(BrokerKind::Mock, Bouncer::Debian).await;
}

/// The same with a real Kafka-protocol broker (tansu) behind the relays; the consumer,
/// which needs consumer groups, is left to the mock's run.
#[tokio::test]
async fn tansu_the_api_and_relays_work_through_pgbouncer_to_a_real_broker() {
    through_pgbouncer(BrokerKind::Tansu, Bouncer::Debian).await;
}

/// The same through PgBouncer 1.24 with `max_prepared_statements` and `--db-pooler
/// transaction-prepared`: statements are prepared once per client connection and bound
/// many times through the pooler (its own counters), with the same guarantees.
#[tokio::test]
async fn every_binary_works_through_a_pgbouncer_that_keeps_prepared_statements() {
    through_pgbouncer(BrokerKind::Mock, Bouncer::KeepsPreparedStatements).await;
}

async fn through_pgbouncer(broker: BrokerKind, kind: Bouncer) {
    let (db, bouncer, pooled) = behind(kind, Duration::from_secs(2)).await;
    let kafka = TestKafka::of(broker, 3).await;
    let api_args = [kind.pooler_args(), &["--db-pool-size", "32"]].concat();
    let api = TestApi::start_at(&pooled, &api_args).await;
    let relay_args = [
        kind.pooler_args(),
        &["--database-url", &pooled, "--listen-database-url", &db.url],
    ]
    .concat();
    let (mut relay_1, _) = start_relay(&db, &kafka, &relay_args).await;
    let (mut relay_2, _) = start_relay(&db, &kafka, &relay_args).await;
    let consumer = match broker {
        BrokerKind::Mock => Some(start_pooled_consumer(&db, &kafka, &pooled, kind).await),
        BrokerKind::Tansu => None,
    };

    let watcher = bouncer.watch_server_sessions(&db);
    let customers = 48;
    let statuses: Vec<u16> = join_all((0..customers).map(|n| one_customer(&api, n)))
        .await
        .concat();
    let burst_key = new_key();
    let burst =
        join_all((0..20).map(|_| api.post_charge(Some(&burst_key), r#"{"amountCents":777}"#)))
            .await;
    let burst_statuses: Vec<u16> = burst.iter().map(|r| r.status().as_u16()).collect();
    let most_sessions = watcher.stop().await;

    assert!(
        statuses.iter().all(|s| *s < 500) && burst_statuses.iter().all(|s| *s < 500),
        "a 5xx through the pooler: {statuses:?} {burst_statuses:?}"
    );
    assert!(
        burst_statuses.iter().all(|s| *s == 201 || *s == 409),
        "the burst answers 201 (created or replayed) or 409 only: {burst_statuses:?}"
    );
    let refunds = customers.div_ceil(3) as i64;
    assert_eq!(
        db.count("charges").await,
        customers as i64 + 1,
        "one charge per key"
    );
    assert_eq!(db.count("refunds").await, refunds, "one refund per key");
    assert!(
        (1..=8).contains(&most_sessions),
        "Postgres saw {most_sessions} sessions from PgBouncer (pool size 8)"
    );

    let events = customers as i64 + 1 + refunds;
    poll_until("every event is published", async || {
        (count_outbox(&db, "published_at IS NOT NULL").await == events).then_some(())
    })
    .await;
    assert_eq!(
        count_outbox(&db, "dead_at IS NOT NULL").await,
        0,
        "no dead row"
    );
    let ids: BTreeSet<String> = db
        .client()
        .query("SELECT id::text FROM outbox", &[])
        .await
        .expect("outbox ids")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut reader = kafka.reader();
    reader
        .read_until(DEADLINE, "every outbox id", |messages| {
            let seen: BTreeSet<String> = messages
                .iter()
                .filter_map(|m| m.header("id").map(str::to_owned))
                .collect();
            ids.is_subset(&seen)
        })
        .await;
    if consumer.is_some() {
        db.wait_for(
            "SELECT count(*) = $1 FROM processed_events",
            &[&events],
            "the consumer applied every event through the pooler",
        )
        .await;
    }
    for relay in [&mut relay_1, &mut relay_2] {
        relay.stop().await;
    }
    drop(consumer);
    if kind == Bouncer::KeepsPreparedStatements {
        // The pool's connections have prepared their statements by now.
        assert_statements_stay_prepared(&bouncer.console_url(), &db.name, 64, async |n| {
            let created = api
                .post_charge(
                    Some(&new_key()),
                    &format!(r#"{{"amountCents":{}}}"#, 100 + n),
                )
                .await;
            assert_eq!(created.status(), StatusCode::CREATED);
        })
        .await;
    }
}

/// The reference consumer through the pooler. Its migrations need a session (they
/// are refused through the pooler), so a first run on the direct URL applies them.
async fn start_pooled_consumer(
    db: &TestDb,
    kafka: &TestKafka,
    pooled: &str,
    kind: Bouncer,
) -> Process {
    let mut migrator = start_consumer(db, kafka, "pooled-ledger", &[]).await;
    migrator.stop().await;
    let args = [
        "--database-url",
        pooled,
        kind.pooler_args()[0],
        kind.pooler_args()[1],
        "--kafka-brokers",
        kafka.bootstrap.as_str(),
        "--topic",
        kafka.topic.as_str(),
        "--group-id",
        "pooled-ledger",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    Process::start("charges-consumer", &args, &[], "consumer started")
        .await
        .0
}

/// A charge whose table another session holds locked answers 503 once the statement
/// timeout cancels it, directly and through the pooler alike, while the lock is still
/// held; the retry with the same key after the lock is gone creates the charge.
#[tokio::test]
async fn a_locked_table_answers_503_within_the_statement_timeout_through_the_pooler() {
    let (db, _bouncer, pooled) = behind_pgbouncer(Duration::from_secs(1)).await;
    for (url, pooler) in [(db.url.as_str(), "none"), (pooled.as_str(), "transaction")] {
        let through = format!("--db-pooler {pooler}");
        let args = ["--db-pooler", pooler, "--db-statement-timeout", "1s"];
        let api = TestApi::start_at(url, &args).await;
        let locker = db.session().await;
        locker
            .batch_execute(
                "SET idle_in_transaction_session_timeout = 0;
                 BEGIN; LOCK TABLE charges IN ACCESS EXCLUSIVE MODE",
            )
            .await
            .expect("lock the charges table");
        let key = new_key();
        let refused = api.post_charge(Some(&key), r#"{"amountCents":4900}"#).await;
        assert!(
            refused.headers().contains_key("retry-after"),
            "{through:?}: Retry-After"
        );
        let problem = expect_problem(refused, StatusCode::SERVICE_UNAVAILABLE).await;
        assert_eq!(
            problem["type"], "/problems/service-unavailable",
            "{through:?}"
        );
        let held: bool = locker
            .query_one(
                "SELECT count(*) = 1 FROM pg_locks
                  WHERE relation = 'charges'::regclass AND mode = 'AccessExclusiveLock' AND granted",
                &[],
            )
            .await
            .expect("the lock is still held")
            .get(0);
        assert!(
            held,
            "{through:?}: the 503 came while the table was still locked"
        );
        locker.batch_execute("ROLLBACK").await.expect("unlock");
        let retried = api.post_charge(Some(&key), r#"{"amountCents":4900}"#).await;
        assert_eq!(
            retried.status(),
            StatusCode::CREATED,
            "{through:?}: the retry"
        );
        assert!(retried.headers().get("idempotent-replayed").is_none());
    }
}

/// Through a transaction pooler the connection's own timeouts cannot reach the server;
/// a server that does not bound sessions itself is refused at start, with the fix.
#[tokio::test]
async fn behind_a_pooler_an_unbounded_server_refuses_start_up_with_the_fix_named() {
    let db = TestDb::new().await;
    let bouncer = TestPgBouncer::start().await;
    let pooled = bouncer.url(&db);
    let (started, output) = run(
        "charges-api",
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &pooled,
            "--db-pooler",
            "transaction",
        ],
    );
    assert!(
        !started,
        "the API started against an unbounded server:\n{output}"
    );
    assert!(
        output.contains("statement_timeout") && output.contains("ALTER ROLE"),
        "the refusal names the setting and the fix:\n{output}"
    );
}

/// Migrations hold a session-level lock across transactions: through the pooler they
/// are refused, and the message says to use Postgres's own URL. Without
/// `--db-pooler transaction`, PgBouncer's refusal of the connection's startup options
/// is explained the same way.
#[tokio::test]
async fn migrations_through_the_pooler_are_refused_naming_the_direct_url() {
    let (db, _bouncer, pooled) = behind_pgbouncer(Duration::from_secs(2)).await;
    let attempts: [(&str, Vec<&str>); 4] = [
        (
            "charges-api",
            [&["migrate", "--database-url", &pooled][..], &POOLED[..]].concat(),
        ),
        ("charges-api", vec!["migrate", "--database-url", &pooled]),
        (
            "charges-relay",
            [&["--migrate", "--database-url", &pooled][..], &POOLED[..]].concat(),
        ),
        (
            "charges-consumer",
            [&["--migrate", "--database-url", &pooled][..], &POOLED[..]].concat(),
        ),
    ];
    for (binary_name, args) in attempts {
        let (ok, output) = run(binary_name, &args);
        assert!(
            !ok,
            "{binary_name} {args:?} migrated through the pooler:\n{output}"
        );
        assert!(
            output.contains("Postgres's own URL") || output.contains("--db-pooler transaction"),
            "{binary_name} {args:?} names the fix:\n{output}"
        );
    }
    assert!(
        db.count("charges_schema_history").await > 0,
        "the test database itself was migrated directly"
    );
}

/// Behind the pooler, a relay LISTENing on Postgres's own URL publishes a new charge's
/// event at once: its poll interval (an hour) could not have found it.
#[tokio::test]
async fn behind_a_pooler_a_direct_listener_wakes_the_relay_without_a_poll() {
    let (db, _bouncer, pooled) = behind_pgbouncer(Duration::from_secs(2)).await;
    let kafka = TestKafka::new(1).await;
    let api = TestApi::start_at(&pooled, &POOLED).await;
    let relay_args = [
        &POOLED[..],
        &[
            "--database-url",
            &pooled,
            "--listen-database-url",
            &db.url,
            "--poll-interval",
            "1h",
        ],
    ]
    .concat();
    let (_relay, metrics_url) = start_relay(&db, &kafka, &relay_args).await;
    let http = reqwest::Client::new();
    scrape_until(&http, &metrics_url, "the listener is connected", |page| {
        sample(page, "charges_relay_listener_connected", &[]) == 1.0
    })
    .await;
    db.wait_for(
        "SELECT coalesce(bool_or(requested), false) FROM outbox_wakeup",
        &[],
        "the idle relay asks for notifications",
    )
    .await;
    let created = api
        .post_charge(Some(&new_key()), r#"{"amountCents":4900}"#)
        .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let id: Uuid = db
        .client()
        .query_one("SELECT id FROM outbox", &[])
        .await
        .expect("the outbox row")
        .get(0);
    kafka
        .reader()
        .read_until(DEADLINE, "the charge's event", |messages| {
            messages
                .iter()
                .any(|m| m.header("id") == Some(&id.to_string()))
        })
        .await;
}

/// Given only the pooled URL, the relay polls: it says so once at start and in its
/// gauge, never asks inserts to notify, and still publishes.
#[tokio::test]
async fn behind_a_pooler_without_a_listener_the_relay_polls_and_warns() {
    let (db, _bouncer, pooled) = behind_pgbouncer(Duration::from_secs(2)).await;
    let kafka = TestKafka::new(1).await;
    let api = TestApi::start_at(&pooled, &POOLED).await;
    let (relay, metrics_url) = start_relay(
        &db,
        &kafka,
        &[&POOLED[..], &["--database-url", &pooled]].concat(),
    )
    .await;
    assert_eq!(
        relay.output_text().matches("no LISTEN session").count(),
        1,
        "one warning at start:\n{}",
        relay.output_text()
    );
    let page = scrape_until(
        &reqwest::Client::new(),
        &metrics_url,
        "the listener gauge",
        |page| page.contains("charges_relay_listener_connected"),
    )
    .await;
    assert_eq!(sample(&page, "charges_relay_listener_connected", &[]), 0.0);
    let created = api
        .post_charge(Some(&new_key()), r#"{"amountCents":4900}"#)
        .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    db.wait_for(
        "SELECT bool_and(published_at IS NOT NULL) FROM outbox",
        &[],
        "the event is published by polling",
    )
    .await;
    let asked: bool = db
        .client()
        .query_one(
            "SELECT coalesce(bool_or(requested), false) FROM outbox_wakeup",
            &[],
        )
        .await
        .expect("the wake-up flag")
        .get(0);
    assert!(!asked, "a relay without a listener asked inserts to notify");
}

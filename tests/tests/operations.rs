//! Operations, end to end against the real binaries and a real Postgres: metrics
//! scraped from `/metrics`, health and readiness, request ids, graceful SIGTERM of the
//! API, retention of idempotency keys (`charges-relay purge`) and reconciliation.

use charges_tests::kafka::TestKafka;
use charges_tests::metrics::{
    assert_exports_build_process_and_pool, assert_only_scraped_names, job_succeeded, sample,
    scrape, scrape_until,
};
use charges_tests::outbox::count_outbox;
use charges_tests::promql;
use charges_tests::{
    TestApi, TestDb, binary, connect, new_key, poll_until, relay_command, start_relay,
};
use reqwest::StatusCode;
use serde_json::Value;
use uuid::Uuid;

const BODY: &str = r#"{"amountCents":4900,"currency":"EUR"}"#;

/// Reconciliation and retention every 200 ms, for the relays whose metrics are read.
const MAINTENANCE_OFTEN: &[&str] = &[
    "--reconcile-interval",
    "200ms",
    "--cleanup-interval",
    "200ms",
];

const IDEMPOTENCY: &str = "charges_api_idempotency_requests_total";
const DURATION_COUNT: &str = "charges_api_http_request_duration_seconds_count";

/// Build info, process and pool metrics on the API and the relay (the consumer's are
/// checked in consumer.rs, where it runs).
#[tokio::test]
async fn the_api_and_the_relay_export_build_info_process_and_pool_metrics() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let api = TestApi::start(&db, &[]).await;
    let text = scrape(&api.http, &api.url("/metrics")).await;
    assert_exports_build_process_and_pool(&text, "charges-api");
    let (relay, url) = start_relay(&db, &kafka, &[]).await;
    let text = scrape(&api.http, &url).await;
    assert_exports_build_process_and_pool(&text, "charges-relay");
    drop(relay);
}

#[tokio::test]
async fn idempotency_outcomes_and_request_durations_are_counted_by_route() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let metrics_url = api.url("/metrics");

    // created, then replayed.
    let key = new_key();
    let created = api.post_charge(Some(&key), BODY).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let charge: Value = created.json().await.unwrap();
    let charge_id = charge["id"].as_str().unwrap().to_owned();
    let replayed = api.post_charge(Some(&key), BODY).await;
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    // payload_conflict: same key, different body, 422.
    let conflict = api
        .post_charge(Some(&key), r#"{"amountCents":1,"currency":"EUR"}"#)
        .await;
    assert_eq!(conflict.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // invalid_key: 400, twice.
    for bad in ["not-a-uuid", ""] {
        let invalid = api.post_charge(Some(bad), BODY).await;
        assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
    }
    // in_flight: the test holds the advisory lock a concurrent request would hold.
    let busy_key = new_key();
    let mut holder = connect(&db.url).await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1 || ' ' || $2, 0))",
        &[&"/charges", &busy_key],
    )
    .await
    .unwrap();
    let in_flight = api.post_charge(Some(&busy_key), BODY).await;
    assert_eq!(in_flight.status(), StatusCode::CONFLICT);
    tx.rollback().await.unwrap();
    // A refund: the endpoint label is the route pattern, not the charge's path.
    let refund = api
        .post_refund(&charge_id, &new_key(), r#"{"amountCents":100}"#)
        .await;
    assert_eq!(refund.status(), StatusCode::CREATED);
    let got = api.get(&format!("/charges/{charge_id}")).await;
    assert_eq!(got.status(), StatusCode::OK);
    let unknown = api.get(&format!("/nowhere/{}", Uuid::new_v4())).await;
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);

    let text = scrape(&api.http, &metrics_url).await;
    let charges = |outcome| {
        sample(
            &text,
            IDEMPOTENCY,
            &[("endpoint", "/charges"), ("outcome", outcome)],
        )
    };
    assert_eq!(charges("created"), 1.0, "{text}");
    assert_eq!(charges("replayed"), 1.0, "{text}");
    assert_eq!(charges("payload_conflict"), 1.0, "{text}");
    assert_eq!(charges("invalid_key"), 2.0, "{text}");
    assert_eq!(charges("in_flight"), 1.0, "{text}");
    let refunds = &[
        ("endpoint", "/charges/{id}/refunds"),
        ("outcome", "created"),
    ];
    assert_eq!(sample(&text, IDEMPOTENCY, refunds), 1.0, "{text}");

    let requests = |route, status| {
        sample(
            &text,
            DURATION_COUNT,
            &[("route", route), ("status", status)],
        )
    };
    assert_eq!(
        requests("/charges", "201"),
        2.0,
        "created + replayed: {text}"
    );
    assert_eq!(requests("/charges", "422"), 1.0, "{text}");
    assert_eq!(requests("/charges", "400"), 2.0, "{text}");
    assert_eq!(requests("/charges", "409"), 1.0, "{text}");
    assert_eq!(requests("/charges/{id}/refunds", "201"), 1.0, "{text}");
    assert_eq!(requests("/charges/{id}", "200"), 1.0, "{text}");
    assert_eq!(requests("unmatched", "404"), 1.0, "{text}");
    // A real histogram (buckets), not a summary.
    assert!(
        text.contains("charges_api_http_request_duration_seconds_bucket{"),
        "{text}"
    );
    assert!(
        !text.contains(&charge_id),
        "a charge id leaked into a label"
    );

    // Counters only move forward, one per request.
    api.post_charge(Some(&key), BODY).await;
    let text = scrape(&api.http, &metrics_url).await;
    assert_eq!(
        sample(
            &text,
            IDEMPOTENCY,
            &[("endpoint", "/charges"), ("outcome", "replayed")]
        ),
        2.0
    );
}

#[tokio::test]
async fn no_idempotency_key_ever_appears_in_metrics() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let mut keys = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..25 {
        let key = new_key();
        let response = api.post_charge(Some(&key), BODY).await;
        assert_eq!(response.status(), StatusCode::CREATED);
        let charge: Value = response.json().await.unwrap();
        ids.push(charge["id"].as_str().unwrap().to_owned());
        // The same key with another body and again: every outcome path.
        api.post_charge(Some(&key), BODY).await;
        api.post_charge(Some(&key), r#"{"amountCents":7}"#).await;
        keys.push(key);
    }
    let text = scrape(&api.http, &api.url("/metrics")).await;
    assert_eq!(
        sample(&text, IDEMPOTENCY, &[("outcome", "created")]),
        25.0,
        "{text}"
    );
    for secret in keys.iter().chain(&ids) {
        assert!(!text.contains(secret.as_str()), "{secret} in /metrics");
    }
    // No label value is a UUID at all.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        for word in line.split('"') {
            assert!(Uuid::try_parse(word).is_err(), "UUID label in {line}");
        }
    }
}

async fn get(http: &reqwest::Client, url: &str) -> reqwest::Response {
    http.get(url).send().await.expect("GET")
}

async fn assert_not_ready(http: &reqwest::Client, url: &str, detail: &str) {
    let response = get(http, url).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "/problems/not-ready");
    assert_eq!(body["status"], 503);
    assert!(body["detail"].as_str().unwrap().contains(detail), "{body}");
}

/// Polls `url` until it answers `status`.
async fn wait_for_status(http: &reqwest::Client, url: &str, status: StatusCode) {
    poll_until(&format!("{url} answers {status}"), async || {
        (get(http, url).await.status() == status).then_some(())
    })
    .await;
}

/// Readiness: the schema behind this build (the last migration's history row removed,
/// as on a database the new migration has not reached yet) and an unreachable
/// database both answer 503; liveness stays 200 throughout.
#[tokio::test]
async fn readyz_is_503_when_the_schema_is_behind_or_the_database_unreachable() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let (healthz, readyz) = (api.url("/healthz"), api.url("/readyz"));
    assert_eq!(get(&api.http, &healthz).await.status(), StatusCode::OK);
    assert_eq!(get(&api.http, &readyz).await.status(), StatusCode::OK);

    let latest = db.forget_latest_migration().await;
    let version: i32 = latest.get(0);
    assert_not_ready(
        &api.http,
        &readyz,
        &format!(
            "charges schema is at version {} but this build expects {version}",
            Some(version - 1)
                .filter(|v| *v > 0)
                .map_or_else(|| "none".to_owned(), |v| v.to_string())
        ),
    )
    .await;
    assert_eq!(get(&api.http, &healthz).await.status(), StatusCode::OK);
    db.restore_migration(&latest).await;
    assert_eq!(get(&api.http, &readyz).await.status(), StatusCode::OK);

    db.refuse_connections(None).await;
    wait_for_status(&api.http, &readyz, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_not_ready(&api.http, &readyz, "cannot be reached").await;
    assert_eq!(get(&api.http, &healthz).await.status(), StatusCode::OK);
    db.allow_connections().await;
    wait_for_status(&api.http, &readyz, StatusCode::OK).await;
}

#[tokio::test]
async fn request_ids_are_echoed_or_generated_and_logged() {
    let db = TestDb::new().await;
    let api = TestApi::start(&db, &[]).await;
    let incoming = format!("req-{}", Uuid::new_v4().simple());
    let response = api
        .http
        .post(api.url("/charges"))
        .header("content-type", "application/json")
        .header("idempotency-key", new_key())
        .header("x-request-id", &incoming)
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.headers()["x-request-id"], incoming.as_str());

    // None, or one that is not sane: a fresh UUID per request, also on errors.
    let mut generated = Vec::new();
    for header in [None, Some("has spaces"), Some(&*"x".repeat(200))] {
        let mut request = api.http.get(api.url("/nowhere"));
        if let Some(value) = header {
            request = request.header("x-request-id", value);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let id = response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(Uuid::try_parse(&id).is_ok(), "{id}");
        generated.push(id);
    }
    generated.dedup();
    assert_eq!(generated.len(), 3, "ids are unique");

    // Every line the request logged carries its id (the span), the handler's too.
    for marker in ["idempotent request", "request finished"] {
        poll_until(&format!("a {marker:?} line with {incoming}"), async || {
            let output = api.process.output_text();
            let found = output
                .lines()
                .any(|l| l.contains(&incoming) && l.contains(marker));
            found.then_some(())
        })
        .await;
    }
    let output = api.process.output_text();
    assert!(output.contains(&generated[0]), "{output}");
}

/// SIGTERM with a request in flight (blocked on a table lock the test holds): the API
/// stops accepting at once, finishes that request with 201 once the lock goes, and
/// exits 0.
#[tokio::test]
async fn sigterm_drains_the_in_flight_request_then_exits_zero() {
    let db = TestDb::new().await;
    let mut api = TestApi::start(&db, &["--db-statement-timeout", "30s"]).await;
    let addr = api.base_url.trim_start_matches("http://").to_owned();

    let locker = connect(&db.url).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE charges IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let key = new_key();
    let in_flight = {
        let request = api
            .http
            .post(api.url("/charges"))
            .header("content-type", "application/json")
            .header("idempotency-key", key.clone())
            .body(BODY);
        tokio::spawn(async move { request.send().await })
    };
    db.wait_for(
        "SELECT count(*) > 0 FROM pg_stat_activity
          WHERE datname = current_database()
            AND application_name = 'charges-api' AND wait_event_type = 'Lock'",
        &[],
        "the request is blocked on the lock",
    )
    .await;

    api.process.signal("TERM");
    // New connections are refused while the old request is still running.
    poll_until("connections refused after SIGTERM", async || {
        tokio::net::TcpStream::connect(&addr)
            .await
            .is_err()
            .then_some(())
    })
    .await;
    assert!(
        !in_flight.is_finished(),
        "the request must still be blocked"
    );

    locker.batch_execute("COMMIT").await.unwrap();
    let response = in_flight
        .await
        .unwrap()
        .expect("the in-flight request completed");
    assert_eq!(response.status(), StatusCode::CREATED);
    let status = api.process.wait().await;
    assert!(
        status.success(),
        "exit status {status:?}:\n{}",
        api.process.output_text()
    );
    assert_eq!(db.count("charges").await, 1);
    assert_eq!(db.count("outbox").await, 1);
}

/// Inserts an idempotency key row as the test describes it.
async fn insert_key(
    db: &TestDb,
    status: &str,
    expires_in_secs: f64,
    created_secs_ago: f64,
) -> String {
    let key = new_key();
    let completed = status == "COMPLETED";
    db.client()
        .execute(
            "INSERT INTO idempotency_keys
                 (key, endpoint, request_hash, status, response_status, response_body,
                  created_at, expires_at)
             VALUES ($1, '/charges', 'h', $2,
                     CASE WHEN $3 THEN 201 END, CASE WHEN $3 THEN '{}' END,
                     now() - $4::float8 * interval '1 second',
                     now() + $5::float8 * interval '1 second')",
            &[
                &key,
                &status,
                &completed,
                &created_secs_ago,
                &expires_in_secs,
            ],
        )
        .await
        .expect("insert idempotency key");
    key
}

async fn keys(db: &TestDb) -> std::collections::BTreeSet<String> {
    db.client()
        .query("SELECT key FROM idempotency_keys", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Retention of idempotency keys through `charges-relay purge`: expired COMPLETED
/// keys go; unexpired ones and STARTED ones (however old) stay.
#[tokio::test]
async fn purge_deletes_expired_completed_keys_only() {
    let db = TestDb::new().await;
    let mut expired = Vec::new();
    for _ in 0..3 {
        expired.push(insert_key(&db, "COMPLETED", -60.0, 90_000.0).await);
    }
    let fresh = insert_key(&db, "COMPLETED", 3600.0, 10.0).await;
    let started = insert_key(&db, "STARTED", -3600.0, 90_000.0).await;

    assert_eq!(
        relay_command(&db, &["purge"]).trim(),
        "deleted 3 expired idempotency keys"
    );
    assert_eq!(keys(&db).await, [fresh, started].into_iter().collect());
}

/// The relay's metrics and reconciliation over a scripted sequence: three charges
/// published, one dead row, one charge committed without its outbox row (written
/// by hand, as a bug would) and one committed STARTED key.
#[tokio::test]
async fn relay_metrics_and_reconciliation_gauges_follow_the_database() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    db.client()
        .batch_execute(
            "WITH ids AS (
                 SELECT gen_random_uuid() AS charge_id, g FROM generate_series(1, 4) AS g
             ), c AS (
                 INSERT INTO charges (id, amount_cents, currency)
                 SELECT charge_id, 100 + g, 'EUR' FROM ids
             )
             INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload,
                                 created_at, dead_at)
             SELECT gen_random_uuid(), 'charge', charge_id, 'ChargeCreated',
                    jsonb_build_object('chargeId', charge_id),
                    now() - interval '1 second',
                    CASE WHEN g = 4 THEN now() END
               FROM ids;
             INSERT INTO charges (id, amount_cents, currency)
             VALUES (gen_random_uuid(), 1, 'EUR');",
        )
        .await
        .unwrap();
    insert_key(&db, "STARTED", 3600.0, 3600.0).await;
    insert_key(&db, "COMPLETED", -1.0, 90_000.0).await;

    let (relay, url) = start_relay(&db, &kafka, MAINTENANCE_OFTEN).await;
    let http = reqwest::Client::new();
    let ops = url.trim_end_matches("/metrics");
    let topic = kafka.topic.as_str();
    let text = scrape_until(&http, &url, "three rows published and gauges set", |text| {
        sample(text, "charges_relay_published_total", &[("topic", topic)]) == 3.0
            && sample(text, "charges_outbox_pending_rows", &[]) == 0.0
            && sample(text, "charges_reconcile_charges_without_outbox", &[]) == 1.0
            && sample(
                text,
                "charges_maintenance_rows_total",
                &[("task", "purge_expired_keys")],
            ) == 1.0
            // The job sets its gauges before the runner records its success: a scrape
            // can fall between the two.
            && job_succeeded(text, "reconcile")
    })
    .await;
    assert_eq!(
        sample(&text, "charges_outbox_dead_rows", &[]),
        1.0,
        "{text}"
    );
    // The deprecated names stay exported for one release, with the same values.
    for (old, new) in [
        (
            "charges_relay_outbox_pending_rows",
            "charges_outbox_pending_rows",
        ),
        ("charges_relay_outbox_dead_rows", "charges_outbox_dead_rows"),
        (
            "charges_relay_outbox_oldest_pending_age_seconds",
            "charges_outbox_oldest_pending_age_seconds",
        ),
    ] {
        assert!(
            text.contains(&format!("\n{old} ")),
            "{old} is not exported: {text}"
        );
        assert_eq!(sample(&text, old, &[]), sample(&text, new, &[]), "{old}");
    }
    assert_eq!(
        sample(
            &text,
            "charges_reconcile_stale_started_idempotency_keys",
            &[]
        ),
        1.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "charges_outbox_oldest_pending_age_seconds", &[]),
        0.0
    );
    assert_eq!(
        sample(
            &text,
            "charges_relay_publish_errors_total",
            &[("topic", topic)]
        ),
        0.0
    );
    assert_eq!(
        sample(&text, "charges_relay_delivery_lag_seconds_count", &[]),
        3.0,
        "{text}"
    );
    // Inserted a second before the relay could see them.
    assert!(sample(&text, "charges_relay_delivery_lag_seconds_sum", &[]) >= 3.0);
    assert!(sample(&text, "charges_relay_batch_duration_seconds_count", &[]) >= 1.0);

    for (path, status) in [("/healthz", StatusCode::OK), ("/readyz", StatusCode::OK)] {
        let response = get(&http, &format!("{ops}{path}")).await;
        assert_eq!(response.status(), status, "{path}");
    }
    db.forget_latest_migration().await;
    assert_not_ready(&http, &format!("{ops}/readyz"), "this build expects").await;
    drop(relay);
}

const OLDEST_PENDING_AGE: &str = "charges_outbox_oldest_pending_age_seconds";

/// The backlog alert's input: while the broker is down the oldest pending row's age
/// keeps rising (and the row stays pending); once the broker is back the row is
/// published and the gauge drops to 0.
#[tokio::test]
async fn oldest_pending_age_rises_while_the_broker_is_down_and_falls_after() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let Some(mock) = kafka.mock() else {
        eprintln!("skipped: needs the mock cluster's fault injection (KAFKA_BROKERS is set)");
        return;
    };
    mock.broker_down(1).expect("broker down");
    let (relay, url) = start_relay(&db, &kafka, &["--publish-timeout", "1s"]).await;
    let api = TestApi::start(&db, &[]).await;
    let created = api.post_charge(Some(&new_key()), BODY).await;
    assert_eq!(created.status(), StatusCode::CREATED);

    let http = reqwest::Client::new();
    let topic = kafka.topic.as_str();
    // The row is seen as pending, and at least one publish attempt has failed.
    let text = scrape_until(&http, &url, "a pending row with some age", |text| {
        sample(text, "charges_outbox_pending_rows", &[]) == 1.0
            && sample(text, OLDEST_PENDING_AGE, &[]) > 0.0
            && sample(
                text,
                "charges_relay_publish_errors_total",
                &[("topic", topic)],
            ) >= 1.0
    })
    .await;
    let first = sample(&text, OLDEST_PENDING_AGE, &[]);
    // Still down: the age keeps growing (by more than a second, so not noise).
    let text = scrape_until(&http, &url, "the oldest pending age rising", |text| {
        sample(text, OLDEST_PENDING_AGE, &[]) >= first + 1.5
    })
    .await;
    assert_eq!(
        sample(&text, "charges_outbox_pending_rows", &[]),
        1.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "charges_relay_published_total", &[("topic", topic)]),
        0.0,
        "published while the broker is down: {text}"
    );
    assert_eq!(
        count_outbox(&db, "published_at IS NOT NULL").await,
        0,
        "outbox rows with published_at IS NOT NULL"
    );

    mock.broker_up(1).expect("broker up");
    let text = scrape_until(
        &http,
        &url,
        "the backlog drained after the broker returned",
        |text| {
            sample(text, "charges_relay_published_total", &[("topic", topic)]) == 1.0
                && sample(text, "charges_outbox_pending_rows", &[]) == 0.0
                && sample(text, OLDEST_PENDING_AGE, &[]) == 0.0
        },
    )
    .await;
    assert_eq!(
        sample(&text, "charges_outbox_dead_rows", &[]),
        0.0,
        "{text}"
    );
    assert_eq!(
        count_outbox(&db, "published_at IS NULL").await,
        0,
        "outbox rows with published_at IS NULL"
    );
    drop(relay);
}

/// deploy/prometheus/alerts.yaml is a valid Prometheus rule file, and every metric an
/// alert expression names is really exported by the binaries (run with traffic, so
/// that counters and histograms exist) or made by Prometheus (`up`).
#[tokio::test]
async fn alert_rules_are_well_formed_and_name_only_exported_metrics() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus/alerts.yaml");
    let text = std::fs::read_to_string(&path).expect("read deploy/prometheus/alerts.yaml");
    let rules: Value = serde_norway::from_str(&text).expect("alerts.yaml is YAML");
    let top: Vec<&String> = rules.as_object().expect("a mapping").keys().collect();
    assert_eq!(top, ["groups"], "a rule file has only `groups`");
    let groups = rules["groups"].as_array().expect("groups is a list");
    assert!(!groups.is_empty());

    let mut group_names = std::collections::BTreeSet::new();
    let mut alert_names = std::collections::BTreeSet::new();
    let mut referenced = Vec::new();
    for group in groups {
        let name = group["name"].as_str().expect("every group has a name");
        assert!(group_names.insert(name), "duplicate group {name}");
        for key in group.as_object().expect("group mapping").keys() {
            assert!(
                ["name", "interval", "limit", "rules"].contains(&key.as_str()),
                "group {name}: unknown field {key}"
            );
        }
        let rules = group["rules"].as_array().expect("rules is a list");
        assert!(!rules.is_empty(), "group {name} has no rules");
        for rule in rules {
            let alert = rule["alert"]
                .as_str()
                .unwrap_or_else(|| panic!("group {name}: a rule without `alert`: {rule}"));
            assert!(alert_names.insert(alert), "duplicate alert {alert}");
            assert!(
                alert.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{alert}: not a valid alert name"
            );
            for key in rule.as_object().expect("rule mapping").keys() {
                assert!(
                    [
                        "alert",
                        "expr",
                        "for",
                        "keep_firing_for",
                        "labels",
                        "annotations"
                    ]
                    .contains(&key.as_str()),
                    "{alert}: unknown field {key}"
                );
            }
            let expr = rule["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{alert}: no expr"));
            assert!(!expr.trim().is_empty(), "{alert}: empty expr");
            assert_eq!(
                expr.matches('(').count(),
                expr.matches(')').count(),
                "{alert}: unbalanced parentheses"
            );
            if !rule["for"].is_null() {
                let duration = rule["for"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{alert}: for"));
                assert!(promql::is_duration(duration), "{alert}: for {duration:?}");
            }
            let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
            assert!(
                ["page", "warn"].contains(&severity),
                "{alert}: labels.severity must be page or warn, got {severity:?}"
            );
            for annotation in ["summary", "description"] {
                let value = rule["annotations"][annotation].as_str().unwrap_or_default();
                assert!(
                    !value.trim().is_empty(),
                    "{alert}: no annotations.{annotation}"
                );
            }
            for metric in promql::metric_names(expr) {
                referenced.push((alert.to_owned(), metric));
            }
        }
    }
    assert!(referenced.len() >= 10, "only {referenced:?}");

    assert_only_scraped_names("deploy/prometheus/alerts.yaml", &referenced).await;
}

/// Every binary logs alike (one `charges-runtime` set-up): to a pipe, with `NO_COLOR`
/// unset, a failing start-up is logged without terminal escape codes, and
/// `--log-format json` gives one flat JSON object per line.
#[test]
fn every_binary_logs_plain_text_or_flat_json_to_a_pipe() {
    let unreachable = "postgres://postgres@127.0.0.1:1/none?connect_timeout=2";
    for (name, args) in [
        ("charges-api", vec!["migrate"]),
        ("charges-relay", vec!["purge"]),
        ("charges-consumer", vec![]),
    ] {
        for format in ["text", "json"] {
            let output = std::process::Command::new(binary(name))
                .args(&args)
                .env("DATABASE_URL", unreachable)
                .env("LOG_FORMAT", format)
                .env_remove("NO_COLOR")
                .env("RUST_LOG", "info")
                .output()
                .expect("run the binary");
            assert!(
                !output.status.success(),
                "{name} started without a database"
            );
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(
                !text.contains('\u{1b}'),
                "{name} ({format}) wrote escape codes to a pipe:\n{text}"
            );
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            assert!(!lines.is_empty(), "{name} ({format}) logged nothing");
            if format == "json" {
                for line in lines {
                    let event: Value = serde_json::from_str(line)
                        .unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {line}"));
                    assert!(
                        event.get("level").is_some() && event.get("message").is_some(),
                        "{name}: not a flat event: {line}"
                    );
                }
            }
        }
    }
}

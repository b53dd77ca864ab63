//! Security, through the real binaries and a real Postgres: API-key authentication
//! and per-client scoping, secrets kept out of every log line, error and `--help`,
//! and the least-privilege roles of deploy/sql/ (run verbatim).

use std::time::Duration;

use charges_tests::cluster::TestCluster;
use charges_tests::kafka::TestKafka;
use charges_tests::kafka::produce;
use charges_tests::metrics::scrape_until_job_succeeded;
use charges_tests::{
    DEADLINE, Process, TestDb, binary, block_on_own_runtime, connect, expect_problem, log_field,
    new_key, start_relay,
};
use reqwest::StatusCode;
use serde_json::Value;
use uuid::Uuid;

const BODY: &str = r#"{"amountCents":4900,"currency":"EUR"}"#;
const OTHER_BODY: &str = r#"{"amountCents":5000,"currency":"EUR"}"#;
const SECRET_A: &str = "client-a-secret-7d3f0c2a9e81";
const SECRET_B: &str = "client-b-secret-41b7a0d95c2f";

fn api_keys() -> String {
    format!("client-a:{SECRET_A},client-b:{SECRET_B}")
}

/// `url` with its user info replaced by `user` and, if given, `password`.
fn with_user(url: &str, user: &str, password: Option<&str>) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host_and_path = rest.rsplit_once('@').map_or(rest, |(_, after)| after);
    match password {
        Some(password) => format!("{scheme}://{user}:{password}@{host_and_path}"),
        None => format!("{scheme}://{user}@{host_and_path}"),
    }
}

/// `url` with its `host:port` replaced.
fn with_host(url: &str, host: &str) -> String {
    let (before, after) = url.rsplit_once('@').expect("a URL with user info");
    let path = after.find('/').map_or("", |slash| &after[slash..]);
    format!("{before}@{host}{path}")
}

/// `charges-api serve` on a free port, configured through the environment only.
struct Api {
    process: Process,
    base: String,
    http: reqwest::Client,
}

impl Api {
    async fn start(envs: &[(&str, &str)]) -> Api {
        let (process, line) = Process::start(
            "charges-api",
            &["serve", "--listen", "127.0.0.1:0"],
            envs,
            "listening",
        )
        .await;
        let addr = log_field(&line, "addr").expect("addr in the listening line");
        Api {
            process,
            base: format!("http://{addr}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        }
    }

    fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        secret: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match secret {
            Some(secret) => request.bearer_auth(secret),
            None => request,
        }
    }

    async fn post(
        &self,
        path: &str,
        secret: Option<&str>,
        key: &str,
        body: &str,
    ) -> reqwest::Response {
        self.request(reqwest::Method::POST, path, secret)
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body.to_owned())
            .send()
            .await
            .unwrap()
    }

    async fn get(&self, path: &str, secret: Option<&str>) -> reqwest::Response {
        self.request(reqwest::Method::GET, path, secret)
            .send()
            .await
            .unwrap()
    }
}

/// A binary run to completion: (success, stdout and stderr).
fn run(name: &str, args: &[&str], envs: &[(&str, &str)]) -> (bool, String) {
    let output = std::process::Command::new(binary(name))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("API_KEYS")
        .env("RUST_LOG", "debug")
        .env("NO_COLOR", "1")
        .envs(envs.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn assert_hidden(output: &str, secrets: &[&str], what: &str) {
    for secret in secrets {
        assert!(
            !output.contains(secret),
            "{what} shows the secret {secret:?}:\n{output}"
        );
    }
}

/// Auth on: the same Idempotency-Key from two clients names two operations. Client B
/// sending A's key with A's body gets a charge of its own, never A's stored response;
/// and each client only sees and refunds its own charges.
#[tokio::test]
async fn two_clients_with_one_idempotency_key_get_independent_charges() {
    let db = TestDb::new().await;
    let keys = api_keys();
    let api = Api::start(&[("DATABASE_URL", &db.url), ("API_KEYS", &keys)]).await;
    let key = new_key();

    let a1 = api.post("/charges", Some(SECRET_A), &key, BODY).await;
    assert_eq!(a1.status(), StatusCode::CREATED);
    let a1: Value = a1.json().await.unwrap();
    let a2 = api.post("/charges", Some(SECRET_A), &key, BODY).await;
    assert_eq!(a2.status(), StatusCode::CREATED);
    assert_eq!(a2.headers()["idempotent-replayed"], "true");
    assert_eq!(a2.json::<Value>().await.unwrap(), a1);

    let b1 = api.post("/charges", Some(SECRET_B), &key, BODY).await;
    assert_eq!(b1.status(), StatusCode::CREATED);
    assert!(
        b1.headers().get("idempotent-replayed").is_none(),
        "B got A's replay"
    );
    let b1: Value = b1.json().await.unwrap();
    assert_ne!(b1["id"], a1["id"]);
    let b2 = api.post("/charges", Some(SECRET_B), &key, BODY).await;
    assert_eq!(b2.headers()["idempotent-replayed"], "true");
    assert_eq!(b2.json::<Value>().await.unwrap(), b1);
    // Each client's key is bound to its own first request.
    for secret in [SECRET_A, SECRET_B] {
        let conflict = api.post("/charges", Some(secret), &key, OTHER_BODY).await;
        let body = expect_problem(conflict, StatusCode::UNPROCESSABLE_ENTITY).await;
        assert_eq!(body["type"], "/problems/idempotency-key-reused");
    }

    assert_eq!(db.count("charges").await, 2);
    let scopes: Vec<(String, String)> = db
        .client()
        .query(
            "SELECT k.endpoint, c.client_id FROM idempotency_keys k
               JOIN charges c ON k.response_body::jsonb ->> 'id' = c.id::text
              ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(
        scopes,
        [
            ("client:client-a /charges".to_owned(), "client-a".to_owned()),
            ("client:client-b /charges".to_owned(), "client-b".to_owned()),
        ]
    );

    // Reading and refunding: another client's charge does not exist for B.
    let a_path = format!("/charges/{}", a1["id"].as_str().unwrap());
    assert_eq!(
        api.get(&a_path, Some(SECRET_A)).await.status(),
        StatusCode::OK
    );
    let hidden = expect_problem(
        api.get(&a_path, Some(SECRET_B)).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(hidden["type"], "/problems/charge-not-found");
    let refunds = format!("{a_path}/refunds");
    let refund_key = new_key();
    let refused = api.post(&refunds, Some(SECRET_B), &refund_key, "{}").await;
    assert_eq!(
        expect_problem(refused, StatusCode::NOT_FOUND).await["type"],
        "/problems/charge-not-found"
    );
    let refunded = api.post(&refunds, Some(SECRET_A), &refund_key, "{}").await;
    assert_eq!(refunded.status(), StatusCode::CREATED);
    assert_eq!(db.count("refunds").await, 1);
}

/// Auth on: no or a wrong key is 401 problem+json with `WWW-Authenticate: Bearer`,
/// before anything is read or stored; the probes and the scrape stay open.
#[tokio::test]
async fn missing_or_wrong_keys_are_401_and_probes_stay_open() {
    let db = TestDb::new().await;
    let keys = api_keys();
    let api = Api::start(&[("DATABASE_URL", &db.url), ("API_KEYS", &keys)]).await;
    let charge = format!("/charges/{}", Uuid::new_v4());

    let missing = api.post("/charges", None, &new_key(), BODY).await;
    assert_eq!(
        missing.headers()["www-authenticate"],
        r#"Bearer realm="charges""#
    );
    assert!(missing.headers().contains_key("x-request-id"));
    let body = expect_problem(missing, StatusCode::UNAUTHORIZED).await;
    assert_eq!(body["type"], "/problems/unauthorized");
    assert_eq!(body["status"], 401);

    let wrong_secrets = [
        "client-a-secret-7d3f0c2a9e8",   // one character short
        "client-a-secret-7d3f0c2a9e810", // one character more
        "CLIENT-A-SECRET-7D3F0C2A9E81",
        "client-a:client-a-secret-7d3f0c2a9e81",
    ];
    for wrong in wrong_secrets {
        let response = api.post("/charges", Some(wrong), &new_key(), BODY).await;
        assert_eq!(
            response.headers()["www-authenticate"],
            r#"Bearer realm="charges", error="invalid_token""#
        );
        expect_problem(response, StatusCode::UNAUTHORIZED).await;
    }
    for authorization in [
        format!("Basic {SECRET_A}"),
        "Bearer".to_owned(),
        SECRET_A.to_owned(),
    ] {
        let response = api
            .request(reqwest::Method::GET, &charge, None)
            .header("authorization", authorization)
            .send()
            .await
            .unwrap();
        expect_problem(response, StatusCode::UNAUTHORIZED).await;
    }
    let twice = api
        .request(reqwest::Method::GET, &charge, Some(SECRET_A))
        .header("authorization", format!("Bearer {SECRET_B}"))
        .send()
        .await
        .unwrap();
    expect_problem(twice, StatusCode::UNAUTHORIZED).await;
    // Unknown paths need a key too: routes are not discoverable.
    expect_problem(api.get("/nope", None).await, StatusCode::UNAUTHORIZED).await;
    expect_problem(api.get(&charge, None).await, StatusCode::UNAUTHORIZED).await;
    assert_eq!(db.count("idempotency_keys").await, 0);
    assert_eq!(db.count("charges").await, 0);

    // A valid key reaches the handlers (the scheme is case-insensitive).
    let lower = api
        .request(reqwest::Method::GET, &charge, None)
        .header("authorization", format!("bearer {SECRET_B}"))
        .send()
        .await
        .unwrap();
    expect_problem(lower, StatusCode::NOT_FOUND).await;
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(api.get(open, None).await.status(), StatusCode::OK, "{open}");
    }
}

/// Neither the database password nor an API key appears in any output line: a normal
/// run at debug level (with the secret even sent as a request id, which is logged),
/// start-up failures (unknown host, refused port, unparsable URL, unknown database),
/// invalid key configuration, and `--help` of every binary.
#[tokio::test]
async fn secrets_never_reach_logs_errors_or_help() {
    let db = TestDb::new().await;
    let password = format!("s3cr3t-{}", Uuid::new_v4().simple());
    let kafka_password = format!("k4fk4-{}", Uuid::new_v4().simple());
    let secrets = [
        password.as_str(),
        SECRET_A,
        SECRET_B,
        kafka_password.as_str(),
    ];
    // Local connections are `trust`: the server ignores the password, the binaries
    // still hold it, which is what this is about.
    let url = with_user(&db.url, "postgres", Some(&password));
    let keys = api_keys();

    let mut api = Api::start(&[
        ("DATABASE_URL", &url),
        ("API_KEYS", &keys),
        ("RUST_LOG", "debug"),
    ])
    .await;
    let created = api.post("/charges", Some(SECRET_A), &new_key(), BODY).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let refused = api
        .post(
            "/charges",
            Some(SECRET_B.trim_end_matches('f')),
            &new_key(),
            BODY,
        )
        .await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    // A client that puts its secret where the API logs it (the request id).
    let echoed = api
        .request(reqwest::Method::GET, "/healthz", None)
        .header("x-request-id", SECRET_A)
        .send()
        .await
        .unwrap();
    assert_eq!(echoed.status(), StatusCode::OK);
    api.process.signal("TERM");
    assert!(api.process.wait().await.success());
    let output = api.process.output_text();
    assert!(output.contains("request finished"), "{output}");
    assert!(output.contains("request_id=[REDACTED]"), "{output}");
    assert_hidden(&output, &secrets, "charges-api serve");

    let failing = [
        with_host(&url, "nonexistent.invalid:5432"),
        with_host(&url, "127.0.0.1:1"),
        with_host(&url, "127.0.0.1:notaport"),
        format!("{}_missing", url),
    ];
    for bad in &failing {
        for (name, args) in [
            ("charges-api", vec!["migrate"]),
            ("charges-relay", vec!["purge"]),
            ("charges-relay", vec!["dead", "list"]),
            (
                "charges-relay",
                vec![
                    "--kafka-config",
                    "sasl.password",
                    "--metrics-listen",
                    "127.0.0.1:0",
                ],
            ),
        ] {
            let kafka_setting = format!("sasl.password={kafka_password}");
            let args: Vec<&str> = args
                .iter()
                .map(|a| {
                    if *a == "sasl.password" {
                        kafka_setting.as_str()
                    } else {
                        a
                    }
                })
                .collect();
            let (ok, output) = run(name, &args, &[("DATABASE_URL", bad), ("API_KEYS", &keys)]);
            assert!(!ok, "{name} {args:?} succeeded against {bad}");
            assert!(output.contains("failed"), "{name} {args:?}: {output}");
            assert_hidden(&output, &secrets, &format!("{name} {args:?}"));
        }
    }

    // The relay's one-shot commands succeed with the password URL, and say nothing of it.
    let (ok, output) = run("charges-relay", &["purge"], &[("DATABASE_URL", &url)]);
    assert!(ok, "{output}");
    assert_hidden(&output, &secrets, "charges-relay purge");

    // Invalid key lists fail start-up naming the entry, never its content.
    for invalid in [
        format!("client a:{SECRET_A}"),
        format!("client-a:{SECRET_A},client-b:{SECRET_A}"),
        format!("client-a{SECRET_A}"),
    ] {
        let (ok, output) = run(
            "charges-api",
            &["serve", "--listen", "127.0.0.1:0"],
            &[("DATABASE_URL", &url), ("API_KEYS", &invalid)],
        );
        assert!(!ok);
        assert!(output.contains("API key entr"), "{output}");
        assert_hidden(&output, &secrets, "charges-api with invalid API_KEYS");
    }

    for (name, args) in [
        ("charges-api", vec!["--help"]),
        ("charges-api", vec!["serve", "--help"]),
        ("charges-api", vec!["migrate", "--help"]),
        ("charges-relay", vec!["--help"]),
        ("charges-relay", vec!["purge", "--help"]),
        ("charges-relay", vec!["dead", "--help"]),
        ("charges-consumer", vec!["--help"]),
    ] {
        let (ok, output) = run(name, &args, &[("DATABASE_URL", &url), ("API_KEYS", &keys)]);
        assert!(ok, "{name} {args:?}: {output}");
        assert!(output.contains("DATABASE_URL"), "{name} {args:?}: {output}");
        assert_hidden(&output, &secrets, &format!("{name} {args:?}"));
    }
}

/// Roles of deploy/sql/roles.sql, suffixed so that parallel tests (roles are
/// cluster-wide) never share one; dropped with everything they own at the end, also
/// when the test fails.
struct Roles {
    migrator: String,
    api: String,
    relay: String,
    db_url: String,
}

impl Roles {
    fn new(db: &TestDb) -> Roles {
        let suffix = db.name.trim_start_matches("charges_test_");
        Roles {
            migrator: format!("charges_migrator_{suffix}"),
            api: format!("charges_api_{suffix}"),
            relay: format!("charges_relay_{suffix}"),
            db_url: db.url.clone(),
        }
    }

    /// A file of deploy/sql/ with this test's role names.
    fn sql(&self, file: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/sql")
            .join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        text.replace("charges_migrator", &self.migrator)
            .replace("charges_api", &self.api)
            .replace("charges_relay", &self.relay)
    }

    fn url(&self, role: &str) -> String {
        with_user(&self.db_url, role, None)
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        let names = [self.migrator.clone(), self.api.clone(), self.relay.clone()];
        let db_url = self.db_url.clone();
        let dropped = block_on_own_runtime(async move {
            let quoted = names
                .iter()
                .map(|n| format!("'{n}'"))
                .collect::<Vec<_>>()
                .join(", ");
            let list = names.join(", ");
            connect(&db_url)
                .await
                .batch_execute(&format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                      WHERE usename IN ({quoted});
                     DROP OWNED BY {list} CASCADE;
                     DROP ROLE {list};"
                ))
                .await
        });
        if !matches!(dropped, Some(Ok(()))) {
            eprintln!("could not drop the test roles: {dropped:?}");
        }
    }
}

/// Each statement in `sql`, run as the role of `url`, is refused for lack of privilege.
async fn assert_denied(url: &str, sql: &[&str]) {
    let client = connect(url).await;
    for sql in sql {
        let error = client
            .batch_execute(sql)
            .await
            .expect_err(&format!("{sql} was allowed"));
        assert_eq!(
            error.code(),
            Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}: {error:?}"
        );
    }
}

/// deploy/sql/roles.sql and grants.sql, run verbatim on an empty database: the
/// migrator migrates, and the API and the relay do all of their work as their own
/// roles (charge, replay, refund, read, readiness, publish, retention, purge,
/// reconciliation, dead list and requeue) without a single permission error, while the
/// API role cannot delete charges or touch the outbox beyond inserting.
#[tokio::test]
async fn api_and_relay_work_with_least_privilege_roles() {
    let db = TestDb::new().await;
    let roles = Roles::new(&db);
    migrate_as_the_migrator(&db, &roles).await;

    let api_url = roles.url(&roles.api);
    let relay_url = roles.url(&roles.relay);
    let api = Api::start(&[("DATABASE_URL", &api_url)]).await;
    let kafka = TestKafka::new(1).await;
    let (relay, relay_metrics) = start_relay(
        &db,
        &kafka,
        &[
            "--database-url",
            &relay_url,
            "--reconcile-interval",
            "200ms",
            // Retention runs once at start-up; `purge` below does the rest.
            "--cleanup-interval",
            "1h",
        ],
    )
    .await;

    let charge_id = charge_replay_refund_and_read(&api).await;
    // The relay: both events published and marked; its probe and reconciliation.
    db.wait_for(
        "SELECT count(*) = 2 FROM outbox WHERE published_at IS NOT NULL",
        &[],
        "both events published",
    )
    .await;
    let mut reader = kafka.reader();
    reader
        .read_until(DEADLINE, "both events", |messages| messages.len() >= 2)
        .await;
    let relay_readyz = relay_metrics.replace("/metrics", "/readyz");
    assert_eq!(
        api.http.get(relay_readyz).send().await.unwrap().status(),
        StatusCode::OK
    );
    scrape_until_job_succeeded(&api.http, &relay_metrics, "reconcile").await;
    purge_and_requeue_as_the_relay(&db, &relay_url, charge_id).await;

    // What the roles must not do.
    assert_denied(
        &api_url,
        &[
            "DELETE FROM charges",
            "UPDATE outbox SET attempts = 0",
            "SELECT count(*) FROM outbox",
            "DELETE FROM idempotency_keys",
            "UPDATE idempotency_keys SET endpoint = 'client:x /charges'",
            "UPDATE charges SET amount_cents = 1",
            "CREATE TABLE intruder (id int)",
        ],
    )
    .await;
    assert_denied(
        &relay_url,
        &[
            "UPDATE outbox SET payload = '{}'",
            "UPDATE outbox SET data = '{}'",
            "INSERT INTO charges (id, amount_cents, currency) VALUES (gen_random_uuid(), 1, 'EUR')",
            "UPDATE charges SET refunded_cents = 0",
            "DELETE FROM charges",
            "SELECT count(*) FROM refunds",
        ],
    )
    .await;

    for (name, output) in [
        ("charges-api", api.process.output_text()),
        ("charges-relay", relay.output_text()),
    ] {
        assert!(!output.contains("permission denied"), "{name}:\n{output}");
    }
}

/// An empty database, as in production before the first migration; roles.sql; then the
/// Kubernetes Job's command as the migrator: migrate, then grants.sql (embedded) for
/// the roles.
async fn migrate_as_the_migrator(db: &TestDb, roles: &Roles) {
    db.client()
        .batch_execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
        .await
        .unwrap();
    db.client()
        .batch_execute(&roles.sql("roles.sql"))
        .await
        .unwrap();
    let (ok, output) = run(
        "charges-api",
        &[
            "migrate",
            "--grant-api-role",
            &roles.api,
            "--grant-relay-role",
            &roles.relay,
        ],
        &[("DATABASE_URL", &roles.url(&roles.migrator))],
    );
    assert!(ok, "migrate and grant as the migrator: {output}");
    assert!(output.contains("grants applied"), "{output}");
}

/// The API as its role: charge, replay, refund, read, readiness. Returns the charge id.
async fn charge_replay_refund_and_read(api: &Api) -> Uuid {
    let key = new_key();
    let created = api.post("/charges", None, &key, BODY).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let charge: Value = created.json().await.unwrap();
    let replay = api.post("/charges", None, &key, BODY).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    let path = format!("/charges/{}", charge["id"].as_str().unwrap());
    let refund = api
        .post(
            &format!("{path}/refunds"),
            None,
            &new_key(),
            r#"{"amountCents":900}"#,
        )
        .await;
    assert_eq!(refund.status(), StatusCode::CREATED);
    let read = api.get(&path, None).await;
    assert_eq!(read.status(), StatusCode::OK);
    assert_eq!(read.json::<Value>().await.unwrap()["refundedCents"], 900);
    assert_eq!(api.get("/readyz", None).await.status(), StatusCode::OK);
    charge["id"].as_str().unwrap().parse().unwrap()
}

/// `purge`, `dead list` and `dead requeue` as the relay role; the running relay then
/// publishes the requeued row.
async fn purge_and_requeue_as_the_relay(db: &TestDb, relay_url: &str, charge_id: Uuid) {
    db.client()
        .batch_execute(
            "INSERT INTO idempotency_keys
                 (key, endpoint, request_hash, status, response_status, response_body,
                  created_at, expires_at)
             VALUES ('expired', '/charges', 'h', 'COMPLETED', 201, '{}',
                     now() - interval '2 days', now() - interval '1 day')",
        )
        .await
        .unwrap();
    let relay_env = [("DATABASE_URL", relay_url)];
    let (ok, output) = run("charges-relay", &["purge"], &relay_env);
    assert!(
        ok && output.contains("deleted 1 expired idempotency keys"),
        "{output}"
    );

    let dead_id = Uuid::new_v4();
    db.client()
        .execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, attempts,
                                 last_error, dead_at)
             VALUES ($1, 'charge', $2, 'ChargeCreated', '{}', 10, 'test', now())",
            &[&dead_id, &charge_id],
        )
        .await
        .unwrap();
    let (ok, output) = run("charges-relay", &["dead", "list"], &relay_env);
    assert!(ok && output.contains(&dead_id.to_string()), "{output}");
    let dead_id_text = dead_id.to_string();
    let (ok, output) = run(
        "charges-relay",
        &["dead", "requeue", "--id", &dead_id_text],
        &relay_env,
    );
    assert!(ok && output.contains("requeued 1"), "{output}");
    db.wait_for(
        "SELECT count(*) = 3 FROM outbox WHERE published_at IS NOT NULL",
        &[],
        "the requeued event published",
    )
    .await;
}

/// Per `application_name`: (sessions, sessions over TLS).
async fn tls_sessions(db: &TestDb, application_name: &str) -> (i64, i64) {
    let row = db
        .client()
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE s.ssl)
               FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.datname = current_database() AND a.application_name = $1",
            &[&application_name],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// TLS to Postgres, against a server of the test's own whose certificate (for
/// 127.0.0.1) a CA of the test's own issued. `sslmode=require` encrypts every session of
/// the API and the relay, LISTEN included, and verifies the server: trusting another CA
/// fails start-up with a verification error. Without `sslmode`, plain text, as the
/// README says.
#[tokio::test]
async fn postgres_tls_is_verified_and_used_when_the_url_requires_it() {
    let cluster = TestCluster::start_with_tls().await;
    let db = TestDb::new_on(&cluster.url).await;
    let tls_url = format!("{}?sslmode=require", db.url);
    let ca_file = cluster.tls().ca_file.to_str().unwrap().to_owned();
    let other_ca_file = cluster.tls().other_ca_file.to_str().unwrap().to_owned();

    let (ok, output) = run(
        "charges-api",
        &["migrate"],
        &[
            ("DATABASE_URL", &tls_url),
            ("DATABASE_CA_FILE", &other_ca_file),
        ],
    );
    assert!(!ok, "a server the CA did not sign was trusted: {output}");
    assert!(
        output.contains("certificate verify failed"),
        "not a verification failure: {output}"
    );

    let api = Api::start(&[("DATABASE_URL", &tls_url), ("DATABASE_CA_FILE", &ca_file)]).await;
    let created = api.post("/charges", None, &new_key(), BODY).await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let kafka = TestKafka::new(1).await;
    let _relay = start_relay(
        &db,
        &kafka,
        &[
            "--database-url",
            &tls_url,
            "--database-ca-file",
            &ca_file,
            "--poll-interval",
            "1h",
        ],
    )
    .await;
    // Published with polling off: the LISTEN session woke the relay (or its start-up
    // pass found the row), and the relay's pool marked it.
    db.wait_for(
        "SELECT count(*) = 1 FROM outbox WHERE published_at IS NOT NULL",
        &[],
        "the charge published",
    )
    .await;
    for application in ["charges-api", "charges-relay", "charges-relay-listener"] {
        let (sessions, encrypted) = tls_sessions(&db, application).await;
        assert!(sessions > 0, "no {application} session");
        assert_eq!(encrypted, sessions, "{application} sessions in plain text");
    }

    let plain = Api::start(&[("DATABASE_URL", &db.url), ("DATABASE_CA_FILE", &ca_file)]).await;
    drop(api);
    assert_eq!(
        plain
            .post("/charges", None, &new_key(), BODY)
            .await
            .status(),
        StatusCode::CREATED
    );
    // The killed API's sessions end by themselves; the new one's must all be plain.
    db.wait_for(
        "SELECT count(*) > 0 AND count(*) FILTER (WHERE s.ssl) = 0
           FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
          WHERE a.datname = current_database() AND a.application_name = 'charges-api'",
        &[],
        "the plain-text API's sessions, and only those",
    )
    .await;
}

/// TLS and SASL to Kafka are reachable through `--kafka-config`: this build of
/// librdkafka accepts `SASL_SSL` with SCRAM (a build without OpenSSL refuses it at
/// start-up), and it really speaks TLS: against the mock cluster, which listens in plain
/// text, nothing is ever published, nothing is marked, and the row records why. Once
/// the relay is gone, a sentinel message written after its attempts is the first and
/// only message on the topic.
#[tokio::test]
async fn kafka_tls_and_sasl_are_reachable_through_config_and_never_downgraded() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    if kafka.mock().is_none() {
        eprintln!("KAFKA_BROKERS is set: this test needs the plain-text mock cluster");
        return;
    }
    let api = Api::start(&[("DATABASE_URL", &db.url)]).await;
    assert_eq!(
        api.post("/charges", None, &new_key(), BODY).await.status(),
        StatusCode::CREATED
    );
    let (mut relay, _) = start_relay(
        &db,
        &kafka,
        &[
            "--publish-timeout",
            "1s",
            "--kafka-config",
            "security.protocol=SASL_SSL",
            "--kafka-config",
            "sasl.mechanism=SCRAM-SHA-512",
            "--kafka-config",
            "sasl.username=relay",
            "--kafka-config",
            "sasl.password=kafka-secret-5e1f",
        ],
    )
    .await;
    // A broker that cannot be reached over TLS is an outage: one failed attempt, then
    // the relay stops claiming and probes.
    db.wait_for(
        "SELECT count(*) = 1 FROM outbox
          WHERE published_at IS NULL AND attempts >= 1 AND last_error IS NOT NULL",
        &[],
        "a failed attempt recorded",
    )
    .await;
    relay.kill9().await;
    let sentinel = Uuid::new_v4();
    produce(&kafka, sentinel, "ChargeCreated", "{}").await;
    let sentinel = sentinel.to_string();
    let mut reader = kafka.reader();
    reader
        .read_until(DEADLINE, "the sentinel", |m| {
            m.iter().any(|m| m.header("id") == Some(sentinel.as_str()))
        })
        .await;
    assert_eq!(reader.messages.len(), 1, "published in plain text");
    let last_error: String = db
        .client()
        .query_one("SELECT last_error FROM outbox", &[])
        .await
        .unwrap()
        .get(0);
    assert!(last_error.contains("timed out"), "{last_error}");
    // The plaintext broker either answers the ClientHello with bytes that fail the
    // handshake or resets the connection first (seen under load in CI); librdkafka
    // names the state only a TLS connection is ever in.
    let output = relay.output_text();
    assert!(
        output.contains("SSL handshake failed") || output.contains("in state SSL_HANDSHAKE"),
        "the relay never attempted TLS:\n{output}"
    );
    assert!(
        !relay.output_text().contains("kafka-secret-5e1f"),
        "the SASL password reached the logs"
    );
}

/// A passphrase-protected client key for Kafka TLS, in `dir`: the key (encrypted with
/// `passphrase`) and its self-signed certificate.
fn encrypted_client_key(dir: &std::path::Path, passphrase: &str) -> (String, String) {
    let key = dir.join("client.key").display().to_string();
    let cert = dir.join("client.crt").display().to_string();
    let pass = format!("pass:{passphrase}");
    for args in [
        vec!["genrsa", "-aes256", "-passout", &pass, "-out", &key, "2048"],
        vec![
            "req",
            "-new",
            "-x509",
            "-key",
            &key,
            "-passin",
            &pass,
            "-subj",
            "/CN=relay",
            "-days",
            "1",
            "-out",
            &cert,
        ],
    ] {
        let status = std::process::Command::new("openssl")
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("run openssl");
        assert!(status.success(), "openssl {args:?}");
    }
    (key, cert)
}

/// Kafka secrets never need the command line: the key's passphrase comes from
/// `--kafka-config-file` (the relay) or `KAFKA_CONFIG` (the relay and `tail`), and it
/// really reaches librdkafka — the encrypted key only loads with it (a wrong one stops
/// the producer at creation) — while `ps`, the logs and `--help` never show it.
#[tokio::test]
async fn kafka_secrets_come_from_a_file_or_the_environment_and_stay_hidden() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let dir = std::env::temp_dir().join(format!("charges-kafka-tls-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let passphrase = "key-passphrase-7c1e9a";
    let (key, cert) = encrypted_client_key(&dir, passphrase);
    let settings = |pass: &str| {
        format!(
            "# TLS client key for the relay\nsecurity.protocol=SSL\nssl.key.location={key}\n\
             ssl.certificate.location={cert}\nssl.key.password={pass}\n"
        )
    };
    let file = dir.join("kafka.conf");
    std::fs::write(&file, settings(passphrase)).unwrap();
    let file_arg = file.display().to_string();

    let (relay, _) = start_relay(&db, &kafka, &["--kafka-config-file", &file_arg]).await;
    let ps = std::process::Command::new("ps")
        .args(["-o", "args=", "-p", &relay.pid().to_string()])
        .output()
        .expect("run ps");
    let command_line = String::from_utf8_lossy(&ps.stdout);
    assert!(
        command_line.contains("--kafka-config-file"),
        "{command_line}"
    );
    assert_hidden(&command_line, &[passphrase], "ps");
    assert_hidden(&relay.output_text(), &[passphrase], "the relay's logs");
    drop(relay);

    // The same settings from the environment, with a wrong passphrase: the key does not
    // load, so the passphrase is what librdkafka used.
    let wrong = "wrong-passphrase-2b8d";
    for (name, args) in [
        ("charges-relay", vec!["--metrics-listen", "127.0.0.1:0"]),
        ("charges-consumer", vec!["tail", "--until-idle", "1s"]),
    ] {
        let envs = [
            ("DATABASE_URL", db.url.as_str()),
            ("KAFKA_BROKERS", kafka.bootstrap.as_str()),
            ("KAFKA_CONFIG", &settings(wrong)),
        ];
        let (ok, output) = run(name, &args, &envs);
        assert!(!ok, "{name} started with a wrong key passphrase:\n{output}");
        assert!(output.contains("ssl.key.location"), "{name}:\n{output}");
        assert_hidden(&output, &[wrong, passphrase], name);
        let (_, help) = run(name, &["--help"], &envs);
        assert!(
            help.contains("KAFKA_CONFIG"),
            "{name} --help documents KAFKA_CONFIG"
        );
        assert_hidden(&help, &[wrong], "--help");
    }
    std::fs::remove_dir_all(&dir).ok();
}

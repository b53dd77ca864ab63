//! Test support: a fresh database per test, and the real binaries started as child
//! processes. Tests never mock Postgres.
//!
//! The database server is `DATABASE_URL` (any database on it; each test creates and
//! drops its own), or with `TEST_SERVICES=containers` a Postgres container of the test's
//! own ([`containers`]). The binaries are the ones `cargo build --bins` put next to this test
//! executable (`make test` builds them first).

pub mod chaos;
pub mod cluster;
pub mod containers;
pub mod failover;
pub mod kafka;
pub mod manifests;
pub mod metrics;
pub mod orders;
pub mod otlp;
pub mod outbox;
pub mod patroni;
pub mod pgbouncer;
pub mod prometheus;
pub mod promql;
pub mod proxy;
pub mod raw_http;
pub mod schemas;
pub mod scratch;
pub mod tansu;
pub mod wait;

pub use wait::{DEADLINE, poll_until, poll_within};

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use uuid::Uuid;

/// A fresh Idempotency-Key.
pub fn new_key() -> String {
    Uuid::new_v4().to_string()
}

/// The server tests run against.
pub fn server_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set: point it at a Postgres server the tests may create \
             databases on (make test defaults it to postgres://postgres@127.0.0.1:5432/test)"
        )
    })
}

/// `url` with its database name replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let root = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{root}/{name}?{query}"),
        None => format!("{root}/{name}"),
    }
}

/// A plain session on `url`, its connection driven by a task of its own.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// A database of its own for one test, migrated, dropped when the value is dropped.
pub struct TestDb {
    pub name: String,
    pub url: String,
    admin_url: String,
    client: tokio_postgres::Client,
    /// The Postgres container the database lives on, with `TEST_SERVICES=containers`.
    container: Option<containers::Held>,
}

impl TestDb {
    /// On `DATABASE_URL`, or on a Postgres container of its own with
    /// `TEST_SERVICES=containers`.
    pub async fn new() -> TestDb {
        if containers::requested() {
            let (container, url) = containers::postgres().await;
            let mut db = Self::new_on(&url).await;
            db.container = Some(container);
            return db;
        }
        Self::new_on(&server_url()).await
    }

    /// The same, on another server (a [`cluster::TestCluster`], for example).
    pub async fn new_on(admin_url: &str) -> TestDb {
        let db = Self::unmigrated_on(admin_url).await;
        let pool = charges_store::connect(&db.url, &charges_store::PoolSettings::default())
            .await
            .expect("connect to the test database");
        charges_store::migrations::run(&pool)
            .await
            .expect("migrate the test database");
        db
    }

    /// An empty database of its own on `DATABASE_URL`, no migration applied (for tests
    /// of the migrations themselves).
    pub async fn unmigrated() -> TestDb {
        Self::unmigrated_on(&server_url()).await
    }

    async fn unmigrated_on(admin_url: &str) -> TestDb {
        let admin_url = admin_url.to_owned();
        let name = format!("charges_test_{}", Uuid::new_v4().simple());
        connect(&admin_url)
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the test database");
        let url = with_database(&admin_url, &name);
        let client = connect(&url).await;
        // So that outage tests can end every session but this one.
        client
            .batch_execute("SET application_name = 'charges-tests'")
            .await
            .expect("name the test's session");
        TestDb {
            name,
            url,
            admin_url,
            client,
            container: None,
        }
    }

    /// Replaces the test's own session, after a server restart ended it.
    pub async fn reconnect(&mut self) {
        self.client = connect(&self.url).await;
        self.client
            .batch_execute("SET application_name = 'charges-tests'")
            .await
            .expect("name the test's session");
    }

    /// A plain connection for assertions and fault injection.
    pub fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    /// Takes the newest migration out of the charges set's history, as if the schema
    /// were one version behind this build; returns its row for
    /// [`TestDb::restore_migration`].
    pub async fn forget_latest_migration(&self) -> tokio_postgres::Row {
        self.client
            .query_one(
                "DELETE FROM charges_schema_history
                  WHERE version = (SELECT max(version) FROM charges_schema_history)
                 RETURNING version, name, applied_on, checksum",
                &[],
            )
            .await
            .expect("forget the latest migration")
    }

    /// Puts back what [`TestDb::forget_latest_migration`] took out.
    pub async fn restore_migration(&self, latest: &tokio_postgres::Row) {
        self.client
            .execute(
                "INSERT INTO charges_schema_history (version, name, applied_on, checksum)
                 VALUES ($1, $2, $3, $4)",
                &[
                    &latest.get::<_, i32>(0),
                    &latest.get::<_, String>(1),
                    &latest.get::<_, String>(2),
                    &latest.get::<_, String>(3),
                ],
            )
            .await
            .expect("restore the latest migration");
    }

    /// The schema as `pg_dump --schema-only` prints it (no owners, no privileges), with
    /// the refinery history tables named in `leave_out` left out: two databases whose
    /// dumps are equal have the same tables, columns, constraints, indexes, triggers and
    /// functions, in the same order.
    pub fn schema_dump(&self, leave_out: &[&str]) -> String {
        let mut command = std::process::Command::new(cluster::bindir().join("pg_dump"));
        command.args([
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            "--dbname",
            &self.url,
        ]);
        for table in leave_out {
            command.args(["--exclude-table", table]);
        }
        let output = command.output().expect("run pg_dump");
        assert!(
            output.status.success(),
            "pg_dump failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            // pg_dump 15.14+ fences its output with a random key per run.
            .filter(|line| !line.starts_with("\\restrict") && !line.starts_with("\\unrestrict"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Another session on the test database, for interleavings that need two.
    pub async fn session(&self) -> tokio_postgres::Client {
        connect(&self.url).await
    }

    /// A connection to the server's own database, for acts a test cannot do from
    /// inside its database (refusing connections to it, for example).
    pub async fn admin_client(&self) -> tokio_postgres::Client {
        connect(&self.admin_url).await
    }

    /// Makes the database unreachable for the binaries: refuses new connections, then
    /// ends the sessions of `application_name` (every other session but the test's own
    /// when `None`). Two statements, so the refusal is committed before the sessions
    /// end and none can slip in between.
    pub async fn refuse_connections(&self, application_name: Option<&str>) {
        let admin = self.admin_client().await;
        let name = &self.name;
        admin
            .batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
            .await
            .expect("refuse connections");
        let filter = match application_name {
            Some(app) => format!("application_name = '{app}'"),
            None => "true".to_owned(),
        };
        admin
            .batch_execute(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE datname = '{name}' AND {filter}
                    AND pid NOT IN (SELECT pid FROM pg_stat_activity
                                 WHERE datname = '{name}' AND application_name = 'charges-tests')"
            ))
            .await
            .expect("end the database's sessions");
        // pg_terminate_backend only signals: wait until those sessions are gone, so
        // that no request can still slip through on one of them.
        self.wait_for(
            &format!(
                "SELECT count(*) = 0 FROM pg_stat_activity
                  WHERE datname = '{name}' AND {filter} AND backend_type = 'client backend'
                    AND application_name <> 'charges-tests'"
            ),
            &[],
            "the refused sessions ended",
        )
        .await;
    }

    /// Undoes [`TestDb::refuse_connections`].
    pub async fn allow_connections(&self) {
        self.admin_client()
            .await
            .batch_execute(&format!(
                "ALTER DATABASE {} ALLOW_CONNECTIONS true",
                self.name
            ))
            .await
            .expect("allow connections");
    }

    /// `SELECT count(*)` of a table named by the test itself (never by input).
    pub async fn count(&self, table: &str) -> i64 {
        self.client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .unwrap_or_else(|e| panic!("count {table}: {e}"))
            .get(0)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.container.is_some() {
            // The container, and the database with it, is removed next.
            return;
        }
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // The server may be gone (a test that crashed it): nothing to drop then.
        let dropped = block_on_own_runtime(async move {
            let (client, connection) =
                tokio_postgres::connect(&admin_url, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            client
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await
        });
        if let Some(Err(e)) = dropped {
            eprintln!("could not drop test database {}: {e}", self.name);
        }
    }
}

/// Runs `work` to completion on a runtime of its own, in a thread of its own: `Drop`
/// runs inside the test's runtime, which cannot be blocked on. `None` if it panicked.
pub fn block_on_own_runtime<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<T> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(work)
    })
    .join()
    .ok()
}

/// Path of a workspace binary built by `cargo build --bins` into this profile's folder.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executable lives in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --bins` (make test does) before the tests",
        path.display()
    );
    path
}

/// Runs a `charges-relay` subcommand for `db` to completion; returns its stdout.
pub fn relay_command(db: &TestDb, args: &[&str]) -> String {
    let output = std::process::Command::new(binary("charges-relay"))
        .args(args)
        .env("DATABASE_URL", &db.url)
        .output()
        .expect("run charges-relay");
    assert!(
        output.status.success(),
        "charges-relay {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A running binary; killed (SIGKILL) when dropped.
pub struct Process {
    pub child: Child,
    /// Every line the process wrote to stdout and stderr so far.
    pub output: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// The tasks reading stdout and stderr: they end at the process's last line.
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Process {
    /// Starts `name` with `args` and `envs`, and waits until one of its log lines contains
    /// `ready_marker`; returns the process and that line.
    pub async fn start(
        name: &str,
        args: &[&str],
        envs: &[(&str, &str)],
        ready_marker: &str,
    ) -> (Process, String) {
        let mut command = Command::new(binary(name));
        command
            .args(args)
            .env_remove("DATABASE_URL")
            .env(
                "RUST_LOG",
                std::env::var("TEST_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (key, value) in envs {
            command.env(key, value);
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let echo = std::env::var_os("TEST_LOG").is_some();
        let mut readers = Vec::new();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let output = output.clone();
            let ready_tx = ready_tx.clone();
            let marker = ready_marker.to_owned();
            let name = name.to_owned();
            readers.push(tokio::spawn(async move {
                let mut lines = BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if echo {
                        eprintln!("[{name}] {line}");
                    }
                    if line.contains(&marker) {
                        let _ = ready_tx.send(line.clone());
                    }
                    output.lock().expect("output lock").push(line);
                }
            }));
        }
        drop(ready_tx);
        let line = tokio::time::timeout(DEADLINE, ready_rx.recv())
            .await
            .ok()
            .flatten();
        let process = Process {
            child,
            output,
            readers,
        };
        match line {
            Some(line) => (process, line),
            None => panic!(
                "{name} did not log {ready_marker:?}; its output:\n{}",
                process.output_text()
            ),
        }
    }

    pub fn output_text(&self) -> String {
        self.output.lock().expect("output lock").join("\n")
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("process is running") as i32
    }

    /// Sends a real signal (`kill -<signal>`), as Kubernetes or an operator would.
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit (at most [`DEADLINE`]) and for its last line to be
    /// read.
    pub async fn wait(&mut self) -> std::process::ExitStatus {
        let status = tokio::time::timeout(DEADLINE, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "process still running after {DEADLINE:?}:\n{}",
                    self.output_text()
                )
            })
            .expect("wait for the process");
        // A child of the process may still hold the pipes; do not wait for it forever.
        for reader in self.readers.drain(..) {
            let _ = tokio::time::timeout(DEADLINE, reader).await;
        }
        status
    }

    /// SIGTERM, then waits for the exit; panics unless the process exits 0.
    pub async fn stop(&mut self) {
        self.signal("TERM");
        let status = self.wait().await;
        assert!(
            status.success(),
            "exit status {status:?}:\n{}",
            self.output_text()
        );
    }

    /// SIGKILL, then waits for the process to be gone.
    pub async fn kill9(&mut self) {
        self.signal("KILL");
        self.wait().await;
    }

    /// Whether the process has not exited (by itself or otherwise).
    pub fn still_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// The value after `field=` in a text log line, e.g. `addr=127.0.0.1:41234`.
pub fn log_field(line: &str, field: &str) -> Option<String> {
    let start = line.find(&format!("{field}="))? + field.len() + 1;
    let rest = &line[start..];
    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"').to_owned())
}

/// `charges-relay` for `db` on `kafka`'s brokers and topic, with quick test settings
/// (200 ms polls, stats and backoff base, 2 s publish timeout, 1 s backoff cap) and its
/// metrics on a free port (tests run relays side by side), plus `extra` (later flags
/// win, `--database-url` too). Returns the process and its `/metrics` URL.
pub async fn start_relay(
    db: &TestDb,
    kafka: &kafka::TestKafka,
    extra: &[&str],
) -> (Process, String) {
    let mut args = vec![
        "--kafka-brokers",
        kafka.bootstrap.as_str(),
        "--topic",
        kafka.topic.as_str(),
        "--metrics-listen",
        "127.0.0.1:0",
        "--database-url",
        db.url.as_str(),
        "--poll-interval",
        "200ms",
        "--publish-timeout",
        "2s",
        "--backoff-base",
        "200ms",
        "--backoff-max",
        "1s",
        "--stats-interval",
        "200ms",
    ];
    args.extend_from_slice(extra);
    let (process, line) = Process::start("charges-relay", &args, &[], "relay started").await;
    let addr =
        log_field(&line, "metrics_addr").unwrap_or_else(|| panic!("no metrics_addr in {line:?}"));
    (process, format!("http://{addr}/metrics"))
}

/// A consumer in `group` against the test's database (its own tables, migrated by
/// `--migrate`) and topic. A short session timeout, so that a killed member leaves the
/// group within seconds instead of the default 45 s.
pub async fn start_consumer(
    db: &TestDb,
    kafka: &kafka::TestKafka,
    group: &str,
    extra: &[&str],
) -> Process {
    let mut args = vec![
        "--database-url",
        db.url.as_str(),
        "--kafka-brokers",
        kafka.bootstrap.as_str(),
        "--topic",
        kafka.topic.as_str(),
        "--group-id",
        group,
        "--migrate",
        "--kafka-config",
        "session.timeout.ms=6000",
        "--kafka-config",
        "heartbeat.interval.ms=500",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    Process::start("charges-consumer", &args, &[], "consumer started")
        .await
        .0
}

/// `charges-api` serving on a free loopback port against `db`.
pub struct TestApi {
    pub base_url: String,
    pub process: Process,
    pub http: reqwest::Client,
}

impl TestApi {
    pub async fn start(db: &TestDb, extra_args: &[&str]) -> TestApi {
        Self::start_at(&db.url, extra_args).await
    }

    /// The same on another URL of the test's database (through a pooler, say).
    pub async fn start_at(database_url: &str, extra_args: &[&str]) -> TestApi {
        let mut args = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            database_url,
        ];
        args.extend_from_slice(extra_args);
        let (process, line) = Process::start("charges-api", &args, &[], "listening").await;
        let addr = log_field(&line, "addr").unwrap_or_else(|| panic!("no addr in {line:?}"));
        TestApi {
            base_url: format!("http://{addr}"),
            process,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("http client"),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// `POST /charges` with a JSON body (as raw text, so tests can send anything).
    pub async fn post_charge(&self, key: Option<&str>, body: &str) -> reqwest::Response {
        let mut request = self
            .http
            .post(self.url("/charges"))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send().await.expect("POST /charges")
    }

    /// `POST /charges/{charge_id}/refunds` with `key` and a JSON body.
    pub async fn post_refund(&self, charge_id: &str, key: &str, body: &str) -> reqwest::Response {
        self.http
            .post(self.url(&format!("/charges/{charge_id}/refunds")))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body.to_owned())
            .send()
            .await
            .expect("POST /charges/{id}/refunds")
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }
}

/// Asserts an RFC 9457 problem (`application/problem+json` with `type`, `title`,
/// `detail` and the same `status`) answered with `status`, and returns its body.
pub async fn expect_problem(response: reqwest::Response, status: StatusCode) -> Value {
    assert_eq!(response.status(), status, "unexpected status");
    let content_type = response.headers()["content-type"]
        .to_str()
        .expect("a text content type")
        .to_owned();
    assert_eq!(content_type, "application/problem+json");
    let body: Value = response.json().await.expect("a JSON problem");
    assert_eq!(body["status"], status.as_u16());
    for field in ["type", "title", "detail"] {
        assert!(body[field].is_string(), "problem without {field}: {body}");
    }
    body
}

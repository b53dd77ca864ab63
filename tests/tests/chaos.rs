//! Fault injection ("chaos"): the real binaries under load while processes are killed
//! with SIGKILL, the database refuses connections, the broker goes down or slows down,
//! and clients send hostile input. After every scenario one invariant checker
//! ([`check_invariants`]) looks at what the clients were told, at the database and at
//! the topic:
//!
//! - every 201 the clients received names a charge that exists, with exactly one
//!   outbox row; no charge without its outbox row; no committed `STARTED` key; one
//!   charge per `(key, endpoint)`, and each key names the same charge in every 201;
//! - every outbox row is published (or dead with a reason), and reading the topic back
//!   and deduplicating on header `id` finds each event once;
//! - no answer to client input was a 5xx, except 503 while the database was made
//!   unavailable on purpose.
//!
//! Fast scenarios run in `make test`; the slow ones are `#[ignore = "slow: make chaos"]`
//! (named `slow_*`) and run with `make chaos` (`--run-ignored all`). Random choices
//! come from one seed printed at the start of each scenario (`CHAOS_SEED=<n>` replays
//! them). Every loop is bounded in count and in time. Each scenario prints one
//! `CHAOS …` line with its figures (see them with `--no-capture`).
//!
//! Only loopback: Postgres at `DATABASE_URL` (a database per test; the server itself is
//! never restarted, other tests share it), librdkafka's in-process mock cluster, and
//! the binaries on `127.0.0.1:0`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use charges_tests::cluster::TestCluster;
use charges_tests::kafka::TestKafka;
use charges_tests::{Process, TestApi, TestDb, new_key, start_relay};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use uuid::Uuid;

/// How long any one key may take to reach a final answer, retries included.
const KEY_LIMIT: Duration = Duration::from_secs(60);
/// Attempts per key (connection errors, 409 and 503 are retried).
const MAX_TRIES: usize = 300;
/// How long the checker waits for the relay to drain and the topic to show everything.
const DRAIN_LIMIT: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------------
// Seeded randomness (no extra dependency): xorshift64*.
// ---------------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn seeded(scenario: &str) -> Rng {
        let seed = std::env::var("CHAOS_SEED")
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or_else(|| Uuid::new_v4().as_u64_pair().0);
        eprintln!("chaos {scenario}: seed {seed} (CHAOS_SEED={seed} replays these choices)");
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.next() % (high - low + 1))
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

// ---------------------------------------------------------------------------------
// What the clients saw.
// ---------------------------------------------------------------------------------

/// One HTTP answer as a client saw it.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    replayed: bool,
    retry_after: Option<u64>,
    content_type: String,
    body: String,
}

#[derive(Default)]
struct LedgerState {
    answers: u64,
    statuses: BTreeMap<u16, u64>,
    connection_errors: u64,
    /// Charge ids named by the 201s of each key.
    charges_by_key: BTreeMap<String, BTreeSet<String>>,
    /// 201s without `Idempotent-Replayed`, per key.
    executed_by_key: BTreeMap<String, u64>,
    violations: Vec<String>,
}

/// Every answer the clients of one scenario received, and what was wrong with them.
#[derive(Default)]
struct Ledger {
    state: Mutex<LedgerState>,
    /// Set while the database is made unavailable on purpose: only then is a 503 right.
    db_outage: AtomicBool,
}

/// Words that would mean the database's or the driver's text reached a client.
const INTERNALS: &[&str] = &[
    "postgres",
    "FATAL",
    "SQLSTATE",
    "charges_test_",
    "tokio",
    "deadpool",
    "refused",
    "terminat",
];

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        self.state.lock().expect("ledger lock")
    }

    fn violation(&self, what: String) {
        self.lock().violations.push(what);
    }

    fn connection_error(&self) {
        self.lock().connection_errors += 1;
    }

    /// Records an answer to a request with `key` (if it had a valid one) and checks the
    /// rules every answer obeys.
    fn record(&self, key: Option<&str>, answer: &Answer) {
        let outage = self.db_outage.load(Ordering::SeqCst);
        let mut state = self.lock();
        state.answers += 1;
        *state.statuses.entry(answer.status).or_default() += 1;
        let status = answer.status;
        if status >= 500 && !(status == 503 && outage) {
            state.violations.push(format!(
                "{status} answered to client input (database outage: {outage}): {}",
                answer.body
            ));
        }
        if matches!(status, 409 | 503) && answer.retry_after.is_none() {
            state
                .violations
                .push(format!("{status} without Retry-After: {}", answer.body));
        }
        if status == 503 {
            if answer.content_type != "application/problem+json" {
                state
                    .violations
                    .push(format!("503 with content type {:?}", answer.content_type));
            }
            let lower = answer.body.to_lowercase();
            if let Some(word) = INTERNALS.iter().find(|w| lower.contains(&w.to_lowercase())) {
                state.violations.push(format!(
                    "503 body shows internals ({word}): {}",
                    answer.body
                ));
            }
        }
        if status == 201
            && let Some(key) = key
        {
            let id = serde_json::from_str::<serde_json::Value>(&answer.body)
                .ok()
                .and_then(|v| v["id"].as_str().map(str::to_owned));
            match id {
                Some(id) => {
                    state
                        .charges_by_key
                        .entry(key.to_owned())
                        .or_default()
                        .insert(id);
                    if !answer.replayed {
                        *state.executed_by_key.entry(key.to_owned()).or_default() += 1;
                    }
                }
                None => state
                    .violations
                    .push(format!("201 without a charge id: {}", answer.body)),
            }
        }
    }

    fn executed(&self, key: &str) -> u64 {
        self.lock().executed_by_key.get(key).copied().unwrap_or(0)
    }

    fn count(&self, status: u16) -> u64 {
        self.lock().statuses.get(&status).copied().unwrap_or(0)
    }
}

// ---------------------------------------------------------------------------------
// Clients.
// ---------------------------------------------------------------------------------

/// The API's current base URL: a restarted API listens on a new port.
type BaseUrl = Arc<RwLock<String>>;

fn charge_body(n: usize) -> String {
    format!(
        r#"{{"amountCents":{},"currency":"EUR"}}"#,
        100 + n % 100_000
    )
}

/// A client with a bounded pool of idle connections; concurrency itself is bounded by
/// the callers (a semaphore or a fixed number of workers).
fn http_client(idle: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(idle)
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

async fn post_charge(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    body: &str,
) -> Result<Answer, reqwest::Error> {
    let response = http
        .post(format!("{base}/charges"))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body.to_owned())
        .send()
        .await?;
    let headers = response.headers();
    let status = response.status().as_u16();
    let replayed = headers.get("idempotent-replayed").is_some();
    let retry_after = headers
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.text().await?;
    Ok(Answer {
        status,
        replayed,
        retry_after,
        content_type,
        body,
    })
}

/// Sends `key` with `body` until a final answer, as a careful client does: after a
/// connection error it sends the same request again; after a 409 or a 503 it waits
/// `Retry-After` first. At most [`MAX_TRIES`] attempts and [`KEY_LIMIT`]. A final answer
/// other than 201 is a violation (every body sent here is valid).
async fn submit(
    http: &reqwest::Client,
    base: &BaseUrl,
    key: &str,
    body: &str,
    ledger: &Ledger,
) -> Option<Answer> {
    let deadline = Instant::now() + KEY_LIMIT;
    for _ in 0..MAX_TRIES {
        if Instant::now() > deadline {
            break;
        }
        let url = base.read().expect("base url").clone();
        match post_charge(http, &url, key, body).await {
            Err(_) => {
                ledger.connection_error();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(answer) => {
                ledger.record(Some(key), &answer);
                match answer.status {
                    409 | 503 => {
                        let wait = answer.retry_after.unwrap_or(1).min(2);
                        tokio::time::sleep(Duration::from_secs(wait)).await;
                    }
                    201 => return Some(answer),
                    other => {
                        ledger.violation(format!(
                            "key {key}: final answer {other} to a valid request: {}",
                            answer.body
                        ));
                        return Some(answer);
                    }
                }
            }
        }
    }
    ledger.violation(format!(
        "key {key}: no final answer within {MAX_TRIES} tries / {KEY_LIMIT:?}"
    ));
    None
}

/// Workers that each submit new keys one after another (every key to its final
/// answer) until stopped, `max_keys` per worker, or [`KEY_LIMIT`] · 2. With `twins`
/// every eighth key is sent by two clients at once.
struct Load {
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<Vec<String>>>,
}

fn start_load(
    http: &reqwest::Client,
    base: &BaseUrl,
    ledger: &Arc<Ledger>,
    workers: usize,
    max_keys: usize,
    pace: Duration,
    twins: bool,
) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + KEY_LIMIT * 2;
    let workers = (0..workers)
        .map(|worker| {
            let (http, base, ledger, stop) =
                (http.clone(), base.clone(), ledger.clone(), stop.clone());
            tokio::spawn(async move {
                let mut keys = Vec::new();
                while !stop.load(Ordering::SeqCst)
                    && keys.len() < max_keys
                    && Instant::now() < deadline
                {
                    let key = new_key();
                    let body = charge_body(worker * 10_000 + keys.len());
                    if twins && keys.len() % 8 == 0 {
                        // Two clients with the same key and body at once: one executes,
                        // the other gets 409 or the replay.
                        futures::join!(
                            submit(&http, &base, &key, &body, &ledger),
                            submit(&http, &base, &key, &body, &ledger)
                        );
                    } else {
                        submit(&http, &base, &key, &body, &ledger).await;
                    }
                    keys.push(key);
                    if !pace.is_zero() {
                        tokio::time::sleep(pace).await;
                    }
                }
                keys
            })
        })
        .collect();
    Load { stop, workers }
}

impl Load {
    /// Waits until every worker has sent its `max_keys`; returns every key sent.
    async fn complete(self) -> Vec<String> {
        let mut keys = Vec::new();
        for worker in self.workers {
            keys.extend(worker.await.expect("load worker"));
        }
        keys
    }

    /// Stops the workers (each finishes its current key) and returns every key sent.
    async fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::SeqCst);
        let mut keys = Vec::new();
        for worker in self.workers {
            keys.extend(worker.await.expect("load worker"));
        }
        keys
    }
}

/// Sleeps `total` (a named step of a scenario's timeline).
async fn pause(total: Duration) {
    tokio::time::sleep(total).await;
}

// ---------------------------------------------------------------------------------
// The invariant checker.
// ---------------------------------------------------------------------------------

/// Each charge and its `ChargeCreated` outbox rows: anything but exactly one is wrong.
const CHARGES_WITHOUT_ONE_OUTBOX_ROW: &str = "
SELECT count(*) FROM charges c
  LEFT JOIN (SELECT aggregate_id, count(*) AS n FROM outbox
              WHERE event_type = 'ChargeCreated' GROUP BY aggregate_id) o
         ON o.aggregate_id = c.id
 WHERE coalesce(o.n, 0) <> 1";

/// Charges against the keys whose stored 201 names them: every charge is named by
/// exactly one key, and every key names a charge that exists.
const CHARGES_NOT_NAMED_BY_ONE_KEY: &str = "
SELECT count(*) FROM charges c
  FULL JOIN (SELECT (response_body::jsonb ->> 'id')::uuid AS charge_id, count(*) AS n
               FROM idempotency_keys
              WHERE endpoint = '/charges' AND response_status = 201
              GROUP BY 1) k
         ON k.charge_id = c.id
 WHERE c.id IS NULL OR k.charge_id IS NULL OR k.n <> 1";

const KEY_CHARGES: &str = "
SELECT key, response_body::jsonb ->> 'id' FROM idempotency_keys
 WHERE endpoint = '/charges' AND response_status = 201";

async fn scalar(db: &TestDb, sql: &str) -> i64 {
    db.client()
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

/// Checks every invariant (see the module documentation), prints the scenario's
/// figures, and fails the test on any violation. With `relay_running` false a relay is
/// started to drain the outbox; with true the scenario's own relays must do it (that
/// is how recovery is checked).
async fn check_invariants(
    scenario: &str,
    faults: &str,
    db: &TestDb,
    kafka: &TestKafka,
    ledger: &Ledger,
    relay_running: bool,
) {
    let mut violations = std::mem::take(&mut ledger.lock().violations);

    // The database.
    let without_outbox = scalar(db, CHARGES_WITHOUT_ONE_OUTBOX_ROW).await;
    if without_outbox > 0 {
        violations.push(format!(
            "{without_outbox} charges without exactly one outbox row"
        ));
    }
    let started = scalar(
        db,
        "SELECT count(*) FROM idempotency_keys WHERE status = 'STARTED'",
    )
    .await;
    if started > 0 {
        violations.push(format!("{started} committed STARTED keys"));
    }
    let not_one_key = scalar(db, CHARGES_NOT_NAMED_BY_ONE_KEY).await;
    if not_one_key > 0 {
        violations.push(format!(
            "{not_one_key} charges (or keys) not in a one-to-one match of key and charge"
        ));
    }

    // The clients against the database.
    let stored: BTreeMap<String, String> = db
        .client()
        .query(KEY_CHARGES, &[])
        .await
        .expect("read keys")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    {
        let state = ledger.lock();
        for (key, ids) in &state.charges_by_key {
            if ids.len() != 1 {
                violations.push(format!("key {key}: 201s named {} charges", ids.len()));
            }
            match (ids.iter().next(), stored.get(key)) {
                (Some(id), Some(stored)) if id == stored => {}
                (id, stored) => violations.push(format!(
                    "key {key}: a client got charge {id:?}, the database says {stored:?}"
                )),
            }
        }
        for (key, n) in &state.executed_by_key {
            if *n > 1 {
                violations.push(format!("key {key}: executed {n} times"));
            }
        }
    }

    // The outbox against the topic.
    let _relay = if relay_running {
        None
    } else {
        Some(start_relay(db, kafka, &[]).await)
    };
    let started_draining = Instant::now();
    loop {
        let pending = scalar(
            db,
            "SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_at IS NULL",
        )
        .await;
        if pending == 0 {
            break;
        }
        if started_draining.elapsed() > DRAIN_LIMIT {
            violations.push(format!(
                "{pending} outbox rows still pending after {DRAIN_LIMIT:?}"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dead = scalar(db, "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL").await;
    let dead_without_reason = scalar(
        db,
        "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL AND coalesce(last_error, '') = ''",
    )
    .await;
    if dead_without_reason > 0 {
        violations.push(format!("{dead_without_reason} dead rows without a reason"));
    }
    let published: BTreeSet<String> = db
        .client()
        .query(
            "SELECT id::text FROM outbox WHERE published_at IS NOT NULL",
            &[],
        )
        .await
        .expect("published ids")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let all_rows: BTreeSet<String> = db
        .client()
        .query("SELECT id::text FROM outbox", &[])
        .await
        .expect("outbox ids")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut reader = kafka.reader();
    let reading_since = Instant::now();
    let seen: BTreeSet<String> = loop {
        reader.drain();
        let seen: BTreeSet<String> = reader
            .messages
            .iter()
            .filter_map(|m| m.header("id").map(str::to_owned))
            .collect();
        let missing = published.difference(&seen).count();
        if missing == 0 {
            break seen;
        }
        if reading_since.elapsed() > DRAIN_LIMIT {
            violations.push(format!(
                "{missing} published outbox rows never seen on the topic"
            ));
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let unknown = seen.difference(&all_rows).count();
    if unknown > 0 {
        violations.push(format!("{unknown} events on the topic with no outbox row"));
    }
    let mut mismatched = 0;
    for message in &reader.messages {
        let event_id = message
            .payload
            .as_deref()
            .and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok())
            .and_then(|v| v["eventId"].as_str().map(str::to_owned));
        if event_id.as_deref() != message.header("id") {
            mismatched += 1;
        }
    }
    if mismatched > 0 {
        violations.push(format!(
            "{mismatched} messages whose payload eventId is not their header id"
        ));
    }

    let charges = db.count("charges").await;
    let state = ledger.lock();
    let statuses: Vec<String> = state
        .statuses
        .iter()
        .map(|(status, n)| format!("{status}×{n}"))
        .collect();
    eprintln!(
        "CHAOS {scenario}: faults: {faults}; answers {} [{}], connection errors {}; \
         keys with a 201 {}; charges {charges}, outbox rows {} (dead {dead}); topic \
         messages {}, distinct event ids {} (redeliveries {}); invariant violations: {}",
        state.answers,
        statuses.join(" "),
        state.connection_errors,
        state.charges_by_key.len(),
        all_rows.len(),
        reader.messages.len(),
        seen.len(),
        reader.messages.len().saturating_sub(seen.len()),
        violations.len(),
    );
    drop(state);
    assert!(
        violations.is_empty(),
        "{scenario}: {} invariant violations, first ones:\n{}",
        violations.len(),
        violations
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// ---------------------------------------------------------------------------------
// 1. Concurrency storm.
// ---------------------------------------------------------------------------------

/// `same` requests with one key and `distinct` requests with a key each, all released
/// at once (at most `in_flight` on the wire, through a bounded connection pool).
async fn storm(scenario: &str, same: usize, distinct: usize, in_flight: usize) {
    let mut rng = Rng::seeded(scenario);
    let db = TestDb::new().await;
    let kafka = TestKafka::new(3).await;
    // 2 cores and a Postgres shared with parallel tests: a pool of 24 keeps every core
    // busy; requests beyond it queue for at most --db-acquire-timeout (2 s).
    let api = TestApi::start(&db, &["--db-pool-size", "24"]).await;
    let ledger = Arc::new(Ledger::default());
    let http = http_client(in_flight);
    let base: BaseUrl = Arc::new(RwLock::new(api.base_url.clone()));

    let hot = new_key();
    let hot_body = charge_body(4900);
    let mut requests: Vec<(String, String)> = vec![(hot.clone(), hot_body); same];
    let distinct_keys: Vec<String> = (0..distinct).map(|_| new_key()).collect();
    requests.extend(
        distinct_keys
            .iter()
            .enumerate()
            .map(|(i, key)| (key.clone(), charge_body(i))),
    );
    rng.shuffle(&mut requests);

    let gate = Arc::new(Semaphore::new(in_flight));
    let started = Instant::now();
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|(key, body)| {
            let (http, base, ledger, gate) =
                (http.clone(), base.clone(), ledger.clone(), gate.clone());
            tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.expect("semaphore");
                let url = base.read().expect("base url").clone();
                match post_charge(&http, &url, &key, &body).await {
                    Ok(answer) => {
                        ledger.record(Some(&key), &answer);
                        Some((key, answer.status))
                    }
                    Err(e) => {
                        ledger.connection_error();
                        ledger.violation(format!("storm request failed: {e}"));
                        None
                    }
                }
            })
        })
        .collect();
    let mut hot_statuses: BTreeMap<u16, u64> = BTreeMap::new();
    for task in tasks {
        if let Some((key, status)) = tokio::time::timeout(KEY_LIMIT, task)
            .await
            .expect("storm request within the limit")
            .expect("storm task")
            && key == hot
        {
            *hot_statuses.entry(status).or_default() += 1;
        }
    }
    let elapsed = started.elapsed();
    if ledger.executed(&hot) != 1 {
        ledger.violation(format!(
            "the hot key was executed {} times",
            ledger.executed(&hot)
        ));
    }
    if hot_statuses.keys().any(|s| !matches!(s, 201 | 409)) {
        ledger.violation(format!("the hot key got {hot_statuses:?}"));
    }
    for key in &distinct_keys {
        if ledger.executed(key) != 1 {
            ledger.violation(format!(
                "distinct key {key} executed {}",
                ledger.executed(key)
            ));
        }
    }
    let faults = format!(
        "{same} requests with one key + {distinct} with distinct keys, {in_flight} in flight, \
         done in {:.1} s (hot key: {hot_statuses:?})",
        elapsed.as_secs_f64()
    );
    check_invariants(scenario, &faults, &db, &kafka, &ledger, false).await;
}

#[tokio::test]
async fn storm_of_one_key_and_distinct_keys_fast() {
    storm("storm (fast)", 100, 400, 48).await;
}

#[tokio::test]
#[ignore = "slow: make chaos"]
async fn slow_storm_500_same_key_and_2000_distinct_keys() {
    storm("storm", 500, 2000, 64).await;
}

// ---------------------------------------------------------------------------------
// 2. kill -9 of the API under load.
// ---------------------------------------------------------------------------------

#[tokio::test]
#[ignore = "slow: make chaos"]
async fn slow_api_killed_with_sigkill_under_load() {
    const KILLS: usize = 3;
    let scenario = "API kill -9";
    let mut rng = Rng::seeded(scenario);
    let db = TestDb::new().await;
    let kafka = TestKafka::new(3).await;
    let api_args = ["--db-pool-size", "16"];
    let mut api = TestApi::start(&db, &api_args).await;
    let ledger = Arc::new(Ledger::default());
    let http = http_client(32);
    let base: BaseUrl = Arc::new(RwLock::new(api.base_url.clone()));
    let load = start_load(&http, &base, &ledger, 24, 2_000, Duration::ZERO, true);

    let mut downtime = Duration::ZERO;
    for _ in 0..KILLS {
        pause(rng.millis(300, 1500)).await;
        let killed_at = Instant::now();
        api.process.kill9().await;
        pause(rng.millis(0, 300)).await;
        api = TestApi::start(&db, &api_args).await;
        *base.write().expect("base url") = api.base_url.clone();
        downtime += killed_at.elapsed();
    }
    pause(Duration::from_secs(1)).await;
    let keys = load.finish().await;

    // Every key ended with exactly one charge, named by every 201 it got.
    let stored: BTreeSet<String> = db
        .client()
        .query(
            "SELECT key FROM idempotency_keys WHERE endpoint = '/charges' AND response_status = 201",
            &[],
        )
        .await
        .expect("keys")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let lost = keys.iter().filter(|k| !stored.contains(*k)).count();
    if lost > 0 {
        ledger.violation(format!("{lost} keys without a charge"));
    }
    let faults = format!(
        "{KILLS} SIGKILLs of the API under load ({} keys from 24 clients, every 8th key \
         sent by 2 clients at once; {:.1} s down in all)",
        keys.len(),
        downtime.as_secs_f64()
    );
    check_invariants(scenario, &faults, &db, &kafka, &ledger, false).await;
}

// ---------------------------------------------------------------------------------
// 3. kill -9 of relays.
// ---------------------------------------------------------------------------------

#[tokio::test]
#[ignore = "slow: make chaos"]
async fn slow_relays_killed_with_sigkill_while_publishing() {
    const KILLS: usize = 5;
    let scenario = "relay kill -9";
    let mut rng = Rng::seeded(scenario);
    let db = TestDb::new().await;
    let kafka = TestKafka::new(4).await;
    let api = TestApi::start(&db, &[]).await;
    let ledger = Arc::new(Ledger::default());
    let http = http_client(16);
    let base: BaseUrl = Arc::new(RwLock::new(api.base_url.clone()));

    // A backlog first, then relays against it while more rows keep arriving.
    let backlog = start_load(&http, &base, &ledger, 16, 150, Duration::ZERO, false);
    let backlog_keys = backlog.complete().await;
    if let Some(mock) = kafka.mock() {
        // Slower acknowledgements, so that kills land inside batches.
        mock.broker_round_trip_time(-1, Duration::from_millis(100))
            .expect("broker round trip time");
    }
    let relay_args = ["--batch-size", "50"];
    let mut relays = Vec::new();
    for _ in 0..3 {
        relays.push(start_relay(&db, &kafka, &relay_args).await.0);
    }
    let load = start_load(
        &http,
        &base,
        &ledger,
        4,
        500,
        Duration::from_millis(5),
        false,
    );
    let mut most_running = relays.len();
    for kill in 0..KILLS {
        pause(rng.millis(150, 700)).await;
        let victim = rng.below(relays.len());
        relays[victim].kill9().await;
        relays.swap_remove(victim);
        // Between 2 and 4 relays: sometimes one fewer for a while, sometimes one more.
        let target = 2 + (kill + rng.below(3)) % 3;
        while relays.len() < target {
            relays.push(start_relay(&db, &kafka, &relay_args).await.0);
        }
        most_running = most_running.max(relays.len());
    }
    let keys = load.finish().await;
    if let Some(mock) = kafka.mock() {
        mock.broker_round_trip_time(-1, Duration::ZERO)
            .expect("broker round trip time");
    }
    if relays.len() < 2 {
        relays.push(start_relay(&db, &kafka, &relay_args).await.0);
    }
    let faults = format!(
        "{KILLS} SIGKILLs of relays (2..={most_running} running, batch 50, broker RTT 100 ms), \
         {} rows of backlog + {} created meanwhile",
        backlog_keys.len(),
        keys.len()
    );
    check_invariants(scenario, &faults, &db, &kafka, &ledger, true).await;
    for relay in &mut relays {
        assert!(relay.still_running(), "a relay died by itself");
    }
}

// ---------------------------------------------------------------------------------
// 4. Database outage (fast: part of make test).
// ---------------------------------------------------------------------------------

/// While the database is unavailable: `count` new keys, 300 ms apart, each of which must
/// be answered within `answer_bound` with a 503 problem, never a hang. Returns the keys
/// (for the client to retry afterwards) and the slowest answer.
async fn probe_outage(
    http: &reqwest::Client,
    base_url: &str,
    ledger: &Ledger,
    count: usize,
    answer_bound: Duration,
) -> (Vec<String>, Duration) {
    let mut probes = Vec::new();
    let mut slowest = Duration::ZERO;
    for _ in 0..count {
        let key = new_key();
        let sent = Instant::now();
        match tokio::time::timeout(
            answer_bound,
            post_charge(http, base_url, &key, &charge_body(7)),
        )
        .await
        {
            Err(_) => ledger.violation(format!("no answer within {answer_bound:?}")),
            Ok(Err(e)) => ledger.violation(format!("connection error during the outage: {e}")),
            Ok(Ok(answer)) => {
                slowest = slowest.max(sent.elapsed());
                ledger.record(Some(&key), &answer);
                if answer.status != 503 || !answer.body.contains("/problems/service-unavailable") {
                    ledger.violation(format!(
                        "during the outage: {} {}",
                        answer.status, answer.body
                    ));
                }
            }
        }
        probes.push(key);
        pause(Duration::from_millis(300)).await;
    }
    (probes, slowest)
}

/// What both database-outage scenarios share: an API with a 1 s acquire timeout, one
/// relay, six clients under load; the probes while the database is away; the recovery.
struct OutageUnderLoad {
    api: TestApi,
    relay: Process,
    ledger: Arc<Ledger>,
    http: reqwest::Client,
    base: BaseUrl,
    load: Option<Load>,
    /// The pool may wait for a slot, then for a connect: both bounded by the timeout.
    answer_bound: Duration,
    started: Instant,
}

/// What an outage scenario measured, for its `CHAOS` line.
struct OutageFigures {
    outage: Duration,
    keys: usize,
    answers_503: u64,
    slowest: Duration,
    answer_bound: Duration,
    api_recovery: Duration,
}

impl OutageFigures {
    fn describe(&self) -> String {
        format!(
            "{:.1} s under load ({} keys from 6 clients); {} answers 503, slowest {} ms \
             (bound {} ms); API answered 201 again {} ms after",
            self.outage.as_secs_f64(),
            self.keys,
            self.answers_503,
            self.slowest.as_millis(),
            self.answer_bound.as_millis(),
            self.api_recovery.as_millis()
        )
    }
}

impl OutageUnderLoad {
    async fn start(db: &TestDb, kafka: &TestKafka) -> OutageUnderLoad {
        let acquire_timeout = Duration::from_secs(1);
        let api = TestApi::start(db, &["--db-acquire-timeout", "1s", "--db-pool-size", "8"]).await;
        let (relay, _) = start_relay(db, kafka, &[]).await;
        let ledger = Arc::new(Ledger::default());
        let http = http_client(16);
        let base: BaseUrl = Arc::new(RwLock::new(api.base_url.clone()));
        let load = start_load(
            &http,
            &base,
            &ledger,
            6,
            5_000,
            Duration::from_millis(20),
            false,
        );
        pause(Duration::from_millis(800)).await;
        OutageUnderLoad {
            api,
            relay,
            ledger,
            http,
            base,
            load: Some(load),
            answer_bound: acquire_timeout * 2 + Duration::from_secs(2),
            started: Instant::now(),
        }
    }

    /// From now on a 503 is an allowed answer.
    fn begin(&mut self) {
        self.ledger.db_outage.store(true, Ordering::SeqCst);
        self.started = Instant::now();
    }

    /// While the database is away: `count` new keys, each answered 503 within the
    /// bound, and `/readyz` 503. Returns the keys and the slowest answer.
    async fn probe(&self, count: usize) -> (Vec<String>, Duration) {
        let probed = probe_outage(
            &self.http,
            &self.api.base_url,
            &self.ledger,
            count,
            self.answer_bound,
        )
        .await;
        let ready = self
            .http
            .get(format!("{}/readyz", self.api.base_url))
            .send()
            .await
            .expect("readyz");
        let status = ready.status().as_u16();
        assert_eq!(
            status,
            503,
            "/readyz during the outage: {}",
            ready.text().await.unwrap_or_default()
        );
        probed
    }

    /// Once the database is back (at `back_at`): the probes' keys, retried, succeed
    /// without restarting anything; requests begun during the outage get one bound to
    /// end; the load stops; both binaries are still running.
    async fn recover(
        &mut self,
        outage: Duration,
        back_at: Instant,
        probes: &[String],
        slowest: Duration,
    ) -> OutageFigures {
        for key in probes {
            submit(&self.http, &self.base, key, &charge_body(7), &self.ledger).await;
        }
        let api_recovery = back_at.elapsed();
        pause(self.answer_bound).await;
        self.ledger.db_outage.store(false, Ordering::SeqCst);
        pause(Duration::from_secs(1)).await;
        let keys = match self.load.take() {
            Some(load) => load.finish().await.len(),
            None => 0,
        };
        let answers_503 = self.ledger.count(503);
        assert!(answers_503 > 0, "the outage was never seen by a client");
        assert!(self.api.process.still_running(), "the API died");
        assert!(self.relay.still_running(), "the relay died");
        OutageFigures {
            outage,
            keys: keys + probes.len(),
            answers_503,
            slowest,
            answer_bound: self.answer_bound,
            api_recovery,
        }
    }
}

#[tokio::test]
async fn database_outage_is_503_within_the_acquire_timeout_and_both_binaries_recover() {
    let scenario = "database outage";
    let db = TestDb::new().await;
    let kafka = TestKafka::new(2).await;
    let mut run = OutageUnderLoad::start(&db, &kafka).await;

    // The outage: this database refuses new connections and loses its sessions (all
    // but this test's observer connection). The server keeps running for other tests.
    let name = db.name.clone();
    let observer: i32 = db
        .client()
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("own pid")
        .get(0);
    let admin = db.admin_client().await;
    run.begin();
    // Two statements, in this order, each committed on its own: in one simple-query
    // batch they would share one transaction, and a session opened between the
    // terminate and the commit of the ALTER would survive the outage.
    admin
        .batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"))
        .await
        .expect("refuse connections");
    let mut sessions_left = i64::MAX;
    for _ in 0..50 {
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE datname = $1 AND pid <> $2",
                &[&name, &observer],
            )
            .await
            .expect("terminate the sessions");
        sessions_left = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> $2",
                &[&name, &observer],
            )
            .await
            .expect("count sessions")
            .get(0);
        if sessions_left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sessions_left, 0, "sessions survived the outage");

    let (probes, slowest) = run.probe(6).await;
    assert_eq!(
        run.http
            .get(format!("{}/healthz", run.api.base_url))
            .send()
            .await
            .expect("healthz")
            .status()
            .as_u16(),
        200,
        "the process itself is alive"
    );
    let outage = run.started.elapsed();

    admin
        .batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        .await
        .expect("allow connections again");
    let figures = run.recover(outage, Instant::now(), &probes, slowest).await;
    let faults = format!(
        "database refused connections and lost its sessions for {}",
        figures.describe()
    );
    // The same relay must publish what piled up: no new relay is started.
    check_invariants(scenario, &faults, &db, &kafka, &run.ledger, true).await;
    assert!(run.relay.still_running(), "the relay died");
}

/// Scenario 4 literally: the Postgres server itself crashes under load
/// (`pg_ctl stop -m immediate`: every backend killed, recovery at the next start) and is
/// started again. A server of the test's own, so the shared one is never touched.
#[tokio::test]
async fn postgres_crash_and_restart_under_load_is_503_and_both_binaries_recover() {
    let scenario = "postgres restart";
    let cluster = TestCluster::start().await;
    let mut db = TestDb::new_on(&cluster.url).await;
    let kafka = TestKafka::new(2).await;
    let mut run = OutageUnderLoad::start(&db, &kafka).await;

    run.begin();
    cluster.crash();
    let (probes, slowest) = run.probe(5).await;
    let outage = run.started.elapsed();

    cluster.start_server().await;
    let restarted_at = Instant::now();
    db.reconnect().await;
    let figures = run.recover(outage, restarted_at, &probes, slowest).await;
    let faults = format!(
        "Postgres crashed (immediate stop) and was started again after {}",
        figures.describe()
    );
    check_invariants(scenario, &faults, &db, &kafka, &run.ledger, true).await;
    assert!(run.relay.still_running(), "the relay died");
}

// ---------------------------------------------------------------------------------
// 5. Broker outage and slow broker.
// ---------------------------------------------------------------------------------

/// The age of the relay's oldest open transaction, in seconds (0 if none).
async fn relay_transaction_age(db: &TestDb) -> f64 {
    db.client()
        .query_one(
            "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)::float8
               FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = 'charges-relay'
                AND xact_start IS NOT NULL",
            &[],
        )
        .await
        .expect("pg_stat_activity")
        .get(0)
}

/// Samples the relay's transaction age every 100 ms for `duration`; returns the max.
async fn watch_relay_transactions(db: &TestDb, duration: Duration) -> f64 {
    let until = Instant::now() + duration;
    let mut oldest: f64 = 0.0;
    while Instant::now() < until {
        oldest = oldest.max(relay_transaction_age(db).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    oldest
}

#[tokio::test]
#[ignore = "slow: make chaos"]
async fn slow_broker_outage_and_slow_broker() {
    let scenario = "broker outage + slow broker";
    let publish_timeout = Duration::from_secs(2);
    // relay::TRANSACTION_MARGIN is 2 s; 1 s more for sampling and scheduling.
    let transaction_bound = publish_timeout.as_secs_f64() + 2.0 + 1.0;
    let mut rng = Rng::seeded(scenario);
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let Some(mock) = kafka.mock() else {
        eprintln!("skipped: needs the mock cluster's fault injection (KAFKA_BROKERS is set)");
        return;
    };
    let api = TestApi::start(&db, &[]).await;
    let (mut relay, _) = start_relay(&db, &kafka, &["--publish-timeout", "2s"]).await;
    let ledger = Arc::new(Ledger::default());
    let http = http_client(8);
    let base: BaseUrl = Arc::new(RwLock::new(api.base_url.clone()));
    let load = start_load(
        &http,
        &base,
        &ledger,
        4,
        5_000,
        Duration::from_millis(20),
        false,
    );

    pause(Duration::from_secs(1)).await;
    let down_for = rng.millis(4_000, 6_000);
    mock.broker_down(1).expect("broker down");
    let oldest_down = watch_relay_transactions(&db, down_for).await;
    let pending_during_outage = scalar(
        &db,
        "SELECT count(*) FROM outbox WHERE published_at IS NULL",
    )
    .await;
    mock.broker_up(1).expect("broker up");
    pause(Duration::from_secs(2)).await;

    let rtt = rng.millis(300, 800);
    mock.broker_round_trip_time(-1, rtt)
        .expect("broker round trip time");
    let oldest_slow = watch_relay_transactions(&db, Duration::from_secs(4)).await;
    mock.broker_round_trip_time(-1, Duration::ZERO)
        .expect("broker round trip time");
    let keys = load.finish().await;

    for (phase, oldest) in [("broker down", oldest_down), ("slow broker", oldest_slow)] {
        if oldest > transaction_bound {
            ledger.violation(format!(
                "{phase}: a relay transaction was {oldest:.1} s old (bound {transaction_bound} s)"
            ));
        }
    }
    if pending_during_outage == 0 {
        ledger.violation("nothing was pending while the broker was down".to_owned());
    }
    check_invariants(
        scenario,
        &format!(
            "broker down {:.1} s, then broker RTT {} ms for 4 s, under load ({} keys); \
             {pending_during_outage} rows pending during the outage; oldest relay \
             transaction {oldest_down:.1} s down / {oldest_slow:.1} s slow (bound {transaction_bound} s)",
            down_for.as_secs_f64(),
            rtt.as_millis(),
            keys.len()
        ),
        &db,
        &kafka,
        &ledger,
        true,
    )
    .await;
    // Backoff held: a handful of attempts for seconds of outage, nothing dead.
    let (max_attempts, retried) = {
        let row = db
            .client()
            .query_one(
                "SELECT coalesce(max(attempts), 0), count(*) FILTER (WHERE attempts > 0) FROM outbox",
                &[],
            )
            .await
            .expect("attempts");
        (row.get::<_, i32>(0), row.get::<_, i64>(1))
    };
    eprintln!("CHAOS {scenario}: {retried} rows retried, at most {max_attempts} failed attempts");
    assert!(retried > 0, "the outage never failed a publish");
    assert!(
        max_attempts <= 6,
        "backoff did not hold: {max_attempts} attempts"
    );
    assert_eq!(
        scalar(&db, "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL").await,
        0
    );
    assert!(relay.still_running(), "the relay died");
}

// ---------------------------------------------------------------------------------
// 6. Hostile input (fast: part of make test).
// ---------------------------------------------------------------------------------

/// What came back on a raw connection.
#[derive(Debug)]
enum Raw {
    /// A status line (and everything read after it).
    Answer(u16, String),
    /// Closed or reset without an answer.
    Closed,
    /// Nothing within the limit.
    Hung,
}

fn header(name: &str, value: impl AsRef<[u8]>) -> Vec<u8> {
    let mut line = format!("{name}: ").into_bytes();
    line.extend_from_slice(value.as_ref());
    line
}

/// One HTTP/1.1 request, byte for byte, with `Connection: close` so that the answer
/// ends with the connection.
fn raw_request(method: &str, path: &[u8], headers: &[Vec<u8>], body: &[u8]) -> Vec<u8> {
    let mut request = format!("{method} ").into_bytes();
    request.extend_from_slice(path);
    request.extend_from_slice(b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for line in headers {
        request.extend_from_slice(line);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
    request.extend_from_slice(body);
    request
}

fn status_of(response: &[u8]) -> Option<u16> {
    let text = String::from_utf8_lossy(response);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
}

/// Sends `request` on a new connection and reads until the server closes it, at most
/// `limit`.
async fn raw_exchange(addr: &str, request: &[u8], limit: Duration) -> Raw {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return Raw::Closed;
    };
    // The server may stop reading (a head that is too large) and close: not an error.
    let _ = stream.write_all(request).await;
    let mut response = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut buffer = [0_u8; 8192];
        while let Ok(n) = stream.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            response.extend_from_slice(&buffer[..n]);
        }
    })
    .await;
    match status_of(&response) {
        Some(status) => Raw::Answer(status, String::from_utf8_lossy(&response).into_owned()),
        None if read.is_err() => Raw::Hung,
        None => Raw::Closed,
    }
}

fn percent_encode(raw: &str) -> String {
    raw.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// What a hostile request must get.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// This status, with this problem type in the body.
    Problem(u16, &'static str),
    /// Any 4xx, or the connection closed without an answer (a malformed head).
    Refused,
}

const SQL: &[&str] = &[
    "'; DROP TABLE charges; --",
    "\" OR \"\"=\"",
    "1' OR '1'='1",
    "$$; DELETE FROM outbox; $$",
    "\\'; TRUNCATE idempotency_keys CASCADE; --",
    "%_%' UNION SELECT * FROM pg_user --",
];

#[tokio::test]
async fn hostile_input_is_refused_with_a_4xx_and_slow_or_idle_clients_are_cut_off() {
    let scenario = "hostile input";
    let client_request_timeout = Duration::from_secs(1);
    let keep_alive = Duration::from_secs(1);
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let api = TestApi::start(
        &db,
        &["--client-request-timeout", "1s", "--keep-alive", "1s"],
    )
    .await;
    let addr = api.base_url.trim_start_matches("http://").to_owned();
    let ledger = Ledger::default();
    let key = new_key();
    let json = || header("Content-Type", "application/json");
    let with_key = |k: &str| header("Idempotency-Key", k);
    const VALID: &[u8] = br#"{"amountCents":4900,"currency":"EUR"}"#;
    let invalid_body = "/problems/invalid-request-body";

    let mut cases: Vec<(String, Vec<u8>, Expect)> = Vec::new();
    // Headers: size and count (actix: 128 KiB head buffer, 96 headers).
    cases.push((
        "one 200 KiB header".into(),
        raw_request(
            "POST",
            b"/charges",
            &[
                json(),
                with_key(&key),
                header("X-Pad", "a".repeat(200 * 1024)),
            ],
            VALID,
        ),
        Expect::Refused,
    ));
    cases.push((
        "2000 small headers".into(),
        raw_request(
            "POST",
            b"/charges",
            &(0..2000)
                .map(|i| header(&format!("X-H{i}"), "v"))
                .collect::<Vec<_>>(),
            VALID,
        ),
        Expect::Refused,
    ));
    let mut many_keys = vec![json()];
    many_keys.extend((0..100).map(|_| with_key(&new_key())));
    cases.push((
        "100 Idempotency-Key headers".into(),
        raw_request("POST", b"/charges", &many_keys, VALID),
        Expect::Refused,
    ));
    let mut some_keys = vec![json()];
    some_keys.extend((0..40).map(|_| with_key(&new_key())));
    cases.push((
        "40 Idempotency-Key headers".into(),
        raw_request("POST", b"/charges", &some_keys, VALID),
        Expect::Problem(400, "/problems/invalid-idempotency-key"),
    ));
    // Deep nesting, under and over the body limit (16 KiB).
    let deep_array = format!(
        r#"{{"amountCents":{}{}}}"#,
        "[".repeat(6000),
        "]".repeat(6000)
    );
    let deep_object = format!(
        r#"{{"amountCents":1,"currency":{}1{}}}"#,
        r#"{"a":"#.repeat(2000),
        "}".repeat(2000)
    );
    for (name, body) in [
        ("6000 nested arrays", deep_array),
        ("2000 nested objects", deep_object),
    ] {
        cases.push((
            name.into(),
            raw_request(
                "POST",
                b"/charges",
                &[json(), with_key(&key)],
                body.as_bytes(),
            ),
            Expect::Problem(400, invalid_body),
        ));
    }
    cases.push((
        "40 000 nested arrays (over the body limit)".into(),
        raw_request(
            "POST",
            b"/charges",
            &[json(), with_key(&key)],
            "[".repeat(40_000).as_bytes(),
        ),
        Expect::Problem(413, "/problems/payload-too-large"),
    ));
    // NUL bytes.
    cases.push((
        "a raw NUL in a JSON string".into(),
        raw_request(
            "POST",
            b"/charges",
            &[json(), with_key(&key)],
            b"{\"amountCents\":4900,\"currency\":\"EU\0\"}",
        ),
        Expect::Problem(400, invalid_body),
    ));
    cases.push((
        "an escaped NUL in a field name".into(),
        raw_request(
            "POST",
            b"/charges",
            &[json(), with_key(&key)],
            br#"{"amount\u0000Cents":4900}"#,
        ),
        Expect::Problem(400, invalid_body),
    ));
    cases.push((
        "a NUL in the Idempotency-Key header".into(),
        raw_request(
            "POST",
            b"/charges",
            &[json(), header("Idempotency-Key", b"\0abc")],
            VALID,
        ),
        Expect::Refused,
    ));
    cases.push((
        "a NUL in the path".into(),
        raw_request("GET", b"/charges/\0", &[], b""),
        Expect::Refused,
    ));
    cases.push((
        "a percent-encoded NUL as the charge id".into(),
        raw_request("GET", b"/charges/%00", &[], b""),
        Expect::Problem(400, "/problems/invalid-charge-id"),
    ));
    // Bytes that are not UTF-8 (obs-text) where the API reads text.
    for (name, line) in [
        (
            "Idempotency-Key",
            header("Idempotency-Key", b"\xff\xfe-not-utf8"),
        ),
        (
            "Content-Type",
            header("Content-Type", b"application/json\xff"),
        ),
        ("X-Request-Id", header("X-Request-Id", b"\xff\xfe\xfd")),
    ] {
        let mut headers = vec![line];
        if name != "Content-Type" {
            headers.push(json());
        }
        if name != "Idempotency-Key" {
            headers.push(with_key(&key));
        }
        let expect = match name {
            "Idempotency-Key" => Expect::Problem(400, "/problems/invalid-idempotency-key"),
            "Content-Type" => Expect::Problem(415, "/problems/unsupported-media-type"),
            // A request id that is not text is replaced; the body is still refused
            // (the key must stay free for the test's last step).
            _ => Expect::Problem(400, invalid_body),
        };
        let body: &[u8] = if name == "X-Request-Id" { b"{}" } else { VALID };
        cases.push((
            format!("non-UTF-8 bytes in {name}"),
            raw_request("POST", b"/charges", &headers, body),
            expect,
        ));
    }
    // Framing: both Content-Length and chunked (request smuggling), a lying length.
    cases.push((
        "Content-Length with Transfer-Encoding: chunked".into(),
        [
            b"POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n".as_slice(),
            b"Content-Type: application/json\r\nContent-Length: 4\r\n",
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ]
        .concat(),
        Expect::Refused,
    ));
    // SQL meta-characters in every string the API reads.
    for (i, sql) in SQL.iter().enumerate() {
        let literal = serde_json::to_string(sql).expect("JSON string");
        cases.push((
            format!("SQL #{i} as currency"),
            raw_request(
                "POST",
                b"/charges",
                &[json(), with_key(&key)],
                format!(r#"{{"amountCents":4900,"currency":{literal}}}"#).as_bytes(),
            ),
            Expect::Problem(400, invalid_body),
        ));
        cases.push((
            format!("SQL #{i} as amountCents"),
            raw_request(
                "POST",
                b"/charges",
                &[json(), with_key(&key)],
                format!(r#"{{"amountCents":{literal}}}"#).as_bytes(),
            ),
            Expect::Problem(400, invalid_body),
        ));
        cases.push((
            format!("SQL #{i} as a field name"),
            raw_request(
                "POST",
                b"/charges",
                &[json(), with_key(&key)],
                format!(r#"{{"amountCents":4900,{literal}:1}}"#).as_bytes(),
            ),
            Expect::Problem(400, invalid_body),
        ));
        cases.push((
            format!("SQL #{i} as the Idempotency-Key"),
            raw_request("POST", b"/charges", &[json(), with_key(sql)], VALID),
            Expect::Problem(400, "/problems/invalid-idempotency-key"),
        ));
        cases.push((
            format!("SQL #{i} in the Content-Type"),
            raw_request(
                "POST",
                b"/charges",
                &[
                    header("Content-Type", format!("application/json{sql}")),
                    with_key(&key),
                ],
                VALID,
            ),
            Expect::Problem(415, "/problems/unsupported-media-type"),
        ));
        let id = percent_encode(sql);
        cases.push((
            format!("SQL #{i} as the charge id of GET"),
            raw_request("GET", format!("/charges/{id}").as_bytes(), &[], b""),
            Expect::Problem(400, "/problems/invalid-charge-id"),
        ));
        cases.push((
            format!("SQL #{i} as the charge id of a refund"),
            raw_request(
                "POST",
                format!("/charges/{id}/refunds").as_bytes(),
                &[json(), with_key(&key)],
                b"{}",
            ),
            Expect::Problem(400, "/problems/invalid-charge-id"),
        ));
    }

    let limit = Duration::from_secs(10);
    let mut results: BTreeMap<&'static str, u64> = BTreeMap::new();
    for (name, request, expect) in &cases {
        let outcome = raw_exchange(&addr, request, limit).await;
        match (&outcome, expect) {
            (Raw::Answer(status, text), _) => {
                let body = text
                    .split_once("\r\n\r\n")
                    .map_or("", |(_, body)| body)
                    .to_owned();
                ledger.record(
                    None,
                    &Answer {
                        status: *status,
                        replayed: false,
                        retry_after: None,
                        content_type: String::new(),
                        body: body.clone(),
                    },
                );
                let ok = match expect {
                    Expect::Problem(want, kind) => *status == *want && body.contains(kind),
                    Expect::Refused => (400..500).contains(status),
                };
                *results
                    .entry(if ok { "as expected" } else { "wrong" })
                    .or_default() += 1;
                if !ok {
                    ledger.violation(format!("{name}: expected {expect:?}, got {status} {body}"));
                }
            }
            (Raw::Closed, Expect::Refused) => {
                *results.entry("closed").or_default() += 1;
            }
            (other, _) => ledger.violation(format!("{name}: expected {expect:?}, got {other:?}")),
        }
    }
    // A large header that fits is just a header: the request is served.
    let big_but_fine = raw_exchange(
        &addr,
        &raw_request(
            "POST",
            b"/charges",
            &[
                json(),
                with_key(&key),
                header("X-Pad", "a".repeat(64 * 1024)),
            ],
            VALID,
        ),
        limit,
    )
    .await;
    match big_but_fine {
        Raw::Answer(status, text) => {
            let body = text
                .split_once("\r\n\r\n")
                .map_or("", |(_, b)| b)
                .to_owned();
            ledger.record(
                Some(&key),
                &Answer {
                    status,
                    replayed: text.to_lowercase().contains("idempotent-replayed"),
                    retry_after: None,
                    content_type: String::new(),
                    body,
                },
            );
            assert_eq!(status, 201, "a 64 KiB header on a valid request: {text}");
        }
        other => panic!("a 64 KiB header on a valid request: {other:?}"),
    }

    // A slow client: headers dribbled one line every 200 ms never make a request; the
    // server answers 408 (or closes) once --client-request-timeout has passed.
    let slow_started = Instant::now();
    let mut slow = TcpStream::connect(&addr).await.expect("connect");
    slow.write_all(b"POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("write the request line");
    let mut slow_response = Vec::new();
    let mut buffer = [0_u8; 1024];
    for i in 0..50 {
        if slow
            .write_all(format!("X-Slow-{i}: a\r\n").as_bytes())
            .await
            .is_err()
        {
            break;
        }
        match tokio::time::timeout(Duration::from_millis(200), slow.read(&mut buffer)).await {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => slow_response.extend_from_slice(&buffer[..n]),
        }
    }
    let cut_off_after = slow_started.elapsed();
    let slow_status = status_of(&slow_response);
    assert!(
        cut_off_after < client_request_timeout + Duration::from_secs(3),
        "a slow client kept its connection for {cut_off_after:?}"
    );
    assert!(
        matches!(slow_status, None | Some(408)),
        "slow client answered {slow_status:?}"
    );

    // A slow body: the head arrives, the body stops short of its Content-Length. Found
    // by this suite: the body read had no bound at all (the connection and the request
    // stayed open forever); now the body gets --client-request-timeout too.
    let stalled_started = Instant::now();
    let mut stalled = TcpStream::connect(&addr).await.expect("connect");
    stalled
        .write_all(
            format!(
                "POST /charges HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                 Idempotency-Key: {key}\r\nContent-Length: 100\r\n\r\n{{\"amountCents\":1"
            )
            .as_bytes(),
        )
        .await
        .expect("write a partial request");
    let mut stalled_response = Vec::new();
    let _ = tokio::time::timeout(client_request_timeout * 2 + Duration::from_secs(3), async {
        while let Ok(n) = stalled.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            stalled_response.extend_from_slice(&buffer[..n]);
            if String::from_utf8_lossy(&stalled_response).contains("\r\n\r\n{") {
                break;
            }
        }
    })
    .await;
    let stalled_after = stalled_started.elapsed();
    let stalled_status = status_of(&stalled_response);
    match stalled_status {
        Some(status) => ledger.record(
            None,
            &Answer {
                status,
                replayed: false,
                retry_after: None,
                content_type: String::new(),
                body: String::from_utf8_lossy(&stalled_response).into_owned(),
            },
        ),
        None => ledger.violation(format!(
            "a stalled body got no answer within {stalled_after:?}"
        )),
    }
    assert_eq!(stalled_status, Some(400), "a stalled body");
    assert!(
        stalled_after < client_request_timeout * 2 + Duration::from_secs(2),
        "a stalled body was cut off after {stalled_after:?}"
    );

    // Keep-alive: an idle connection is closed after --keep-alive.
    let mut idle = TcpStream::connect(&addr).await.expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    let mut got = Vec::new();
    while !String::from_utf8_lossy(&got).ends_with("ok\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buffer))
            .await
            .expect("an answer to /healthz")
            .expect("read");
        assert!(n > 0, "closed before answering /healthz");
        got.extend_from_slice(&buffer[..n]);
    }
    assert_eq!(status_of(&got), Some(200));
    let idle_since = Instant::now();
    let closed = tokio::time::timeout(keep_alive + Duration::from_secs(4), idle.read(&mut buffer))
        .await
        .expect("an idle keep-alive connection must be closed");
    assert!(
        matches!(closed, Ok(0) | Err(_)),
        "expected the connection to close, read {closed:?}"
    );
    let idle_closed_after = idle_since.elapsed();

    // Every refused request used `key` and left it free: the 64 KiB-header request
    // above executed it for the first time.
    assert_eq!(
        ledger.executed(&key),
        1,
        "the refused requests left the key free"
    );
    let http = http_client(1);
    let base: BaseUrl = Arc::new(RwLock::new(api.base_url.clone()));
    let control = new_key();
    submit(
        &http,
        &base,
        &control,
        std::str::from_utf8(VALID).expect("utf-8"),
        &ledger,
    )
    .await;
    let tables = scalar(
        &db,
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'
            AND tablename IN ('charges', 'outbox', 'idempotency_keys', 'refunds')",
    )
    .await;
    assert_eq!(tables, 4, "every table is still there");

    let faults = format!(
        "{} hostile requests ({results:?}); slow client cut off after {} ms (status {slow_status:?}); \
         stalled body answered {stalled_status:?} after {} ms; idle keep-alive closed after {} ms",
        cases.len() + 2,
        cut_off_after.as_millis(),
        stalled_after.as_millis(),
        idle_closed_after.as_millis()
    );
    check_invariants(scenario, &faults, &db, &kafka, &ledger, false).await;
}

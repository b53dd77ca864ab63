//! Fault injection ("chaos"): the real binaries under load while processes are killed
//! with SIGKILL, the database refuses connections or crashes, and the broker goes down
//! or slows down. After every scenario one invariant checker
//! ([`charges_tests::chaos::check_invariants`], with the rest of the machinery in
//! tests/src/chaos/) looks at what the clients were told, at the database and at the
//! topic. Hostile input has a file of its own (hostile_input.rs).
//!
//! Fast scenarios run in `make test` and wait for events only; the slow ones, and every
//! timing bound (how soon a 503 comes), are `#[ignore = "slow: make chaos"]` (named
//! `slow_*`) and run with `make chaos` (`--run-ignored all`). Random choices come from
//! one seed printed at the start of each scenario (`CHAOS_SEED=<n>` replays them).
//! Every loop is bounded in count and in time. Each scenario prints one `CHAOS …` line
//! with its figures (see them with `--no-capture`).
//!
//! Only loopback: Postgres at `DATABASE_URL` (a database per test; the server itself is
//! never restarted, other tests share it), librdkafka's in-process mock cluster, and
//! the binaries on `127.0.0.1:0`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use charges_tests::chaos::{
    Clients, KEY_LIMIT, Ledger, Load, charge_body, check_invariants, pause, post_charge, scalar,
    seeded_rng,
};
use charges_tests::cluster::TestCluster;
use charges_tests::kafka::TestKafka;
use charges_tests::{Process, TestApi, TestDb, new_key, poll_until, start_relay};
use rand::Rng;
use rand::seq::SliceRandom;
use tokio::sync::Semaphore;

// ---------------------------------------------------------------------------------
// 1. Concurrency storm.
// ---------------------------------------------------------------------------------

/// `same` requests with one key and `distinct` requests with a key each, all released
/// at once (at most `in_flight` on the wire, through a bounded connection pool).
async fn storm(scenario: &str, same: usize, distinct: usize, in_flight: usize) {
    let mut rng = seeded_rng(scenario);
    let db = TestDb::new().await;
    let kafka = TestKafka::new(3).await;
    // 2 cores and a Postgres shared with parallel tests: a pool of 24 keeps every core
    // busy; requests beyond it queue for at most --db-acquire-timeout (2 s).
    let api = TestApi::start(&db, &["--db-pool-size", "24"]).await;
    let clients = Clients::new(&api, in_flight);
    let (ledger, http, base) = (&clients.ledger, &clients.http, &clients.base);

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
    requests.shuffle(&mut rng);

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
                        ledger.record(Some(&key), &answer, false);
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
    check_invariants(scenario, &faults, &db, &kafka, ledger, false).await;
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
    let mut rng = seeded_rng(scenario);
    let db = TestDb::new().await;
    let kafka = TestKafka::new(3).await;
    let api_args = ["--db-pool-size", "16"];
    let mut api = TestApi::start(&db, &api_args).await;
    let clients = Clients::new(&api, 32);
    let load = clients.load(24, 2_000, Duration::ZERO, true);

    let mut downtime = Duration::ZERO;
    for _ in 0..KILLS {
        pause(Duration::from_millis(rng.random_range(300..=1500))).await;
        let killed_at = Instant::now();
        api.process.kill9().await;
        pause(Duration::from_millis(rng.random_range(0..=300))).await;
        api = TestApi::start(&db, &api_args).await;
        *clients.base.write().expect("base url") = api.base_url.clone();
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
        clients
            .ledger
            .violation(format!("{lost} keys without a charge"));
    }
    let faults = format!(
        "{KILLS} SIGKILLs of the API under load ({} keys from 24 clients, every 8th key \
         sent by 2 clients at once; {:.1} s down in all)",
        keys.len(),
        downtime.as_secs_f64()
    );
    check_invariants(scenario, &faults, &db, &kafka, &clients.ledger, false).await;
}

// ---------------------------------------------------------------------------------
// 3. kill -9 of relays.
// ---------------------------------------------------------------------------------

#[tokio::test]
#[ignore = "slow: make chaos"]
async fn slow_relays_killed_with_sigkill_while_publishing() {
    const KILLS: usize = 5;
    let scenario = "relay kill -9";
    let mut rng = seeded_rng(scenario);
    let db = TestDb::new().await;
    let kafka = TestKafka::new(4).await;
    let api = TestApi::start(&db, &[]).await;
    let clients = Clients::new(&api, 16);

    // A backlog first, then relays against it while more rows keep arriving.
    let backlog = clients.load(16, 150, Duration::ZERO, false);
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
    let load = clients.load(4, 500, Duration::from_millis(5), false);
    let mut most_running = relays.len();
    for kill in 0..KILLS {
        pause(Duration::from_millis(rng.random_range(150..=700))).await;
        let victim = rng.random_range(0..relays.len());
        relays[victim].kill9().await;
        relays.swap_remove(victim);
        // Between 2 and 4 relays: sometimes one fewer for a while, sometimes one more.
        let target = 2 + (kill + rng.random_range(0..3)) % 3;
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
    check_invariants(scenario, &faults, &db, &kafka, &clients.ledger, true).await;
    for relay in &mut relays {
        assert!(relay.still_running(), "a relay died by itself");
    }
}

// ---------------------------------------------------------------------------------
// 4. Database outage (fast: part of make test; with the timing bound: make chaos).
// ---------------------------------------------------------------------------------

/// While the database is unavailable: `count` new keys, 300 ms apart, each of which must
/// be answered with a 503 problem, never a hang (with `answer_bound`: within it).
/// Returns the keys (for the client to retry afterwards) and the slowest answer.
async fn probe_outage(
    http: &reqwest::Client,
    base_url: &str,
    ledger: &Ledger,
    count: usize,
    answer_bound: Option<Duration>,
) -> (Vec<String>, Duration) {
    let mut probes = Vec::new();
    let mut slowest = Duration::ZERO;
    for _ in 0..count {
        let key = new_key();
        let body = charge_body(7);
        let sent = Instant::now();
        let post = post_charge(http, base_url, &key, &body);
        let answered = match answer_bound {
            Some(bound) => tokio::time::timeout(bound, post)
                .await
                .map_err(|_| format!("no answer within {bound:?}")),
            None => Ok(post.await),
        };
        match answered {
            Err(late) => ledger.violation(late),
            Ok(Err(e)) => ledger.violation(format!("connection error during the outage: {e}")),
            Ok(Ok(answer)) => {
                slowest = slowest.max(sent.elapsed());
                ledger.record(Some(&key), &answer, true);
                if answer.status != 503 || !answer.body.contains("/problems/service-unavailable") {
                    ledger.violation(format!(
                        "during the outage: {} {}",
                        answer.status, answer.body
                    ));
                }
            }
        }
        probes.push(key);
        // The outage lasts while the probes are spread over it: its duration, not a
        // wait for an event.
        pause(Duration::from_millis(300)).await;
    }
    (probes, slowest)
}

/// What both database-outage scenarios share: an API with a 1 s acquire timeout, one
/// relay, six clients under load; the probes while the database is away; the recovery.
struct OutageUnderLoad {
    api: TestApi,
    relay: Process,
    clients: Clients,
    load: Option<Load>,
    /// For the timed variants: the pool may wait for a slot, then for a connect, both
    /// bounded by the acquire timeout.
    answer_bound: Option<Duration>,
    started: Instant,
    /// The keys sent while the database was away, the slowest answer to them, and how
    /// long the outage had lasted once they were answered.
    probes: Vec<String>,
    slowest: Duration,
    outage: Duration,
}

impl OutageUnderLoad {
    /// With `timed`, each answer during the outage must come within the bound.
    async fn start(db: &TestDb, kafka: &TestKafka, timed: bool) -> OutageUnderLoad {
        let acquire_timeout = Duration::from_secs(1);
        let api = TestApi::start(db, &["--db-acquire-timeout", "1s", "--db-pool-size", "8"]).await;
        let (relay, _) = start_relay(db, kafka, &[]).await;
        let clients = Clients::new(&api, 16);
        let load = clients.steady_load(6);
        // The load is running: a 201 for every client, on average.
        poll_until("the load got its first answers", async || {
            (clients.ledger.count(201) >= 6).then_some(())
        })
        .await;
        OutageUnderLoad {
            api,
            relay,
            clients,
            load: Some(load),
            answer_bound: timed.then(|| acquire_timeout * 2 + Duration::from_secs(2)),
            started: Instant::now(),
            probes: Vec::new(),
            slowest: Duration::ZERO,
            outage: Duration::ZERO,
        }
    }

    /// From now on a request sent may be answered 503.
    fn begin(&mut self) {
        self.clients.ledger.set_outage(true);
        self.started = Instant::now();
    }

    /// While the database is away: `count` new keys, each answered 503 (within the
    /// bound, if any), and `/readyz` 503.
    async fn probe(&mut self, count: usize) {
        (self.probes, self.slowest) = probe_outage(
            &self.clients.http,
            &self.api.base_url,
            &self.clients.ledger,
            count,
            self.answer_bound,
        )
        .await;
        let ready = self
            .clients
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
        self.outage = self.started.elapsed();
    }

    /// Once the database is back (at `back_at`): the probes' keys, retried, succeed
    /// without restarting anything. From then on a request sent must not be answered
    /// 503 (one sent during the outage still may be, whenever its answer comes): the
    /// load runs on until a dozen more keys got their 201, then stops. Both binaries
    /// are still running, and the same relay publishes what piled up (no new relay is
    /// started) for the invariant checker.
    async fn finish(
        mut self,
        scenario: &str,
        fault: &str,
        db: &TestDb,
        kafka: &TestKafka,
        back_at: Instant,
    ) {
        for key in &self.probes {
            self.clients.submit(key, &charge_body(7)).await;
        }
        let api_recovery = back_at.elapsed();
        self.clients.ledger.set_outage(false);
        let created = self.clients.ledger.count(201);
        poll_until("a dozen more keys created after the recovery", async || {
            (self.clients.ledger.count(201) >= created + 12).then_some(())
        })
        .await;
        let keys = match self.load.take() {
            Some(load) => load.finish().await.len(),
            None => 0,
        };
        let answers_503 = self.clients.ledger.count(503);
        assert!(answers_503 > 0, "the outage was never seen by a client");
        assert!(self.api.process.still_running(), "the API died");
        assert!(self.relay.still_running(), "the relay died");
        let faults = format!(
            "{fault} {:.1} s under load ({} keys from 6 clients); {answers_503} answers \
             503, slowest {} ms (bound {}); API answered 201 again {} ms after",
            self.outage.as_secs_f64(),
            keys + self.probes.len(),
            self.slowest.as_millis(),
            self.answer_bound
                .map_or("none".to_owned(), |b| format!("{} ms", b.as_millis())),
            api_recovery.as_millis()
        );
        check_invariants(scenario, &faults, db, kafka, &self.clients.ledger, true).await;
        assert!(self.relay.still_running(), "the relay died");
    }
}

/// This database refuses new connections and loses its sessions (all but the test's
/// observer connection) under load; the server keeps running for other tests. Every
/// new key is answered 503 (with `timed`, within the bound); once the database is back
/// the API and the same relay recover by themselves.
async fn database_outage(scenario: &str, timed: bool) {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(2).await;
    let mut run = OutageUnderLoad::start(&db, &kafka, timed).await;

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
    poll_until("no session survived the outage", async || {
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                  WHERE datname = $1 AND pid <> $2",
                &[&name, &observer],
            )
            .await
            .expect("terminate the sessions");
        let sessions_left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> $2",
                &[&name, &observer],
            )
            .await
            .expect("count sessions")
            .get(0);
        (sessions_left == 0).then_some(())
    })
    .await;

    run.probe(6).await;
    assert_eq!(
        run.clients
            .http
            .get(format!("{}/healthz", run.api.base_url))
            .send()
            .await
            .expect("healthz")
            .status()
            .as_u16(),
        200,
        "the process itself is alive"
    );
    admin
        .batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"))
        .await
        .expect("allow connections again");
    let fault = "database refused connections and lost its sessions for";
    run.finish(scenario, fault, &db, &kafka, Instant::now())
        .await;
}

#[tokio::test]
async fn database_outage_is_503_and_both_binaries_recover() {
    database_outage("database outage", false).await;
}

#[tokio::test]
#[ignore = "slow: make chaos"]
async fn slow_database_outage_is_503_within_the_acquire_timeout() {
    database_outage("database outage (timed)", true).await;
}

/// Scenario 4 literally: the Postgres server itself crashes under load
/// (`pg_ctl stop -m immediate`: every backend killed, recovery at the next start) and is
/// started again. A server of the test's own, so the shared one is never touched.
async fn postgres_crash(scenario: &str, timed: bool) {
    let cluster = TestCluster::start().await;
    let mut db = TestDb::new_on(&cluster.url).await;
    let kafka = TestKafka::new(2).await;
    let mut run = OutageUnderLoad::start(&db, &kafka, timed).await;

    run.begin();
    cluster.crash();
    run.probe(5).await;

    cluster.start_server().await;
    let restarted_at = Instant::now();
    db.reconnect().await;
    let fault = "Postgres crashed (immediate stop) and was started again after";
    run.finish(scenario, fault, &db, &kafka, restarted_at).await;
}

#[tokio::test]
async fn postgres_crash_and_restart_under_load_is_503_and_both_binaries_recover() {
    postgres_crash("postgres restart", false).await;
}

#[tokio::test]
#[ignore = "slow: make chaos"]
async fn slow_postgres_crash_is_503_within_the_acquire_timeout() {
    postgres_crash("postgres restart (timed)", true).await;
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
    let mut rng = seeded_rng(scenario);
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let Some(mock) = kafka.mock() else {
        eprintln!("skipped: needs the mock cluster's fault injection (KAFKA_BROKERS is set)");
        return;
    };
    let api = TestApi::start(&db, &[]).await;
    let (mut relay, _) = start_relay(&db, &kafka, &["--publish-timeout", "2s"]).await;
    let clients = Clients::new(&api, 8);
    let ledger = &clients.ledger;
    let load = clients.steady_load(4);

    pause(Duration::from_secs(1)).await;
    let down_for = Duration::from_millis(rng.random_range(4_000..=6_000));
    mock.broker_down(1).expect("broker down");
    let oldest_down = watch_relay_transactions(&db, down_for).await;
    let pending_during_outage = scalar(
        &db,
        "SELECT count(*) FROM outbox WHERE published_at IS NULL",
    )
    .await;
    mock.broker_up(1).expect("broker up");
    pause(Duration::from_secs(2)).await;

    let rtt = Duration::from_millis(rng.random_range(300..=800));
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
        ledger,
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

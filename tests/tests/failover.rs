//! A primary and a streaming standby of the tests' own (`initdb`, `pg_basebackup -R`;
//! tests/src/cluster.rs), the binaries given one multi-host URL with
//! `target_session_attrs=read-write`, and a failover: the primary crashes, the standby
//! is promoted. What must hold: nothing acknowledged is lost that the standby confirmed,
//! no commit the standby lacks is acknowledged (the cancelled synchronous wait), and no
//! event is published for a commit the new primary lacks (the replication gate).

use charges_tests::cluster::TestCluster;
use charges_tests::failover::{
    SyncRepWatchdog, assert_acknowledged_kept, assert_topic_matches_outbox,
    cancel_synchronous_waits, charge_published, charge_until_answered, client_charges,
    event_of_key, wait_published, wait_until_all_published,
};
use charges_tests::kafka::{TestKafka, read_to_end};
use charges_tests::metrics::{sample, scrape, scrape_until};
use charges_tests::{TestApi, TestDb, expect_problem, new_key, poll_until, start_relay};
use reqwest::StatusCode;

/// One URL for both servers: whichever accepts writes is the one used.
fn multi_host_url(primary: &TestCluster, standby: &TestCluster, db: &TestDb) -> String {
    format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{}?target_session_attrs=read-write",
        primary.port(),
        standby.port(),
        db.name
    )
}

/// The API's session that waits for the synchronous standby, cancelled as an operator's
/// watchdog would, once one waits.
async fn cancel_the_synchronous_wait(db: &TestDb) {
    poll_until("a commit waits for the synchronous standby", async || {
        let cancelled = cancel_synchronous_waits(db.client(), "charges-api")
            .await
            .ok()?;
        (cancelled > 0).then_some(())
    })
    .await;
}

/// The relay's gate rolled `batches` batches back and `event` is still pending, with no
/// attempt used and not dead: held back, as during a broker outage.
async fn assert_gate_holds(
    api: &TestApi,
    relay_metrics: &str,
    db: &TestDb,
    event: uuid::Uuid,
    batches: f64,
) {
    scrape_until(
        &api.http,
        relay_metrics,
        "the gate rolled batches back",
        |page| sample(page, "charges_relay_standby_timeouts_total", &[]) >= batches,
    )
    .await;
    let held = db
        .client()
        .query_one(
            "SELECT published_at IS NULL AND attempts = 0 AND dead_at IS NULL
               FROM outbox WHERE id = $1",
            &[&event],
        )
        .await
        .expect("the unreplicated row")
        .get::<_, bool>(0);
    assert!(
        held,
        "the gate published, counted or killed a row the standby lacks"
    );
}

/// A primary whose commits wait for its standby `s1`, a test database on it, and the
/// multi-host URL of both.
async fn synchronous_pair() -> (TestCluster, TestCluster, TestDb, String) {
    let primary = TestCluster::start().await;
    let standby = primary.start_standby("s1").await;
    let db = TestDb::new_on(&primary.url).await;
    primary.synchronous_standbys("s1").await;
    primary.wait_for_standby("s1", "sync").await;
    let url = multi_host_url(&primary, &standby, &db);
    (primary, standby, db, url)
}

/// PostgreSQL keeps a commit whose synchronous wait was cancelled and says so only in a
/// WARNING. The API answers it 503 (never 201), the relay's gate never publishes its
/// event, and after a failover to the standby that never had it, the client's retry
/// with the same key creates the charge once, and only that charge's event goes out.
#[tokio::test]
async fn a_cancelled_synchronous_wait_is_never_acknowledged_nor_published_across_a_failover() {
    let (primary, standby, db, url) = synchronous_pair().await;
    let kafka = TestKafka::new(1).await;
    // A replay that waits for a standby that does not come ends at the statement timeout.
    let api = TestApi::start_at(&url, &["--db-statement-timeout", "1s"]).await;
    let relay_args = ["--database-url", url.as_str(), "--wait-for-standbys", "s1"];
    let (mut relay, relay_metrics) = start_relay(&db, &kafka, &relay_args).await;

    let before = new_key();
    assert_eq!(
        charge_until_answered(&api, &before).await.0,
        StatusCode::CREATED
    );
    let replicated = event_of_key(&primary.url_of(&db), &before)
        .await
        .expect("its event");
    db.wait_for(
        "SELECT published_at IS NOT NULL FROM outbox WHERE id = $1",
        &[&replicated],
        "a replicated charge's event is published through the gate",
    )
    .await;

    // The standby goes away: every commit now waits for it, until cancelled.
    standby.stop();
    let key = new_key();
    let (answer, ()) = tokio::join!(
        api.post_charge(Some(&key), r#"{"amountCents":4900}"#),
        cancel_the_synchronous_wait(&db)
    );
    assert!(answer.headers().contains_key("retry-after"));
    expect_problem(answer, StatusCode::SERVICE_UNAVAILABLE).await;
    let ghost = event_of_key(&primary.url_of(&db), &key)
        .await
        .expect("the commit stayed on the primary: the hole this guards against");
    // The client retries while the old primary still runs: the key's row is there, but
    // the standby lacks it, so the replay waits for the standby until its statement
    // times out.
    post_unconfirmed(&api, "/charges", &key, r#"{"amountCents":4900}"#).await;
    let api_metrics = scrape(&api.http, &api.url("/metrics")).await;
    assert_eq!(
        sample(&api_metrics, "charges_db_unreplicated_commits_total", &[]),
        1.0
    );
    // The gate holds the row back while the standby is gone: a batch waits, rolls back,
    // and the row stays pending with no attempt used, as during a broker outage.
    assert_gate_holds(&api, &relay_metrics, &db, ghost, 1.0).await;

    // The failover: the primary dies, the standby (which never got that commit) is
    // promoted and given a standby of its own, as a failover manager would.
    primary.crash();
    standby.start_server().await;
    standby.promote();
    let _new_standby = standby.start_standby("s1").await;
    let (status, replayed) = charge_until_answered(&api, &key).await;
    assert_eq!(status, StatusCode::CREATED, "the retry after the failover");
    assert!(
        !replayed,
        "the charge the failover dropped is created, not replayed"
    );
    let retried = event_of_key(&standby.url_of(&db), &key)
        .await
        .expect("the retry's event");
    wait_published(&standby.url_of(&db), retried).await;
    relay.stop().await;

    let mut reader = kafka.reader();
    read_to_end(&kafka, &mut reader).await;
    assert_eq!(reader.with_id(&replicated.to_string()).len(), 1);
    assert_eq!(reader.with_id(&retried.to_string()).len(), 1);
    assert!(
        reader.with_id(&ghost.to_string()).is_empty(),
        "an event was published for a commit the new primary does not have"
    );
    drop(primary);
}

/// `--wait-for-standbys sync` follows the synchronous set: while its standby lacks a
/// commit (here a cancelled wait), every batch that claims the row waits for it and
/// rolls back untouched; once the standby is back and has flushed it, it is published.
#[tokio::test]
async fn the_sync_gate_holds_a_commit_its_synchronous_standby_lacks_until_it_flushes() {
    let (primary, standby, db, url) = synchronous_pair().await;
    let kafka = TestKafka::new(1).await;
    let api = TestApi::start_at(&url, &[]).await;
    let relay_args = [
        "--database-url",
        url.as_str(),
        "--wait-for-standbys",
        "sync",
        "--publish-timeout",
        "500ms",
    ];
    let (mut relay, relay_metrics) = start_relay(&db, &kafka, &relay_args).await;
    charge_published(&api, &primary.url_of(&db)).await;

    standby.stop();
    let key = new_key();
    let (answer, ()) = tokio::join!(
        api.post_charge(Some(&key), r#"{"amountCents":4900}"#),
        cancel_the_synchronous_wait(&db)
    );
    expect_problem(answer, StatusCode::SERVICE_UNAVAILABLE).await;
    let held = event_of_key(&primary.url_of(&db), &key)
        .await
        .expect("the commit the standby lacks");
    assert_gate_holds(&api, &relay_metrics, &db, held, 2.0).await;

    standby.start_server().await;
    wait_published(&primary.url_of(&db), held).await;
    relay.stop().await;
    let mut reader = kafka.reader();
    read_to_end(&kafka, &mut reader).await;
    assert!(!reader.with_id(&held.to_string()).is_empty());
}

/// A failover manager empties `synchronous_standby_names` on a promoted primary that has
/// no standby yet (Patroni's `synchronous_mode`), and promotes only a synchronous
/// standby: while the set is empty no standby could take over with less than the
/// primary has. `sync` then publishes at once, where `any` or a name would hold every
/// event until a standby streams again.
#[tokio::test]
async fn after_a_failover_the_sync_gate_publishes_while_the_synchronous_set_is_empty() {
    let (primary, standby, db, url) = synchronous_pair().await;
    let kafka = TestKafka::new(1).await;
    let api = TestApi::start_at(&url, &[]).await;
    let relay_args = [
        "--database-url",
        url.as_str(),
        "--wait-for-standbys",
        "sync",
    ];
    let (mut relay, _) = start_relay(&db, &kafka, &relay_args).await;
    charge_published(&api, &primary.url_of(&db)).await;

    primary.crash();
    standby.promote();
    standby.synchronous_standbys("").await;
    charge_published(&api, &standby.url_of(&db)).await;
    relay.stop().await;
    let published = assert_topic_matches_outbox(&standby.url_of(&db), &kafka).await;
    assert_eq!(published, 2);
    drop(primary);
}

/// `POST` with `body` while the standby lacks the key's commit: a 503 with `Retry-After`
/// (the wait for the standby cancelled or timed out), never the stored answer.
async fn post_unconfirmed(api: &TestApi, path: &str, key: &str, body: &str) {
    let answer = api
        .http
        .post(api.url(path))
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body.to_owned())
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}"));
    assert_eq!(
        answer.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "{path}: answered (replayed: {:?}) while the standby lacks the commit",
        answer.headers().get("idempotent-replayed")
    );
    assert!(answer.headers().contains_key("retry-after"));
    expect_problem(answer, StatusCode::SERVICE_UNAVAILABLE).await;
}

/// The response the key's row stores on the test's server, if it has one.
async fn stored_body(db: &TestDb, key: &str) -> Option<String> {
    db.client()
        .query_opt(
            "SELECT response_body FROM idempotency_keys WHERE key = $1",
            &[&key],
        )
        .await
        .expect("read the key's row")
        .map(|row| row.get(0))
}

/// A replay is an acknowledgment. A charge and a refund whose synchronous waits were
/// cancelled (an operator's watchdog) stay on the primary; every retry of their keys
/// reads the stored answer but waits for the standby to have it, and is answered 503
/// while it does not (its statement times out), however often it comes. Once the
/// standby is back and caught up, the retries replay them.
#[tokio::test]
async fn a_replay_is_answered_only_once_the_standby_has_the_commit() {
    let (primary, standby, db, url) = synchronous_pair().await;
    let api = TestApi::start_at(&url, &["--db-statement-timeout", "1s"]).await;
    // Another replica, with one server session and every replay read from it: that
    // session remembers the position its standby confirmed for an earlier replay
    // (idempotency_await_standbys, pg-idempotency V3), and must still wait for the
    // commits made after it.
    let replica = TestApi::start_at(
        &url,
        &[
            "--db-statement-timeout",
            "1s",
            "--db-pool-size",
            "1",
            "--replay-cache-entries",
            "0",
        ],
    )
    .await;
    let first_key = new_key();
    let created = api
        .post_charge(Some(&first_key), r#"{"amountCents":4900}"#)
        .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    let replayed = replica
        .post_charge(Some(&first_key), r#"{"amountCents":4900}"#)
        .await;
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    let charge: serde_json::Value = created.json().await.expect("the charge");
    let refunds = format!(
        "/charges/{}/refunds",
        charge["id"].as_str().expect("its id")
    );

    standby.stop();
    assert!(
        !standbys_have_everything(&db).await,
        "no standby streams, yet a replay would skip its wait"
    );
    let watchdog = SyncRepWatchdog::start(&db.url, "charges-api").await;
    let charge_key = new_key();
    let refund_key = new_key();
    let charge_body = r#"{"amountCents":4900}"#;
    let refund_body = r#"{"amountCents":100}"#;
    let mut stored = Vec::new();
    for (path, key, body) in [
        ("/charges", &charge_key, charge_body),
        (refunds.as_str(), &refund_key, refund_body),
    ] {
        // The first request commits, its wait is cancelled, its row stays.
        let row = poll_until("the key's row committed on the primary", async || {
            post_unconfirmed(&api, path, key, body).await;
            stored_body(&db, key).await
        })
        .await;
        for replica in [&replica, &api] {
            post_unconfirmed(replica, path, key, body).await;
        }
        stored.push(row);
    }
    drop(watchdog);
    let api_metrics = scrape(&api.http, &api.url("/metrics")).await;
    assert!(sample(&api_metrics, "charges_db_unreplicated_commits_total", &[]) >= 2.0);

    standby.start_server().await;
    primary.wait_for_standby("s1", "sync").await;
    poll_until("the standby caught up: replays need not wait", async || {
        standbys_have_everything(&db).await.then_some(())
    })
    .await;
    for (path, key, body, stored) in [
        ("/charges", &charge_key, charge_body, &stored[0]),
        (refunds.as_str(), &refund_key, refund_body, &stored[1]),
    ] {
        let replay = api
            .http
            .post(api.url(path))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body)
            .send()
            .await
            .expect("POST");
        assert_eq!(replay.status(), StatusCode::CREATED, "{path}");
        assert_eq!(replay.headers()["idempotent-replayed"], "true", "{path}");
        assert_eq!(&replay.text().await.expect("body"), stored, "{path}");
    }
    assert_eq!(db.count("charges").await, 2);
    assert_eq!(db.count("refunds").await, 1);

    // Counted as the server counts: with two synchronous standbys required and one
    // streaming, nothing is confirmed, however far that one is.
    primary.synchronous_standbys("FIRST 2 (s1, s2)").await;
    poll_until("FIRST 2 applies", async || {
        (!standbys_have_everything(&db).await).then_some(())
    })
    .await;
    primary.synchronous_standbys("ANY 1 (s1, s2)").await;
    poll_until("ANY 1 applies", async || {
        standbys_have_everything(&db).await.then_some(())
    })
    .await;
}

/// Whether a replay would find its key's commit confirmed without waiting
/// (`idempotency_standbys_have`, V14, at the WAL flushed so far).
async fn standbys_have_everything(db: &TestDb) -> bool {
    db.client()
        .query_one(
            "SELECT idempotency_standbys_have(pg_current_wal_flush_lsn())",
            &[],
        )
        .await
        .expect("ask the function")
        .get(0)
}

/// An asynchronous standby acknowledges nothing, so a failover can lose charges the API
/// answered 201: inherent to asynchronous replication, and counted here. With the gate,
/// the event stream does not lie about them: none of their events was published.
#[tokio::test]
async fn with_an_asynchronous_standby_the_gate_publishes_no_event_the_failover_lost() {
    let primary = TestCluster::start().await;
    let standby = primary.start_standby("s1").await;
    let db = TestDb::new_on(&primary.url).await;
    primary.wait_for_standby("s1", "async").await;
    let url = multi_host_url(&primary, &standby, &db);
    let kafka = TestKafka::new(1).await;
    let api = TestApi::start_at(&url, &[]).await;
    let (mut relay, _) = start_relay(
        &db,
        &kafka,
        &["--database-url", url.as_str(), "--wait-for-standbys", "any"],
    )
    .await;

    // The standby falls behind (here: it stops), the primary goes on acknowledging.
    standby.stop();
    let mut keys = Vec::new();
    for _ in 0..5 {
        let key = new_key();
        assert_eq!(
            charge_until_answered(&api, &key).await.0,
            StatusCode::CREATED
        );
        keys.push(key);
    }
    let mut unreplicated = Vec::new();
    for key in &keys {
        unreplicated.push(
            event_of_key(&primary.url_of(&db), key)
                .await
                .expect("an event"),
        );
    }
    primary.crash();
    standby.start_server().await;
    standby.promote();
    let _new_standby = standby.start_standby("s1").await;
    let mut lost = 0;
    for key in &keys {
        if event_of_key(&standby.url_of(&db), key).await.is_none() {
            lost += 1;
        }
    }
    println!(
        "acknowledged charges lost in the asynchronous failover: {lost} of {}",
        keys.len()
    );
    // A charge after the failover proves the relay publishes from the new primary.
    let after = new_key();
    assert_eq!(
        charge_until_answered(&api, &after).await.0,
        StatusCode::CREATED
    );
    let published = event_of_key(&standby.url_of(&db), &after)
        .await
        .expect("its event");
    wait_published(&standby.url_of(&db), published).await;
    relay.stop().await;
    let mut reader = kafka.reader();
    read_to_end(&kafka, &mut reader).await;
    for (key, event) in keys.iter().zip(&unreplicated) {
        let on_new_primary = event_of_key(&standby.url_of(&db), key).await.is_some();
        if !on_new_primary {
            assert!(
                reader.with_id(&event.to_string()).is_empty(),
                "a lost charge's event was published"
            );
        }
    }
    assert_eq!(reader.with_id(&published.to_string()).len(), 1);
}

/// The primary crashes (`pg_ctl stop -m immediate`) while eight clients charge; the
/// synchronous standby is promoted and given a standby of its own. `/readyz` says when
/// no server takes writes, and when one does again; every charge answered 201 is on the
/// new primary, every event on the topic is one the new primary has, every
/// event the new primary has is published, and neither the API nor the relays were
/// restarted.
#[tokio::test]
async fn a_crash_failover_under_load_loses_nothing_acknowledged_and_publishes_no_ghost() {
    let (primary, standby, db, url) = synchronous_pair().await;
    let kafka = TestKafka::new(3).await;
    let api = TestApi::start_at(&url, &[]).await;
    let relay_args = ["--database-url", url.as_str(), "--wait-for-standbys", "s1"];
    let (mut relay_1, _) = start_relay(&db, &kafka, &relay_args).await;
    let (mut relay_2, _) = start_relay(&db, &kafka, &relay_args).await;

    let failover = async {
        db.wait_for(
            "SELECT count(*) >= 40 FROM charges",
            &[],
            "the load is under way",
        )
        .await;
        primary.crash();
        // No writable server: the API says it is not ready, rather than half-serve.
        poll_until(
            "/readyz answers 503 without a writable primary",
            async || {
                (api.get("/readyz").await.status() == StatusCode::SERVICE_UNAVAILABLE).then_some(())
            },
        )
        .await;
        standby.promote();
        poll_until("/readyz answers 200 on the new primary", async || {
            (api.get("/readyz").await.status() == StatusCode::OK).then_some(())
        })
        .await;
        standby.start_standby("s1").await
    };
    let (acknowledged, _new_standby) = tokio::join!(
        futures::future::join_all((0..8).map(|_| client_charges(&api, 25))),
        failover
    );
    let acknowledged: Vec<String> = acknowledged.concat();
    assert_acknowledged_kept(&standby.url_of(&db), &acknowledged).await;
    wait_until_all_published(&standby.url_of(&db)).await;
    relay_1.stop().await;
    relay_2.stop().await;
    let published = assert_topic_matches_outbox(&standby.url_of(&db), &kafka).await;
    println!(
        "crash failover: {} charges acknowledged, {published} events published, none lost",
        acknowledged.len()
    );
}

//! `IdempotencyStore` on its own, against a real database: the scope of a key is
//! `(key, endpoint)`, and what an operation returns is what gets replayed.

use std::time::Duration;

use charges_domain::{Charge, Fingerprint, IdempotencyKey};
use charges_store::{
    ChargeStore, Client, CompletedKey, IdempotencyStore, IdempotentOperation, IdempotentOutcome,
    KeyCompletion, KeyToComplete, NewCharge, OneStatementOperation, Origin, Row, StoreError,
    StoredResponse, Transaction,
};
use charges_tests::{TestDb, new_key};
use chrono::{DateTime, Utc};
use tokio_postgres::error::SqlState;
use uuid::Uuid;

/// An operation that writes nothing but its response: enough to exercise the scope.
struct Echo(&'static str);

impl IdempotentOperation for Echo {
    type Error = StoreError;

    fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of("echo", &[("body", self.0)])
    }

    async fn execute(
        &self,
        _tx: &Transaction<'_>,
        now: DateTime<Utc>,
        completion: KeyCompletion<'_>,
    ) -> Result<CompletedKey, StoreError> {
        completion
            .store(StoredResponse {
                status: 201,
                headers: vec![(
                    "location".into(),
                    format!("/echo/{}", now.timestamp_micros()),
                )],
                body: self.0.to_owned(),
            })
            .await
    }
}

/// Writes a row of `probe` and completes its key in the same round trip; with
/// `fail`, the write breaks a constraint.
struct PipelinedWrite {
    fail: bool,
}

impl IdempotentOperation for PipelinedWrite {
    type Error = StoreError;

    fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of("pipelined", &[])
    }

    async fn execute(
        &self,
        tx: &Transaction<'_>,
        _now: DateTime<Utc>,
        completion: KeyCompletion<'_>,
    ) -> Result<CompletedKey, StoreError> {
        let value: i32 = if self.fail { -1 } else { 1 };
        let write = async {
            tx.execute("INSERT INTO probe (value) VALUES ($1)", &[&value])
                .await
                .map(|_| ())
                .map_err(StoreError::from)
        };
        let response = StoredResponse {
            status: 201,
            headers: vec![],
            body: "written".into(),
        };
        completion.store_with(write, response).await
    }
}

/// Two `COMPLETED` keys of `/charges` with the body "done" under `fingerprint`, one
/// valid for an hour and one expired, and a session holding the lock RESERVE (and
/// `idempotency_key_claim`) takes for each, as another request would.
async fn completed_keys_locked_by_another(
    db: &TestDb,
    fingerprint: &Fingerprint,
) -> (IdempotencyKey, IdempotencyKey, tokio_postgres::Client) {
    let valid = IdempotencyKey::parse(new_key().as_bytes()).unwrap();
    let expired = IdempotencyKey::parse(new_key().as_bytes()).unwrap();
    for (key, expires_in_secs) in [(&valid, 3600.0), (&expired, -1.0)] {
        db.client()
            .execute(
                "INSERT INTO idempotency_keys (key, endpoint, request_hash, status,
                                               response_status, response_headers,
                                               response_body, created_at, expires_at)
                 VALUES ($1, '/charges', $2, 'COMPLETED', 201, '[]', 'done',
                         now() - interval '1 hour',
                         now() + $3::float8 * interval '1 second')",
                &[&key.to_string(), &fingerprint.as_str(), &expires_in_secs],
            )
            .await
            .unwrap();
    }
    let holder = db.session().await;
    let lock = "SELECT pg_advisory_lock(hashtextextended('/charges' || ' ' || $1, 0))";
    for key in [&valid, &expired] {
        holder.query_one(lock, &[&key.to_string()]).await.unwrap();
    }
    (valid, expired, holder)
}

/// A session inside a transaction that has written `key`'s `COMPLETED` row with the
/// body "won" under `fingerprint`, not yet committed, without the key's lock: the
/// winner of a race the test then lets commit.
async fn uncommitted_winner(
    db: &TestDb,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> tokio_postgres::Client {
    let winner = db.session().await;
    winner.batch_execute("BEGIN").await.unwrap();
    winner
        .execute(
            "INSERT INTO idempotency_keys (key, endpoint, request_hash, status,
                                           response_status, response_headers, response_body,
                                           expires_at)
             VALUES ($1, '/charges', $2, 'COMPLETED', 201, '[]', 'won',
                     now() + interval '1 hour')",
            &[&key.to_string(), &fingerprint.as_str()],
        )
        .await
        .unwrap();
    winner
}

/// Contract line 2: uniqueness is per (key, endpoint), not global.
#[tokio::test]
async fn one_key_on_two_endpoints_is_two_operations() {
    let db = TestDb::new().await;
    let pool = charges_store::connect(&db.url, &Default::default())
        .await
        .unwrap();
    let store = IdempotencyStore::new(Duration::from_secs(60));
    let key = IdempotencyKey::parse(new_key().as_bytes()).unwrap();

    let a = store
        .run(&pool, &key, "/charges", &Echo("a"))
        .await
        .unwrap();
    let b = store
        .run(&pool, &key, "/charges/1/refunds", &Echo("b"))
        .await
        .unwrap();
    assert!(
        matches!(a, IdempotentOutcome::Executed(ref r) if r.body == "a"),
        "{a:?}"
    );
    assert!(
        matches!(b, IdempotentOutcome::Executed(ref r) if r.body == "b"),
        "{b:?}"
    );

    let replay_a = store
        .run(&pool, &key, "/charges", &Echo("a"))
        .await
        .unwrap();
    assert_eq!(
        replay_a,
        IdempotentOutcome::Replayed(match a {
            IdempotentOutcome::Executed(r) => r,
            _ => unreachable!(),
        })
    );
    let conflict = store
        .run(&pool, &key, "/charges/1/refunds", &Echo("a"))
        .await
        .unwrap();
    assert_eq!(conflict, IdempotentOutcome::PayloadConflict);
    assert_eq!(db.count("idempotency_keys").await, 2);
}

/// Two retries of one finished request arriving together: the one that finds the key's
/// lock taken by the other still gets the stored response (or `PayloadConflict` for
/// another body), not `InFlight`, since nothing can change a completed, unexpired key.
/// An expired key is what the lock's holder may be reserving again: that one is in
/// flight, and after the holder is gone it runs anew.
#[tokio::test]
async fn a_completed_key_is_replayed_while_another_request_holds_its_lock() {
    let db = TestDb::new().await;
    let pool = charges_store::connect(&db.url, &Default::default())
        .await
        .unwrap();
    let store = IdempotencyStore::with_replay_cache(Duration::from_secs(60), 0);
    let done = Echo("done");
    let (valid, expired, holder) = completed_keys_locked_by_another(&db, &done.fingerprint()).await;

    let replayed = store.run(&pool, &valid, "/charges", &done).await.unwrap();
    assert_eq!(
        replayed,
        IdempotentOutcome::Replayed(StoredResponse {
            status: 201,
            headers: vec![],
            body: "done".into(),
        })
    );
    let other_body = store
        .run(&pool, &valid, "/charges", &Echo("other"))
        .await
        .unwrap();
    assert_eq!(other_body, IdempotentOutcome::PayloadConflict);
    // Also proves the lock above is the one RESERVE takes: free, this key would run.
    let busy = store.run(&pool, &expired, "/charges", &done).await.unwrap();
    assert_eq!(busy, IdempotentOutcome::InFlight);

    holder
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .await
        .unwrap();
    let rerun = store.run(&pool, &expired, "/charges", &done).await.unwrap();
    assert!(
        matches!(rerun, IdempotentOutcome::Executed(ref r) if r.body == "done"),
        "{rerun:?}"
    );
    assert_eq!(db.count("idempotency_keys").await, 2);
}

/// READ COMMITTED takes the reservation statement's snapshot before its advisory lock is
/// granted, so a winner that commits in between is not seen by the statement's read of
/// the row (found by `make soak` as a rare 503). The operation then runs, its key's
/// insert meets the winner's row, and the request must roll its writes back and get the
/// winner's stored response.
///
/// The interleaving is forced, not hoped for: in this test's database only,
/// `pg_try_advisory_xact_lock` resolves first to a wrapper that waits on a lock the test
/// holds, so the reservation statement is parked after its snapshot and before its lock.
#[tokio::test]
async fn a_winner_committing_between_snapshot_and_lock_is_replayed() {
    let db = TestDb::new().await;
    let barrier: i64 = 7_700_417;
    db.client()
        .batch_execute(&format!(
            "CREATE TABLE probe (value int CHECK (value > 0));
             CREATE FUNCTION public.pg_try_advisory_xact_lock(bigint) RETURNS boolean
               LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM pg_catalog.pg_advisory_lock_shared({barrier});
                 PERFORM pg_catalog.pg_advisory_unlock_shared({barrier});
                 RETURN pg_catalog.pg_try_advisory_xact_lock($1);
             END $$;
             ALTER DATABASE {} SET search_path = public, pg_catalog;",
            db.name
        ))
        .await
        .unwrap();
    let pool = charges_store::connect(&db.url, &Default::default())
        .await
        .unwrap();
    let store = IdempotencyStore::with_replay_cache(Duration::from_secs(60), 0);
    let key = IdempotencyKey::parse(new_key().as_bytes()).unwrap();
    let operation = PipelinedWrite { fail: false };

    // The winner's row, written but not yet committed.
    let holder = db.session().await;
    holder
        .query_one("SELECT pg_advisory_lock($1)", &[&barrier])
        .await
        .unwrap();
    let winner = uncommitted_winner(&db, &key, &operation.fingerprint()).await;

    let request = tokio::spawn(async move { store.run(&pool, &key, "/charges", &operation).await });
    // Parked on the barrier: its snapshot is taken and does not hold the winner's row.
    db.wait_for(
        "SELECT count(*) > 0 FROM pg_locks
          WHERE locktype = 'advisory' AND NOT granted AND objid = $1::bigint::oid",
        &[&barrier],
        "the reservation reached the barrier",
    )
    .await;
    winner.batch_execute("COMMIT").await.unwrap();
    holder
        .query_one("SELECT pg_advisory_unlock($1)", &[&barrier])
        .await
        .unwrap();

    let outcome = request.await.unwrap().unwrap();
    assert_eq!(
        outcome,
        IdempotentOutcome::Replayed(StoredResponse {
            status: 201,
            headers: vec![],
            body: "won".into(),
        })
    );
    assert_eq!(db.count("idempotency_keys").await, 1);
    assert_eq!(
        db.count("probe").await,
        0,
        "the losing attempt's write is rolled back"
    );
}

/// A write that fails while the key's completion travels with it in one round trip
/// rolls the completion back too: the request is forgotten, nothing of it is stored,
/// and the same key then runs the operation once.
#[tokio::test]
async fn a_failed_write_sent_with_the_completion_leaves_the_key_free() {
    let db = TestDb::new().await;
    db.client()
        .batch_execute("CREATE TABLE probe (value int CHECK (value > 0))")
        .await
        .unwrap();
    let pool = charges_store::connect(&db.url, &Default::default())
        .await
        .unwrap();
    let store = IdempotencyStore::new(Duration::from_secs(60));
    let key = IdempotencyKey::parse(new_key().as_bytes()).unwrap();

    let failed = store
        .run(&pool, &key, "/probe", &PipelinedWrite { fail: true })
        .await;
    let error = failed.expect_err("the write breaks the CHECK");
    // The write's own error, not the aborted transaction the completion then met.
    let code = match &error {
        StoreError::Database(e) => e.code().cloned(),
        other => panic!("{other:?}"),
    };
    assert_eq!(code, Some(SqlState::CHECK_VIOLATION), "{error:?}");
    assert!(!error.is_unavailable(), "a broken write is not an outage");
    assert_eq!(db.count("idempotency_keys").await, 0);
    assert_eq!(db.count("probe").await, 0);

    let executed = store
        .run(&pool, &key, "/probe", &PipelinedWrite { fail: false })
        .await
        .unwrap();
    assert!(
        matches!(executed, IdempotentOutcome::Executed(ref r) if r.body == "written"),
        "{executed:?}"
    );
    let completed: i64 = db
        .client()
        .query_one(
            "SELECT count(*) FROM idempotency_keys WHERE status = 'COMPLETED'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!((completed, db.count("probe").await), (1, 1));
}

/// A new charge run whole in one statement (`charges_create_idempotent`), as `POST
/// /charges` runs it, with a body of its own.
struct ChargeOnce {
    charge: Charge,
    event_id: Uuid,
    origin: Origin,
    response: StoredResponse,
}

impl ChargeOnce {
    fn new(body: &str) -> ChargeOnce {
        ChargeOnce {
            charge: Charge {
                id: Uuid::now_v7(),
                amount_cents: 4900,
                currency: "EUR".into(),
                created_at: Utc::now(),
            },
            event_id: Uuid::now_v7(),
            origin: Origin::default(),
            response: StoredResponse {
                status: 201,
                headers: vec![("location".into(), "/charges/x".into())],
                body: body.to_owned(),
            },
        }
    }
}

impl OneStatementOperation for ChargeOnce {
    fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of("charge-once", &[("body", &self.response.body)])
    }

    fn response(&self) -> &StoredResponse {
        &self.response
    }

    async fn call(&self, client: &Client, key: &KeyToComplete<'_>) -> Result<Row, StoreError> {
        let new = NewCharge {
            charge: &self.charge,
            owner: None,
            event_id: self.event_id,
            event_data: "{}",
            origin: &self.origin,
        };
        ChargeStore::create_once(client, key, &new, &self.response).await
    }
}

/// The one statement writes the key, the charge and its event, or nothing: a replay and
/// a conflicting body write nothing more.
#[tokio::test]
async fn one_statement_writes_the_key_the_charge_and_its_event_once() {
    let db = TestDb::new().await;
    let pool = charges_store::connect(&db.url, &Default::default())
        .await
        .unwrap();
    let store = IdempotencyStore::with_replay_cache(Duration::from_secs(60), 0);
    let key = IdempotencyKey::parse(new_key().as_bytes()).unwrap();
    let first = ChargeOnce::new("first");

    let executed = store
        .run_one_statement(&pool, &key, "/charges", &first)
        .await
        .unwrap();
    assert_eq!(
        executed,
        IdempotentOutcome::Executed(first.response.clone())
    );
    let replayed = store
        .run_one_statement(&pool, &key, "/charges", &ChargeOnce::new("first"))
        .await
        .unwrap();
    assert_eq!(
        replayed,
        IdempotentOutcome::Replayed(first.response.clone())
    );
    let conflict = store
        .run_one_statement(&pool, &key, "/charges", &ChargeOnce::new("other"))
        .await
        .unwrap();
    assert_eq!(conflict, IdempotentOutcome::PayloadConflict);
    for table in ["idempotency_keys", "charges", "outbox"] {
        assert_eq!(db.count(table).await, 1, "{table}");
    }
    let event_of_the_charge: bool = db
        .client()
        .query_one(
            "SELECT aggregate_id = $1 AND id = $2 AND sequence = 1 FROM outbox",
            &[&first.charge.id, &first.event_id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(event_of_the_charge);
}

/// As `a_completed_key_is_replayed_while_another_request_holds_its_lock`, for the one
/// statement: the same lock, the same answers.
#[tokio::test]
async fn one_statement_answers_like_the_transaction_while_another_request_holds_the_lock() {
    let db = TestDb::new().await;
    let pool = charges_store::connect(&db.url, &Default::default())
        .await
        .unwrap();
    let store = IdempotencyStore::with_replay_cache(Duration::from_secs(60), 0);
    let done = ChargeOnce::new("done");
    let (valid, expired, holder) = completed_keys_locked_by_another(&db, &done.fingerprint()).await;

    let replayed = store
        .run_one_statement(&pool, &valid, "/charges", &done)
        .await
        .unwrap();
    let stored = StoredResponse {
        status: 201,
        headers: vec![],
        body: "done".into(),
    };
    assert_eq!(replayed, IdempotentOutcome::Replayed(stored));
    let other_body = store
        .run_one_statement(&pool, &valid, "/charges", &ChargeOnce::new("other"))
        .await
        .unwrap();
    assert_eq!(other_body, IdempotentOutcome::PayloadConflict);
    let busy = store
        .run_one_statement(&pool, &expired, "/charges", &done)
        .await
        .unwrap();
    assert_eq!(busy, IdempotentOutcome::InFlight);
    assert_eq!(db.count("charges").await, 0);

    holder
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .await
        .unwrap();
    let rerun = store
        .run_one_statement(&pool, &expired, "/charges", &done)
        .await
        .unwrap();
    assert_eq!(rerun, IdempotentOutcome::Executed(done.response.clone()));
    assert_eq!(db.count("idempotency_keys").await, 2);
    assert_eq!(db.count("charges").await, 1);
    assert_eq!(db.count("outbox").await, 1);
}

/// A key row committed under the statement's insert by a writer that never took the
/// key's lock (a hand-written row, an older build): the insert finds it taken, the
/// statement writes no charge and no event, and the store's next attempt replays it.
#[tokio::test]
async fn one_statement_whose_key_is_taken_under_its_insert_writes_nothing_and_replays() {
    let db = TestDb::new().await;
    let pool = charges_store::connect(&db.url, &Default::default())
        .await
        .unwrap();
    let store = IdempotencyStore::with_replay_cache(Duration::from_secs(60), 0);
    let key = IdempotencyKey::parse(new_key().as_bytes()).unwrap();
    let operation = ChargeOnce::new("mine");

    let winner = uncommitted_winner(&db, &key, &operation.fingerprint()).await;
    let request = tokio::spawn(async move {
        store
            .run_one_statement(&pool, &key, "/charges", &operation)
            .await
    });
    // The statement read no row (the winner's is not committed) and its insert now
    // waits for the winner's transaction.
    db.wait_for(
        "SELECT count(*) > 0 FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'
            AND query LIKE '%charges_create_idempotent%'",
        &[],
        "the key's insert waits on the uncommitted row",
    )
    .await;
    winner.batch_execute("COMMIT").await.unwrap();

    let outcome = request.await.unwrap().unwrap();
    assert_eq!(
        outcome,
        IdempotentOutcome::Replayed(StoredResponse {
            status: 201,
            headers: vec![],
            body: "won".into(),
        })
    );
    assert_eq!(db.count("idempotency_keys").await, 1);
    assert_eq!(
        db.count("charges").await,
        0,
        "the taken attempt wrote no charge"
    );
    assert_eq!(db.count("outbox").await, 0, "and no event");
}

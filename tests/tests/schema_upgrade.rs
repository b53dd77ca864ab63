//! Each mechanism owns its schema (pg-idempotency's, pg-outbox's and the charges
//! service's sets of migrations, each with its own history), and a database created
//! before the split upgrades in place: nothing re-run, nothing lost, its keys replayed
//! byte for byte, its pending events published, and its schema then the same as a new
//! database's.

use std::collections::BTreeSet;

use charges_store::migrations::BEFORE_SPLIT;
use charges_tests::kafka::{TestKafka, read_to_end};
use charges_tests::{DEADLINE, Process, TestApi, TestDb, new_key, start_relay};
use uuid::Uuid;

/// The schema the charges service had at the release that filed the split.
const BEFORE_SPLIT_VERSION: i32 = 13;

/// What a client sent and got back.
struct Answered {
    key: String,
    /// The refunded charge's id, for a refund.
    refund_of: Option<String>,
    body: String,
    location: String,
    response: String,
}

/// The rows an upgrade must leave alone, each table as one text.
async fn table_contents(db: &TestDb) -> Vec<String> {
    let mut contents = Vec::new();
    for (table, order) in [
        ("idempotency_keys", "key, endpoint"),
        ("charges", "id"),
        ("refunds", "id"),
        ("outbox", "id"),
    ] {
        let sql = format!(
            "SELECT coalesce(string_agg(t::text, E'\\n' ORDER BY {order}), '') FROM {table} t"
        );
        contents.push(db.client().query_one(&sql, &[]).await.unwrap().get(0));
    }
    contents
}

async fn history(db: &TestDb, table: &str) -> Vec<(i32, String, String)> {
    let sql = format!("SELECT version, applied_on, checksum FROM {table} ORDER BY version");
    db.client()
        .query(&sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

/// `POST /charges`, or `POST /charges/{path}/refunds` for a refund of charge `path`.
async fn post(api: &TestApi, refund_of: Option<&str>, key: &str, body: &str) -> reqwest::Response {
    match refund_of {
        None => api.post_charge(Some(key), body).await,
        Some(charge_id) => api.post_refund(charge_id, key, body).await,
    }
}

/// Charges and a refund through the API on the old schema.
async fn answered_before_the_upgrade(api: &TestApi) -> Vec<Answered> {
    let mut answered = Vec::new();
    for amount in [1200, 3400, 5600] {
        let (key, body) = (new_key(), format!(r#"{{"amountCents":{amount}}}"#));
        answered.push(answer(api, None, key, body).await);
    }
    let charge_id = answered[0].location.rsplit('/').next().map(str::to_owned);
    let refund = answer(api, charge_id, new_key(), r#"{"amountCents":200}"#.into()).await;
    answered.push(refund);
    answered
}

async fn answer(api: &TestApi, refund_of: Option<String>, key: String, body: String) -> Answered {
    let response = post(api, refund_of.as_deref(), &key, &body).await;
    let status = response.status().as_u16();
    assert_eq!(status, 201, "{refund_of:?} before the upgrade");
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    Answered {
        key,
        refund_of,
        body,
        location,
        response: response.text().await.unwrap(),
    }
}

#[tokio::test]
async fn a_database_from_before_the_split_upgrades_in_place() {
    let db = TestDb::unmigrated().await;
    let mut client = charges_tests::connect(&db.url).await;
    BEFORE_SPLIT
        .runner()
        .set_target(refinery::Target::Version(BEFORE_SPLIT_VERSION))
        .run_async(&mut client)
        .await
        .expect("the old migrations");

    let mut api = TestApi::start(&db, &[]).await;
    let answered = answered_before_the_upgrade(&api).await;
    api.process.stop().await;
    // One event a relay of the old release already published; the rest are pending.
    let published: Uuid = db
        .client()
        .query_one(
            "UPDATE outbox SET published_at = now()
              WHERE id = (SELECT id FROM outbox ORDER BY created_at LIMIT 1) RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let before = table_contents(&db).await;
    let old_history = history(&db, "refinery_schema_history").await;
    assert_eq!(old_history.len(), BEFORE_SPLIT_VERSION as usize);

    let mut migrate = Process::start(
        "charges-api",
        &["--database-url", &db.url, "migrate"],
        &[],
        "migrations up to date",
    )
    .await
    .0;
    assert!(migrate.wait().await.success(), "{}", migrate.output_text());

    // Nothing re-run: the old history kept its rows and gained only what it lacked;
    // each set adopted its tables in its V1 and applied each later version once.
    let upgraded = history(&db, "refinery_schema_history").await;
    assert_eq!(upgraded[..old_history.len()], old_history[..]);
    assert_eq!(
        upgraded.last().map(|row| row.0),
        BEFORE_SPLIT.expected_version()
    );
    for set in charges_store::migrations::sets()
        .iter()
        .filter(|set| !set.upgrade_only)
    {
        let versions = history(&db, set.history_table).await;
        let applied: Vec<i32> = versions.iter().map(|row| row.0).collect();
        let expected: Vec<i32> = (1..=set.expected_version().unwrap_or(0)).collect();
        assert_eq!(applied, expected, "{}: {versions:?}", set.name);
    }
    assert_eq!(
        table_contents(&db).await,
        before,
        "the upgrade changed rows"
    );

    // The same schema as a database that never had the old layout.
    let fresh = TestDb::new().await;
    assert_eq!(
        db.schema_dump(&["refinery_schema_history"]),
        fresh.schema_dump(&[]),
        "an upgraded database differs from a new one"
    );

    replays_and_publishes(&db, &answered, published).await;
}

/// On the upgraded database: every stored key replays byte for byte, a new charge is
/// created, and a relay publishes exactly the events no relay had published.
async fn replays_and_publishes(db: &TestDb, answered: &[Answered], published: Uuid) {
    let api = TestApi::start(db, &[]).await;
    for old in answered {
        let response = post(&api, old.refund_of.as_deref(), &old.key, &old.body).await;
        assert_eq!(
            response.status().as_u16(),
            201,
            "replay of {:?}",
            old.location
        );
        assert_eq!(response.headers()["idempotent-replayed"], "true");
        assert_eq!(response.headers()["location"], old.location.as_str());
        assert_eq!(response.text().await.unwrap(), old.response);
    }
    let created = post(&api, None, &new_key(), r#"{"amountCents":700}"#).await;
    assert_eq!(
        created.status().as_u16(),
        201,
        "a new charge after the upgrade"
    );

    let pending: BTreeSet<String> = db
        .client()
        .query(
            "SELECT id::text FROM outbox WHERE published_at IS NULL",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        pending.len(),
        answered.len(),
        "three old events and the new one"
    );
    let kafka = TestKafka::new(1).await;
    let (mut relay, _) = start_relay(db, &kafka, &[]).await;
    db.wait_for(
        "SELECT count(*) = 0 FROM outbox WHERE published_at IS NULL",
        &[],
        "every pending event is published",
    )
    .await;
    relay.stop().await;
    let mut reader = kafka.reader();
    reader
        .read_until(DEADLINE, "the pending events", |m| m.len() >= pending.len())
        .await;
    read_to_end(&kafka, &mut reader).await;
    let sent: BTreeSet<String> = reader
        .messages
        .iter()
        .filter_map(|m| m.header("id").map(str::to_owned))
        .collect();
    assert_eq!(
        sent, pending,
        "published: exactly the events no relay had sent"
    );
    assert!(!sent.contains(&published.to_string()));
}

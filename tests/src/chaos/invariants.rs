//! The invariant checker every scenario ends with (see the module documentation of
//! [`crate::chaos`]), in named steps that each add what they find to `violations`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::ledger::Ledger;
use crate::kafka::{TestKafka, TopicReader};
use crate::{TestDb, poll_within, start_relay};

/// How long the checker waits for the relay to drain and the topic to show everything.
const DRAIN_LIMIT: Duration = Duration::from_secs(90);

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

const PENDING: &str = "SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_at IS NULL";

pub async fn scalar(db: &TestDb, sql: &str) -> i64 {
    db.client()
        .query_one(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get(0)
}

async fn ids(db: &TestDb, sql: &str) -> BTreeSet<String> {
    db.client()
        .query(sql, &[])
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Checks every invariant, prints the scenario's figures (one `CHAOS …` line), and
/// fails the test on any violation. With `relay_running` false a relay is started to
/// drain the outbox; with true the scenario's own relays must do it (that is how
/// recovery is checked).
pub async fn check_invariants(
    scenario: &str,
    faults: &str,
    db: &TestDb,
    kafka: &TestKafka,
    ledger: &Ledger,
    relay_running: bool,
) {
    let mut violations = std::mem::take(&mut ledger.lock().violations);
    check_the_database(db, &mut violations).await;
    check_the_clients_against_the_database(db, ledger, &mut violations).await;
    let _relay = if relay_running {
        None
    } else {
        Some(start_relay(db, kafka, &[]).await)
    };
    wait_for_the_outbox_to_drain(db, &mut violations).await;
    let outbox = check_the_outbox_rows(db, &mut violations).await;
    let topic = check_the_topic(kafka, &outbox, &mut violations).await;
    report(scenario, faults, db, ledger, &outbox, &topic, &violations).await;
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

/// `count_sql` counts rows that must not exist: any is a violation, "<n> `what`".
async fn expect_none(db: &TestDb, count_sql: &str, what: &str, violations: &mut Vec<String>) {
    let found = scalar(db, count_sql).await;
    if found > 0 {
        violations.push(format!("{found} {what}"));
    }
}

/// Charges, outbox rows and keys agree with each other.
async fn check_the_database(db: &TestDb, violations: &mut Vec<String>) {
    expect_none(
        db,
        CHARGES_WITHOUT_ONE_OUTBOX_ROW,
        "charges without exactly one outbox row",
        violations,
    )
    .await;
    expect_none(
        db,
        "SELECT count(*) FROM idempotency_keys WHERE status = 'STARTED'",
        "committed STARTED keys",
        violations,
    )
    .await;
    expect_none(
        db,
        CHARGES_NOT_NAMED_BY_ONE_KEY,
        "charges (or keys) not in a one-to-one match of key and charge",
        violations,
    )
    .await;
}

/// Every key's 201s named one charge, the one the database stored for the key, and
/// each key was executed at most once.
async fn check_the_clients_against_the_database(
    db: &TestDb,
    ledger: &Ledger,
    violations: &mut Vec<String>,
) {
    let stored: BTreeMap<String, String> = db
        .client()
        .query(KEY_CHARGES, &[])
        .await
        .expect("read keys")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
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

/// Every outbox row ends published or dead, within [`DRAIN_LIMIT`].
async fn wait_for_the_outbox_to_drain(db: &TestDb, violations: &mut Vec<String>) {
    let drained = poll_within(DRAIN_LIMIT, async || {
        (scalar(db, PENDING).await == 0).then_some(())
    })
    .await;
    if drained.is_none() {
        violations.push(format!(
            "{} outbox rows still pending after {DRAIN_LIMIT:?}",
            scalar(db, PENDING).await
        ));
    }
}

/// The outbox once drained.
struct Outbox {
    published: BTreeSet<String>,
    all_rows: BTreeSet<String>,
    dead: i64,
}

/// Dead rows say why.
async fn check_the_outbox_rows(db: &TestDb, violations: &mut Vec<String>) -> Outbox {
    let dead = scalar(db, "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL").await;
    expect_none(
        db,
        "SELECT count(*) FROM outbox WHERE dead_at IS NOT NULL AND coalesce(last_error, '') = ''",
        "dead rows without a reason",
        violations,
    )
    .await;
    Outbox {
        published: ids(
            db,
            "SELECT id::text FROM outbox WHERE published_at IS NOT NULL",
        )
        .await,
        all_rows: ids(db, "SELECT id::text FROM outbox").await,
        dead,
    }
}

/// What the topic held.
struct Topic {
    reader: TopicReader,
    seen: BTreeSet<String>,
}

fn event_ids(reader: &TopicReader) -> BTreeSet<String> {
    reader
        .messages
        .iter()
        .filter_map(|m| m.header("id").map(str::to_owned))
        .collect()
}

/// Every published row is on the topic (within [`DRAIN_LIMIT`]), every event on the
/// topic has its row, and each message's payload names its header `id`.
async fn check_the_topic(
    kafka: &TestKafka,
    outbox: &Outbox,
    violations: &mut Vec<String>,
) -> Topic {
    let mut reader = kafka.reader();
    let all_seen = poll_within(DRAIN_LIMIT, async || {
        reader.drain();
        outbox
            .published
            .is_subset(&event_ids(&reader))
            .then_some(())
    })
    .await;
    let seen = event_ids(&reader);
    if all_seen.is_none() {
        violations.push(format!(
            "{} published outbox rows never seen on the topic",
            outbox.published.difference(&seen).count()
        ));
    }
    let unknown = seen.difference(&outbox.all_rows).count();
    if unknown > 0 {
        violations.push(format!("{unknown} events on the topic with no outbox row"));
    }
    let mismatched = reader
        .messages
        .iter()
        .filter(|message| {
            let event_id = message
                .payload
                .as_deref()
                .and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok())
                .and_then(|v| v["eventId"].as_str().map(str::to_owned));
            event_id.as_deref() != message.header("id")
        })
        .count();
    if mismatched > 0 {
        violations.push(format!(
            "{mismatched} messages whose payload eventId is not their header id"
        ));
    }
    Topic { reader, seen }
}

/// The scenario's `CHAOS …` line.
async fn report(
    scenario: &str,
    faults: &str,
    db: &TestDb,
    ledger: &Ledger,
    outbox: &Outbox,
    topic: &Topic,
    violations: &[String],
) {
    let charges = db.count("charges").await;
    let state = ledger.lock();
    let statuses: Vec<String> = state
        .statuses
        .iter()
        .map(|(status, n)| format!("{status}×{n}"))
        .collect();
    let messages = topic.reader.messages.len();
    eprintln!(
        "CHAOS {scenario}: faults: {faults}; answers {} [{}], connection errors {}; \
         keys with a 201 {}; charges {charges}, outbox rows {} (dead {}); topic \
         messages {messages}, distinct event ids {} (redeliveries {}); invariant violations: {}",
        state.answers,
        statuses.join(" "),
        state.connection_errors,
        state.charges_by_key.len(),
        outbox.all_rows.len(),
        outbox.dead,
        topic.seen.len(),
        messages.saturating_sub(topic.seen.len()),
        violations.len(),
    );
}

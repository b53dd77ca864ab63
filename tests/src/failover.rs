//! What the failover tests share: clients that retry through a promotion, and the
//! checks of what must hold on the new primary and on the topic afterwards. Used with
//! the hand-made clusters of [`crate::cluster`] and with Patroni ([`crate::patroni`]).

use std::collections::BTreeSet;

use reqwest::StatusCode;
use uuid::Uuid;

use crate::kafka::{TestKafka, read_to_end};
use crate::{TestApi, new_key, poll_until};

/// A charge, retried with its key while the answer is a 503 (what a client does during
/// a failover); returns the final answer's status and whether it was a replay.
pub async fn charge_until_answered(api: &TestApi, key: &str) -> (StatusCode, bool) {
    poll_until("an answer other than 503", async || {
        let response = api.post_charge(Some(key), r#"{"amountCents":4900}"#).await;
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        (status != StatusCode::SERVICE_UNAVAILABLE).then_some((status, replayed))
    })
    .await
}

/// One client's charges under load: each key retried while the answer is a 503 (the
/// failover in progress); returns the keys answered 201.
pub async fn client_charges(api: &TestApi, charges: usize) -> Vec<String> {
    let mut acknowledged = Vec::new();
    for _ in 0..charges {
        let key = new_key();
        let (status, _) = charge_until_answered(api, &key).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "only 201 or 503 under a failover"
        );
        acknowledged.push(key);
    }
    acknowledged
}

/// The outbox id of `key`'s charge on the server `url` points at, if it has one.
pub async fn event_of_key(url: &str, key: &str) -> Option<Uuid> {
    crate::connect(url)
        .await
        .query_opt(
            "SELECT o.id FROM outbox o
               JOIN idempotency_keys k ON k.key = $1
              WHERE o.aggregate_id = (k.response_body::jsonb ->> 'id')::uuid",
            &[&key],
        )
        .await
        .expect("look up the key's event")
        .map(|row| row.get(0))
}

/// Every key answered 201 has its charge and its event on the new primary at `url`.
pub async fn assert_acknowledged_kept(url: &str, acknowledged: &[String]) {
    let mut missing = Vec::new();
    for key in acknowledged {
        if event_of_key(url, key).await.is_none() {
            missing.push(key.clone());
        }
    }
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
}

/// Waits until every outbox row on the new primary at `url` is published.
pub async fn wait_until_all_published(url: &str) {
    let new_primary = crate::connect(url).await;
    poll_until("every event on the new primary is published", async || {
        let pending: i64 = new_primary
            .query_one(
                "SELECT count(*) FROM outbox WHERE published_at IS NULL",
                &[],
            )
            .await
            .ok()?
            .get(0);
        (pending == 0).then_some(())
    })
    .await;
}

/// Once no relay runs any more: the topic holds every event of the new primary's outbox
/// at `url` and no other (no ghost: an event for a commit the new primary lacks).
/// Returns the number of distinct events published.
pub async fn assert_topic_matches_outbox(url: &str, kafka: &TestKafka) -> usize {
    let events: BTreeSet<String> = crate::connect(url)
        .await
        .query("SELECT id::text FROM outbox", &[])
        .await
        .expect("the new primary's outbox")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut reader = kafka.reader();
    read_to_end(kafka, &mut reader).await;
    let published: BTreeSet<String> = reader
        .messages
        .iter()
        .filter_map(|m| m.header("id").map(str::to_owned))
        .collect();
    let ghosts: Vec<&String> = published.difference(&events).collect();
    assert!(
        ghosts.is_empty(),
        "events for commits the new primary lacks: {ghosts:?}"
    );
    assert!(
        events.is_subset(&published),
        "an event of the new primary was never published"
    );
    published.len()
}

/// Waits until the outbox row `id` on the server `url` points at is published.
pub async fn wait_published(url: &str, id: Uuid) {
    let client = crate::connect(url).await;
    crate::poll_until(&format!("event {id} is published on {url}"), async || {
        client
            .query_one(
                "SELECT published_at IS NOT NULL FROM outbox WHERE id = $1",
                &[&id],
            )
            .await
            .ok()
            .and_then(|row| row.get::<_, bool>(0).then_some(()))
    })
    .await;
}

/// Cancels (`pg_cancel_backend`) every session of `application_name` on `client`'s
/// database whose commit waits for a synchronous standby, as an operator's watchdog
/// would; returns how many. Found and cancelled in one statement, so that a wait that
/// ended meanwhile is never the one "cancelled" while the next one goes on waiting.
/// PostgreSQL keeps such a commit and only warns.
pub async fn cancel_synchronous_waits(
    client: &tokio_postgres::Client,
    application_name: &str,
) -> Result<i64, tokio_postgres::Error> {
    Ok(client
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event = 'SyncRep'
                AND application_name = $1",
            &[&application_name],
        )
        .await?
        .get(0))
}

/// [`cancel_synchronous_waits`] every 20 ms on the database at `url`, until dropped.
pub struct SyncRepWatchdog {
    task: tokio::task::JoinHandle<()>,
}

impl SyncRepWatchdog {
    pub async fn start(url: &str, application_name: &str) -> SyncRepWatchdog {
        let client = crate::connect(url).await;
        let application_name = application_name.to_owned();
        let task = tokio::spawn(async move {
            loop {
                let _ = cancel_synchronous_waits(&client, &application_name).await;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        });
        SyncRepWatchdog { task }
    }
}

impl Drop for SyncRepWatchdog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A new charge answered 201 (retried through 503s), whose event on the server `url`
/// points at is then published; returns the event's id.
pub async fn charge_published(api: &TestApi, url: &str) -> Uuid {
    let key = new_key();
    assert_eq!(
        charge_until_answered(api, &key).await.0,
        StatusCode::CREATED
    );
    let event = event_of_key(url, &key).await.expect("its event");
    wait_published(url, event).await;
    event
}

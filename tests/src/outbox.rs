//! Outbox rows as the relay tests arrange and read them.

use uuid::Uuid;

use crate::kafka::TestKafka;
use crate::{TestDb, start_relay};

/// Inserts `n` charges, each with a `ChargeCreated` outbox row whose payload carries
/// `pad` filler bytes; returns the outbox ids in insertion order.
pub async fn insert_pending(db: &TestDb, n: i32, pad: i32) -> Vec<Uuid> {
    db.client()
        .query(
            "WITH ids AS (
                 SELECT gen_random_uuid() AS charge_id, gen_random_uuid() AS event_id, g
                 FROM generate_series(1, $1::int) AS g
             ), c AS (
                 INSERT INTO charges (id, amount_cents, currency)
                 SELECT charge_id, 100 + g, 'EUR' FROM ids
             )
             INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, sequence, payload,
                                 created_at)
             SELECT event_id, 'charge', charge_id, 'ChargeCreated', 1,
                    jsonb_build_object('eventId', event_id, 'chargeId', charge_id,
                                       'sequence', 1, 'amountCents', 100 + g,
                                       'currency', 'EUR', 'occurredAt', now(),
                                       'pad', repeat('x', $2::int)),
                    clock_timestamp()
             FROM ids ORDER BY g
             RETURNING id",
            &[&n, &pad],
        )
        .await
        .expect("insert pending outbox rows")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// What the relay wrote on one outbox row.
pub struct OutboxRow {
    pub published: bool,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub retry_scheduled: bool,
    pub dead: bool,
}

pub async fn outbox_row(db: &TestDb, id: Uuid) -> OutboxRow {
    let row = db
        .client()
        .query_one(
            "SELECT published_at IS NOT NULL, attempts, last_error,
                    next_attempt_at > created_at, dead_at IS NOT NULL
             FROM outbox WHERE id = $1",
            &[&id],
        )
        .await
        .expect("read outbox row");
    OutboxRow {
        published: row.get(0),
        attempts: row.get(1),
        last_error: row.get(2),
        retry_scheduled: row.get(3),
        dead: row.get(4),
    }
}

/// Outbox rows matching `condition` (SQL the test writes, never input).
pub async fn count_outbox(db: &TestDb, condition: &str) -> i64 {
    db.client()
        .query_one(
            &format!("SELECT count(*) FROM outbox WHERE {condition}"),
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("count outbox rows where {condition}: {e}"))
        .get(0)
}

/// A LISTEN session: the channel of every notification, in the order they arrive
/// (Postgres delivers them in commit order).
pub struct Notifications {
    _client: tokio_postgres::Client,
    channels: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Notifications {
    pub async fn listen(db: &TestDb, channels: &[&str]) -> Notifications {
        let (client, mut connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
            .await
            .expect("connect the listener");
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = futures::StreamExt::next(&mut messages).await {
                if let tokio_postgres::AsyncMessage::Notification(n) = message
                    && sender.send(n.channel().to_owned()).is_err()
                {
                    return;
                }
            }
        });
        for channel in channels {
            client
                .batch_execute(&format!("LISTEN {channel}"))
                .await
                .expect("LISTEN");
        }
        Notifications {
            _client: client,
            channels: receiver,
        }
    }

    /// The next notification's channel.
    pub async fn next(&mut self) -> String {
        tokio::time::timeout(crate::DEADLINE, self.channels.recv())
            .await
            .expect("no notification within the deadline")
            .expect("the listener's connection ended")
    }
}

/// One row the broker refuses (larger than the `message.max.bytes` the relay is given),
/// made dead by a relay with `--max-attempts 1` that is stopped before this returns.
pub async fn insert_dead(db: &TestDb, kafka: &TestKafka) -> Uuid {
    let poisoned = insert_pending(db, 1, 20_000).await[0];
    let (mut relay, _) = start_relay(
        db,
        kafka,
        &[
            "--kafka-config",
            "message.max.bytes=10000",
            "--max-attempts",
            "1",
        ],
    )
    .await;
    db.wait_for(
        "SELECT dead_at IS NOT NULL FROM outbox WHERE id = $1",
        &[&poisoned],
        "the poisoned row is dead",
    )
    .await;
    relay.stop().await;
    poisoned
}

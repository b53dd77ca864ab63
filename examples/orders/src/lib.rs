//! A second service on the building blocks alone: `POST /orders` runs at most once per
//! `Idempotency-Key` (pg-idempotency), writes its `OrderPlaced` event in the same
//! transaction (pg-outbox), a relay publishes it (pg-outbox's engine), and a consumer
//! applies it once (pg-inbox).

use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use chrono::{DateTime, Utc};
use pg_idempotency::actix::{self as http_side, IdempotencyRejection};
use pg_idempotency::{
    CompletedKey, Fingerprint, IdempotencyStore, IdempotentOperation, KeyCompletion, StoredResponse,
};
use pg_inbox::kafka::{ConsumeError, Consumed};
use pg_outbox::relay::{
    EngineError, EngineSettings, MessageSettings, ProducerSettings, Producers, RelaySettings,
    RunningEngine, Wakeups,
};
use pg_outbox::{NewEvent, Origin, OutboxStore};
use pg_plumbing::statements::{self, Sql, Type};
use pg_plumbing::{DatabaseTls, Pool, SchemaSet, StoreError, Transaction};
use rdkafka::consumer::StreamConsumer;
use serde::Deserialize;
use tokio::sync::watch;
use uuid::Uuid;

mod embedded {
    refinery::embed_migrations!("migrations");
}

const ORDERS: SchemaSet = SchemaSet::new(
    "orders",
    "orders_schema_history",
    embedded::migrations::runner,
);
const MIGRATION_LOCK: i64 = 0x6f72_6465_7273_0001; // "orders\0\x01"
const ENDPOINT: &str = "POST /orders";

/// The mechanisms' schemas, then this service's own.
pub async fn migrate(pool: &Pool) -> Result<(), StoreError> {
    let sets = [
        pg_idempotency::schema(),
        pg_outbox::schema(),
        pg_inbox::schema(),
        ORDERS,
    ];
    pg_plumbing::migrations::apply(pool, MIGRATION_LOCK, &sets).await?;
    Ok(())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlaceOrder {
    item: String,
    quantity: i32,
}

/// The event consumers receive, header `id` being the outbox id.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderPlaced {
    pub order_id: Uuid,
    pub item: String,
    pub quantity: i32,
}

const INSERT_ORDER: Sql = Sql::new(
    "INSERT INTO orders (id, item, quantity, created_at) VALUES ($1, $2, $3, $4)",
    &[Type::UUID, Type::TEXT, Type::INT4, Type::TIMESTAMPTZ],
);

impl IdempotentOperation for PlaceOrder {
    type Error = IdempotencyRejection;

    fn fingerprint(&self) -> Fingerprint {
        let quantity = self.quantity.to_string();
        Fingerprint::of(
            "place-order/v1",
            &[("item", &self.item), ("quantity", &quantity)],
        )
    }

    async fn execute(
        &self,
        tx: &Transaction<'_>,
        now: DateTime<Utc>,
        completion: KeyCompletion<'_>,
    ) -> Result<CompletedKey, IdempotencyRejection> {
        let id = Uuid::now_v7();
        let (item, quantity) = (&self.item, self.quantity);
        statements::execute(tx, &INSERT_ORDER, &[&id, item, &quantity, &now]).await?;
        let data =
            serde_json::json!({"orderId": id, "item": item, "quantity": quantity}).to_string();
        let new_event = NewEvent {
            id: Uuid::now_v7(),
            aggregate_type: "order",
            aggregate_id: id,
            event_type: "OrderPlaced",
            sequence: 1,
            data: &data,
            created_at: now,
            origin: &Origin::default(),
        };
        OutboxStore::insert(tx, &new_event).await?;
        let headers = vec![("location".to_owned(), format!("/orders/{id}"))];
        let order =
            serde_json::json!({"id": id, "item": item, "quantity": quantity, "createdAt": now});
        let response = StoredResponse {
            status: 201,
            headers,
            body: order.to_string(),
        };
        Ok(completion.store(response).await?)
    }
}

struct State {
    pool: Pool,
    keys: IdempotencyStore,
}

async fn place_order(
    request: HttpRequest,
    body: web::Bytes,
    state: web::Data<State>,
) -> Result<HttpResponse, IdempotencyRejection> {
    let key = http_side::key_from(&request)?;
    let order: PlaceOrder = serde_json::from_slice(&body)
        .map_err(|e| IdempotencyRejection::InvalidRequest(e.to_string()))?;
    let item_ok = (1..=100).contains(&order.item.chars().count()) && !order.item.trim().is_empty();
    if !item_ok || !(1..=1000).contains(&order.quantity) {
        return Err(IdempotencyRejection::InvalidRequest(
            "item: 1 to 100 characters; quantity: 1 to 1000".to_owned(),
        ));
    }
    let outcome = state.keys.run(&state.pool, &key, ENDPOINT, &order).await?;
    http_side::respond(outcome)
}

/// The HTTP API on `listener`; keys are kept a day.
pub fn serve(
    pool: Pool,
    listener: std::net::TcpListener,
) -> std::io::Result<actix_web::dev::Server> {
    let keys = IdempotencyStore::new(Duration::from_secs(24 * 3600));
    let state = web::Data::new(State { pool, keys });
    let app = move || {
        App::new()
            .app_data(state.clone())
            .route("/orders", web::post().to(place_order))
    };
    Ok(HttpServer::new(app).listen(listener)?.run())
}

/// The relay engine publishing this service's outbox to `topic`, woken by a LISTEN
/// session on `database_url` (Postgres's own, not a transaction pooler's).
pub async fn relay(
    pool: Pool,
    database_url: &str,
    brokers: &str,
    topic: &str,
    shutdown: watch::Receiver<bool>,
) -> Result<RunningEngine, EngineError> {
    let producers = Arc::new(Producers::new(ProducerSettings::new(
        brokers,
        "orders-relay",
    ))?);
    let message = MessageSettings::new(topic, "urn:orders");
    let settings = EngineSettings::new(RelaySettings::new(message));
    let tls = DatabaseTls::default();
    let (application_name, tls) = ("orders-relay-listener", &tls);
    let wakeups = Wakeups::Listen {
        database_url,
        application_name,
        tls,
    };
    RunningEngine::start(pool, producers, settings, wakeups, Arc::new(()), shutdown).await
}

const ADD_TO_TOTAL: Sql = Sql::new(
    "INSERT INTO item_totals (item, quantity) VALUES ($1, $2)
     ON CONFLICT (item) DO UPDATE SET quantity = item_totals.quantity + EXCLUDED.quantity",
    &[Type::TEXT, Type::INT8],
);

/// Applies every `OrderPlaced` on `consumer`'s topics once (pg-inbox), committing each
/// offset after its transaction, until `shutdown`. A payload that is no `OrderPlaced`
/// is logged and skipped: it can never be applied.
pub async fn consume(
    pool: &Pool,
    consumer: &StreamConsumer,
    consumed: &Consumed,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ConsumeError<StoreError>> {
    pg_inbox::kafka::consume(pool, consumer, consumed, shutdown, async |tx, payload| {
        let Ok(event) = serde_json::from_slice::<OrderPlaced>(payload) else {
            tracing::error!("a message that is no OrderPlaced skipped");
            return Ok(());
        };
        statements::execute(
            tx,
            &ADD_TO_TOTAL,
            &[&event.item, &i64::from(event.quantity)],
        )
        .await?;
        Ok(())
    })
    .await
}

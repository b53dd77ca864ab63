//! The orders example service (examples/orders), run in the test's process: its HTTP
//! server on a free port, its relay engine and its consumer as tasks.

use std::net::TcpListener;
use std::sync::Arc;

use pg_inbox::kafka::Consumed;
use pg_plumbing::{Pool, PoolSettings};
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio::sync::watch;

use crate::TestDb;
use crate::kafka::TestKafka;

/// The service's database (migrated by the service itself) and its HTTP API.
pub struct OrdersService {
    pub db: TestDb,
    pub pool: Pool,
    pub base_url: String,
    pub http: reqwest::Client,
    server: actix_web::dev::ServerHandle,
}

impl OrdersService {
    pub async fn start() -> OrdersService {
        let db = TestDb::unmigrated().await;
        let pool = pg_plumbing::connect(&db.url, &PoolSettings::default())
            .await
            .expect("connect the orders pool");
        orders::migrate(&pool)
            .await
            .expect("migrate the orders database");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let base_url = format!("http://{}", listener.local_addr().expect("bound address"));
        let server = orders::serve(pool.clone(), listener).expect("orders server");
        let handle = server.handle();
        tokio::spawn(server);
        OrdersService {
            db,
            pool,
            base_url,
            http: reqwest::Client::new(),
            server: handle,
        }
    }

    /// `POST /orders` with `key` and `body`.
    pub async fn place(&self, key: &str, body: &str) -> reqwest::Response {
        self.http
            .post(format!("{}/orders", self.base_url))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body.to_owned())
            .send()
            .await
            .expect("POST /orders")
    }

    pub async fn count(&self, table: &str) -> i64 {
        self.db.count(table).await
    }

    pub async fn stop(&self) {
        self.server.stop(true).await;
    }
}

/// The service's relay engine and consumer, publishing to and reading from `kafka`.
pub struct OrdersPipeline {
    pub consumed: Arc<Consumed>,
    stop: watch::Sender<bool>,
    relay: Option<pg_outbox::relay::RunningEngine>,
    consumer: tokio::task::JoinHandle<()>,
}

impl OrdersPipeline {
    pub async fn start(service: &OrdersService, kafka: &TestKafka) -> OrdersPipeline {
        let (stop, shutdown) = watch::channel(false);
        let relay = orders::relay(
            service.pool.clone(),
            &service.db.url,
            &kafka.bootstrap,
            &kafka.topic,
            shutdown.clone(),
        )
        .await
        .expect("start the orders relay");
        let consumer: StreamConsumer = ClientConfig::new()
            .set("bootstrap.servers", &kafka.bootstrap)
            .set("group.id", "orders-totals")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("Kafka consumer");
        consumer.subscribe(&[&kafka.topic]).expect("subscribe");
        let consumed = Arc::new(Consumed::default());
        let (pool, counts) = (service.pool.clone(), consumed.clone());
        let consumer = tokio::spawn(async move {
            orders::consume(&pool, &consumer, &counts, shutdown)
                .await
                .expect("the orders consumer failed");
        });
        OrdersPipeline {
            consumed,
            stop,
            relay: Some(relay),
            consumer,
        }
    }

    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(relay) = self.relay.take() {
            relay.drain(std::time::Duration::from_secs(5)).await;
        }
        self.consumer.await.expect("the consumer task");
    }
}

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use crate::StoreError;
use crate::tls::DatabaseTls;

/// How the pool talks to Postgres. Every bound here exists so that a request can never
/// hang on the database longer than the client is willing to wait.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub max_size: usize,
    /// Waiting for a free connection, and connecting a new one.
    pub acquire_timeout: Duration,
    /// `statement_timeout` for every statement run through the pool.
    pub statement_timeout: Duration,
    /// Shown in `pg_stat_activity`.
    pub application_name: String,
    /// Used when the URL says `sslmode=require` (see [`DatabaseTls`]).
    pub tls: DatabaseTls,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            max_size: 16,
            acquire_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            application_name: "charges".to_owned(),
            tls: DatabaseTls::default(),
        }
    }
}

/// TCP keepalive: an idle connection whose peer vanished (a network partition, a host
/// gone without a FIN) is found dead after about `IDLE + RETRIES × INTERVAL` = 25 s.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 3;
/// `TCP_USER_TIMEOUT`: data sent but not acknowledged for this long ends the connection
/// (the kernel's own retransmission limit is about 15 minutes).
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

/// Makes a connection notice a dead peer by itself (docs/operations.md, "Network
/// partitions"): without this a partitioned session waits on the kernel's defaults,
/// two hours idle or about 15 minutes with data in flight. The server ends the
/// partitioned session's transaction on its side (`idle_in_transaction_session_timeout`).
pub fn detect_dead_peers(config: &mut tokio_postgres::Config) {
    config
        .keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE)
        .keepalives_interval(KEEPALIVE_INTERVAL)
        .keepalives_retries(KEEPALIVE_RETRIES)
        .tcp_user_timeout(TCP_USER_TIMEOUT);
}

/// Builds the pool and takes one connection, so that a wrong URL or a database that is
/// down fails start-up instead of the first request (creating a deadpool never fails).
pub async fn connect(database_url: &str, settings: &PoolSettings) -> Result<Pool, StoreError> {
    let pool = build(database_url, settings)?;
    drop(pool.get().await?);
    Ok(pool)
}

fn build(database_url: &str, settings: &PoolSettings) -> Result<Pool, StoreError> {
    let mut pg: tokio_postgres::Config = database_url.parse().map_err(StoreError::DatabaseUrl)?;
    pg.application_name(&settings.application_name);
    pg.connect_timeout(settings.acquire_timeout);
    detect_dead_peers(&mut pg);
    pg.options(format!(
        "-c statement_timeout={} -c idle_in_transaction_session_timeout={}",
        settings.statement_timeout.as_millis(),
        // An abandoned transaction must not keep its row locks (and so its idempotency
        // key and outbox claims) longer than a slow statement could.
        (settings.statement_timeout * 2).as_millis(),
    ));
    let manager_config = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = if DatabaseTls::required_by(&pg) {
        Manager::from_config(pg, settings.tls.connector()?, manager_config)
    } else {
        Manager::from_config(pg, NoTls, manager_config)
    };
    Pool::builder(manager)
        .max_size(settings.max_size)
        .wait_timeout(Some(settings.acquire_timeout))
        .create_timeout(Some(settings.acquire_timeout))
        .recycle_timeout(Some(settings.acquire_timeout))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(StoreError::from)
}

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use crate::statements::{self, Pooler, Sql};
use crate::tls::DatabaseTls;
use crate::unreplicated_commit::GuardedConnect;
use crate::{Connection, StoreError};

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
    /// What sits between this process and Postgres (see [`crate::statements`]).
    pub pooler: Pooler,
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            max_size: 16,
            acquire_timeout: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            application_name: env!("CARGO_PKG_NAME").to_owned(),
            tls: DatabaseTls::default(),
            pooler: Pooler::None,
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

impl PoolSettings {
    /// The server's `idle_in_transaction_session_timeout`: an abandoned transaction must
    /// not keep its row locks (and so its idempotency key and outbox claims) longer than
    /// a slow statement could.
    pub fn idle_in_transaction_timeout(&self) -> Duration {
        self.statement_timeout * 2
    }
}

/// Builds the pool and takes one connection, so that a wrong URL or a database that is
/// down fails start-up instead of the first request (creating a deadpool never fails).
/// Through a transaction pooler, that connection also proves that the server bounds
/// statements and idle transactions as tightly as `settings` asks.
pub async fn connect(database_url: &str, settings: &PoolSettings) -> Result<Pool, StoreError> {
    statements::choose(settings.pooler)?;
    let pool = build(database_url, settings)?;
    let client = pool.get().await.map_err(explain_refused_options)?;
    if settings.pooler.pools_transactions() {
        check_server_bounds(&client, settings).await?;
    }
    Ok(pool)
}

/// PgBouncer answers a connection that carries `options` (our timeouts, on a direct
/// connection) with `unsupported startup parameter: options`: name the setting that
/// fixes it rather than leave the operator with PgBouncer's words.
fn explain_refused_options(error: deadpool_postgres::PoolError) -> StoreError {
    match error {
        deadpool_postgres::PoolError::Backend(cause)
            if cause
                .as_db_error()
                .is_some_and(|db| db.message().starts_with("unsupported startup parameter")) =>
        {
            StoreError::StartupOptionsRefused(cause)
        }
        other => StoreError::from(other),
    }
}

/// `PoolServerBounds`: the timeouts the server applies to this session, in ms.
const SERVER_BOUNDS: Sql = Sql::new(
    "
SELECT current_setting('statement_timeout') AS statement_timeout,
       (SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout') AS statement_ms,
       current_setting('idle_in_transaction_session_timeout') AS idle_in_transaction_timeout,
       (SELECT setting::bigint FROM pg_settings
         WHERE name = 'idle_in_transaction_session_timeout') AS idle_in_transaction_ms",
    &[],
);

/// A transaction pooler refuses the connection's own settings (the `options` startup
/// parameter), or drops them when told to ignore it, so the bounds must come from the
/// server: the role's or the database's settings (`ALTER ROLE … SET statement_timeout`,
/// deploy/sql/roles.sql), which every server session the pooler opens starts with.
/// Looser or missing bounds refuse start-up: a request must never wait on a lock longer
/// than `--db-statement-timeout` because a pooler sits in between.
async fn check_server_bounds(
    client: &impl Connection,
    settings: &PoolSettings,
) -> Result<(), StoreError> {
    let row = statements::query_one(client, &SERVER_BOUNDS, &[]).await?;
    let checks = [
        (
            "statement_timeout",
            row.try_get::<_, String>("statement_timeout")?,
            row.try_get::<_, i64>("statement_ms")?,
            settings.statement_timeout,
        ),
        (
            "idle_in_transaction_session_timeout",
            row.try_get::<_, String>("idle_in_transaction_timeout")?,
            row.try_get::<_, i64>("idle_in_transaction_ms")?,
            settings.idle_in_transaction_timeout(),
        ),
    ];
    for (name, shown, server_ms, wanted) in checks {
        let wanted_ms = i64::try_from(wanted.as_millis()).unwrap_or(i64::MAX);
        if server_ms == 0 || server_ms > wanted_ms {
            return Err(StoreError::UnboundedThroughPooler(format!(
                "the server's {name} is {shown} (0 = none), the configuration asks for at most \
                 {wanted_ms}ms; set it for the role the pooler logs in as, e.g. \
                 ALTER ROLE <role> SET {name} = '{wanted_ms}ms' (docs/operations.md, \
                 \"Connection pooling\")"
            )));
        }
    }
    Ok(())
}

fn build(database_url: &str, settings: &PoolSettings) -> Result<Pool, StoreError> {
    let mut pg: tokio_postgres::Config = database_url.parse().map_err(StoreError::DatabaseUrl)?;
    pg.application_name(&settings.application_name);
    pg.connect_timeout(settings.acquire_timeout);
    detect_dead_peers(&mut pg);
    if settings.pooler == Pooler::None {
        pg.options(format!(
            "-c statement_timeout={} -c idle_in_transaction_session_timeout={}",
            settings.statement_timeout.as_millis(),
            settings.idle_in_transaction_timeout().as_millis(),
        ));
    }
    let manager_config = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = if DatabaseTls::required_by(&pg) {
        let tls = settings.tls.connector()?;
        Manager::from_connect(pg, GuardedConnect { tls }, manager_config)
    } else {
        Manager::from_connect(pg, GuardedConnect { tls: NoTls }, manager_config)
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

//! How a statement reaches Postgres: the one place that knows whether a pooler sits in
//! between.
//!
//! - **Directly** ([`Pooler::None`]), a statement is prepared once per connection
//!   (`prepare_typed_cached`) and then only bound and executed: no parse or plan per
//!   request.
//! - **Through a transaction pooler** ([`Pooler::Transaction`], PgBouncer's
//!   `pool_mode = transaction` and its kin), two transactions of one client may run on
//!   two server connections, and a server connection serves other processes in
//!   between. A named statement prepared on one is missing on the next ("prepared
//!   statement s3 does not exist") or collides with another process's `s3` ("already
//!   exists"). So every execution sends its statement unnamed, with its parameter
//!   types (`Parse`/`Bind`/`Execute`/`Sync` in one message, tokio-postgres's
//!   `query_typed`): one round trip still, a parse and a plan more on the server.
//!
//! - **Through a pooler that keeps prepared statements** ([`Pooler::TransactionPrepared`],
//!   PgBouncer 1.21 and later with `max_prepared_statements`), the pooler prepares each
//!   client's named statement on whichever server connection runs it, under a name of
//!   its own: statements are prepared as directly.
//!
//! The parameter types are part of every statement ([`Sql`]), so both paths bind the
//! same types and a statement behaves the same either way.
//!
//! The choice is per process, made once when its pool is built ([`crate::connect`]):
//! a process talks to its database one way. A second pool built the other way is an
//! error rather than a silent switch of the first pool's statements.

use std::sync::atomic::{AtomicU8, Ordering};

use deadpool_postgres::GenericClient;
use tokio_postgres::GenericClient as _;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
/// The parameter types of [`Sql`] statements.
pub use tokio_postgres::types::Type;

use crate::StoreError;

/// What sits between the binaries and Postgres (`--db-pooler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooler {
    /// Postgres itself, or a pooler in session mode: one server session per client
    /// connection. Statements are prepared once per connection.
    #[default]
    None,
    /// A pooler in transaction mode: a server session per transaction. Statements go
    /// unnamed, and settings travel with the server's role, not the connection.
    Transaction,
    /// A pooler in transaction mode that keeps protocol-level prepared statements
    /// across its server connections (PgBouncer 1.21 and later with
    /// `max_prepared_statements` above 0): statements are prepared once per client
    /// connection, as directly; the rest is [`Pooler::Transaction`]'s.
    TransactionPrepared,
}

impl Pooler {
    pub fn as_str(self) -> &'static str {
        match self {
            Pooler::None => "none",
            Pooler::Transaction => "transaction",
            Pooler::TransactionPrepared => "transaction-prepared",
        }
    }

    /// Whether a server session lasts only a transaction: no connection settings, no
    /// session state (LISTEN, session locks, migrations).
    pub fn pools_transactions(self) -> bool {
        self != Pooler::None
    }
}

/// A statement and the types of its parameters (`$1`, `$2`, … in order).
#[derive(Debug, Clone, Copy)]
pub struct Sql {
    pub text: &'static str,
    pub types: &'static [Type],
}

impl Sql {
    pub const fn new(text: &'static str, types: &'static [Type]) -> Sql {
        Sql { text, types }
    }
}

/// A pooled connection or a transaction on one: what the stores run statements on.
pub trait Connection: GenericClient {
    /// The tokio-postgres client or transaction underneath, for unnamed statements
    /// (deadpool's `GenericClient` has no `query_typed`).
    type Postgres: tokio_postgres::GenericClient + Sync;

    fn postgres(&self) -> &Self::Postgres;
}

impl Connection for deadpool_postgres::Client {
    type Postgres = tokio_postgres::Client;

    fn postgres(&self) -> &tokio_postgres::Client {
        self
    }
}

impl<'a> Connection for deadpool_postgres::Transaction<'a> {
    type Postgres = tokio_postgres::Transaction<'a>;

    fn postgres(&self) -> &tokio_postgres::Transaction<'a> {
        self
    }
}

const UNSET: u8 = 0;
const PREPARED: u8 = 1;
const UNNAMED: u8 = 2;
const PREPARED_THROUGH_POOLER: u8 = 3;

/// This process's choice; [`UNSET`] (prepared) until its pool is built.
static MODE: AtomicU8 = AtomicU8::new(UNSET);

/// Records how this process's statements travel. The first pool decides; a later pool
/// with the same setting is fine, another setting is refused.
pub(crate) fn choose(pooler: Pooler) -> Result<(), StoreError> {
    let wanted = match pooler {
        Pooler::None => PREPARED,
        Pooler::Transaction => UNNAMED,
        Pooler::TransactionPrepared => PREPARED_THROUGH_POOLER,
    };
    match MODE.compare_exchange(UNSET, wanted, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => Ok(()),
        Err(current) if current == wanted => Ok(()),
        Err(_) => Err(StoreError::PoolerMismatch(pooler)),
    }
}

fn unnamed() -> bool {
    MODE.load(Ordering::Relaxed) == UNNAMED
}

/// Whether this process's pool goes through a transaction pooler: work that needs one
/// server session throughout (session advisory locks, LISTEN, migrations) must not use
/// it.
pub fn through_transaction_pooler() -> bool {
    matches!(
        MODE.load(Ordering::Relaxed),
        UNNAMED | PREPARED_THROUGH_POOLER
    )
}

fn typed<'p>(
    sql: &Sql,
    params: &[&'p (dyn ToSql + Sync)],
) -> Result<Vec<(&'p (dyn ToSql + Sync), Type)>, StoreError> {
    if params.len() != sql.types.len() {
        return Err(StoreError::Invariant(format!(
            "{} parameters bound to a statement of {}",
            params.len(),
            sql.types.len()
        )));
    }
    Ok(params
        .iter()
        .copied()
        .zip(sql.types.iter().cloned())
        .collect())
}

/// Every row `sql` returns.
pub async fn query<C: Connection>(
    client: &C,
    sql: &Sql,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, StoreError> {
    if unnamed() {
        let params = typed(sql, params)?;
        return Ok(client.postgres().query_typed(sql.text, &params).await?);
    }
    let statement = client.prepare_typed_cached(sql.text, sql.types).await?;
    Ok(client.query(&statement, params).await?)
}

/// The one row `sql` returns; no row, or more than one, is an error.
pub async fn query_one<C: Connection>(
    client: &C,
    sql: &Sql,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Row, StoreError> {
    if unnamed() {
        let params = typed(sql, params)?;
        return Ok(client.postgres().query_typed_one(sql.text, &params).await?);
    }
    let statement = client.prepare_typed_cached(sql.text, sql.types).await?;
    Ok(client.query_one(&statement, params).await?)
}

/// The row `sql` returns, if any; more than one is an error.
pub async fn query_opt<C: Connection>(
    client: &C,
    sql: &Sql,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<Row>, StoreError> {
    if unnamed() {
        let params = typed(sql, params)?;
        return Ok(client.postgres().query_typed_opt(sql.text, &params).await?);
    }
    let statement = client.prepare_typed_cached(sql.text, sql.types).await?;
    Ok(client.query_opt(&statement, params).await?)
}

/// Runs `sql`; returns how many rows it changed.
pub async fn execute<C: Connection>(
    client: &C,
    sql: &Sql,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, StoreError> {
    if unnamed() {
        let params = typed(sql, params)?;
        return Ok(client.postgres().execute_typed(sql.text, &params).await?);
    }
    let statement = client.prepare_typed_cached(sql.text, sql.types).await?;
    Ok(client.execute(&statement, params).await?)
}

/// A statement ready to go out the moment its future is first polled, as pipelining
/// needs: prepared on this connection beforehand (directly), or sent whole, unnamed,
/// every time (through a transaction pooler, where there is nothing to prepare ahead).
#[derive(Debug, Clone)]
pub enum ReadyStatement {
    Prepared(tokio_postgres::Statement),
    Unnamed(Sql),
}

/// `sql`, prepared on `client` (from its cache after the first time) unless this
/// process's statements go unnamed.
pub async fn ready<C: Connection>(client: &C, sql: &Sql) -> Result<ReadyStatement, StoreError> {
    if unnamed() {
        return Ok(ReadyStatement::Unnamed(*sql));
    }
    Ok(ReadyStatement::Prepared(
        client.prepare_typed_cached(sql.text, sql.types).await?,
    ))
}

impl ReadyStatement {
    pub async fn query<C: Connection>(
        &self,
        client: &C,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        match self {
            ReadyStatement::Prepared(statement) => Ok(client.query(statement, params).await?),
            ReadyStatement::Unnamed(sql) => {
                let params = typed(sql, params)?;
                Ok(client.postgres().query_typed(sql.text, &params).await?)
            }
        }
    }

    pub async fn execute<C: Connection>(
        &self,
        client: &C,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        match self {
            ReadyStatement::Prepared(statement) => Ok(client.execute(statement, params).await?),
            ReadyStatement::Unnamed(sql) => {
                let params = typed(sql, params)?;
                Ok(client.postgres().execute_typed(sql.text, &params).await?)
            }
        }
    }
}

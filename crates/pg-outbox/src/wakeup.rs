//! `outbox_wakeup`: one unlogged row saying whether a relay waits for a notification.
//! The outbox's insert trigger notifies only while it does (migration V9 says why a
//! busy relay must not be notified); the relays ask and withdraw here.

use tokio_postgres::types::Type;

use pg_plumbing::StoreError;
use pg_plumbing::statements::{self, Connection, Sql};

/// `OutboxWakeupEnsure`: the row, again after a crash emptied the unlogged table.
const ENSURE: &str = "INSERT INTO outbox_wakeup DEFAULT VALUES ON CONFLICT (singleton) DO NOTHING";

/// `OutboxWakeupSet`: writes only a change, so that a relay repeating itself takes no
/// row lock.
const SET: Sql = Sql::new(
    "UPDATE outbox_wakeup SET requested = $1 WHERE requested IS DISTINCT FROM $1",
    &[Type::BOOL],
);

/// `OutboxWakeupGet`
const GET: Sql = Sql::new(
    "SELECT coalesce(bool_or(requested), false) AS requested FROM outbox_wakeup",
    &[],
);

pub struct OutboxWakeupStore;

impl OutboxWakeupStore {
    /// On the relay's LISTEN session (a plain client, outside the pool).
    pub async fn ensure(client: &tokio_postgres::Client) -> Result<(), StoreError> {
        client.batch_execute(ENSURE).await?;
        Ok(())
    }

    /// `true`: inserts notify from now on; `false`: they stop notifying.
    pub async fn set_requested(
        client: &impl Connection,
        requested: bool,
    ) -> Result<(), StoreError> {
        statements::execute(client, &SET, &[&requested]).await?;
        Ok(())
    }

    pub async fn requested(client: &impl Connection) -> Result<bool, StoreError> {
        let row = statements::query_one(client, &GET, &[]).await?;
        Ok(row.try_get("requested")?)
    }
}

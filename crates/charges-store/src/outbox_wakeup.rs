//! `outbox_wakeup`: one unlogged row saying whether a relay waits for a notification.
//! The outbox's insert trigger notifies only while it does (migration V9 says why a
//! busy relay must not be notified); the relays ask and withdraw here.

use deadpool_postgres::GenericClient;

use crate::StoreError;

/// `OutboxWakeupEnsure`: the row, again after a crash emptied the unlogged table.
const ENSURE: &str = "INSERT INTO outbox_wakeup DEFAULT VALUES ON CONFLICT (singleton) DO NOTHING";

/// `OutboxWakeupSet`: writes only a change, so that a relay repeating itself takes no
/// row lock.
const SET: &str = "
UPDATE outbox_wakeup SET requested = $1 WHERE requested IS DISTINCT FROM $1";

/// `OutboxWakeupGet`
const GET: &str = "SELECT coalesce(bool_or(requested), false) AS requested FROM outbox_wakeup";

pub struct OutboxWakeupStore;

impl OutboxWakeupStore {
    /// On the relay's LISTEN session (a plain client, outside the pool).
    pub async fn ensure(client: &tokio_postgres::Client) -> Result<(), StoreError> {
        client.batch_execute(ENSURE).await?;
        Ok(())
    }

    /// `true`: inserts notify from now on; `false`: they stop notifying.
    pub async fn set_requested(
        client: &impl GenericClient,
        requested: bool,
    ) -> Result<(), StoreError> {
        let statement = client.prepare_cached(SET).await?;
        client.execute(&statement, &[&requested]).await?;
        Ok(())
    }

    pub async fn requested(client: &impl GenericClient) -> Result<bool, StoreError> {
        let row = client.query_one(GET, &[]).await?;
        Ok(row.try_get("requested")?)
    }
}

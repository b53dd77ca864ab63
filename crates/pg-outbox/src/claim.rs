//! The relay's claim transaction, in two round trips: `BEGIN` goes out pipelined with
//! the claim, `COMMIT` pipelined with the mark. tokio-postgres's `Transaction` awaits
//! `BEGIN` and `COMMIT` on their own, two round trips more per batch.
//!
//! What `Transaction` gave for free is kept by hand: a transaction that does not end
//! in a successful `COMMIT` never goes back to the pool. Its connection is closed,
//! and the server rolls the transaction back, releasing the claim's row locks.

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::{GenericClient, Object};
use futures::TryFutureExt;
use uuid::Uuid;

use crate::replication::WalPosition;
use crate::store::{ClaimStatements, OutboxStore, PendingEvent, PublishFailure};
use pg_plumbing::StoreError;

/// `BEGIN`, as a simple query: nothing to prepare, so it is sent the moment it is
/// polled, before the statements polled after it.
const BEGIN: &str = "BEGIN";
/// On a transaction a failed statement aborted, the server answers `ROLLBACK`
/// without an error; that failed statement's own error is what the caller sees.
const COMMIT: &str = "COMMIT";

/// An open claim transaction: the rows it returned stay locked (`FOR UPDATE SKIP
/// LOCKED`) until [`ClaimTransaction::commit`], or until it is dropped.
pub struct ClaimTransaction {
    /// `None` once committed: the connection is back in the pool.
    client: Option<Object>,
    statements: ClaimStatements,
    /// How far the WAL was flushed as the claim read its first row (`None`: it claimed
    /// nothing).
    position: Option<WalPosition>,
}

impl ClaimTransaction {
    /// Opens the transaction, bounds it server-side (`timeout` for both its idle time
    /// and each statement), and claims up to `limit` rows created at or after `from`:
    /// three requests, one round trip. The server runs them in the order sent, so the
    /// timeouts are set before the claim takes its locks.
    pub async fn claim(
        client: Object,
        ordered: bool,
        timeout: Duration,
        limit: i64,
        from: Option<DateTime<Utc>>,
    ) -> Result<(ClaimTransaction, Vec<PendingEvent>), StoreError> {
        let statements = OutboxStore::claim_statements(&client, ordered).await?;
        let mut transaction = ClaimTransaction {
            client: Some(client),
            statements,
            position: None,
        };
        let (events, position) = {
            let (client, statements) = transaction.parts()?;
            let ((), (), claimed) = futures::try_join!(
                client.batch_execute(BEGIN).map_err(StoreError::from),
                OutboxStore::set_claim_timeouts(client, statements, timeout, timeout),
                OutboxStore::claim_pending(client, statements, limit, from),
            )?;
            claimed
        };
        transaction.position = position;
        Ok((transaction, events))
    }

    /// Marks `acked` published, records `failures`, and commits: one round trip. Only
    /// when all three succeed is the transaction committed and the connection pooled
    /// again; returns how many rows the mark changed.
    pub async fn commit(
        mut self,
        acked: &[Uuid],
        failures: &[PublishFailure],
    ) -> Result<u64, StoreError> {
        let published = {
            let (client, statements) = self.parts()?;
            let (published, _, ()) = futures::try_join!(
                OutboxStore::mark_published(client, statements, acked),
                OutboxStore::record_failures(client, statements, failures),
                client.batch_execute(COMMIT).map_err(StoreError::from),
            )?;
            published
        };
        // Committed: outside any transaction, the connection can serve the next batch.
        self.client = None;
        Ok(published)
    }

    /// How far the WAL was flushed as the claim read its first row, on which server: at
    /// or past the commit of every claimed row (`None`: it claimed nothing).
    pub fn position(&self) -> Option<WalPosition> {
        self.position
    }

    fn parts(&self) -> Result<(&Object, &ClaimStatements), StoreError> {
        match &self.client {
            Some(client) => Ok((client, &self.statements)),
            // Only `commit` empties it, and `commit` consumes the transaction.
            None => Err(StoreError::Invariant(
                "the claim transaction has already ended".to_owned(),
            )),
        }
    }
}

impl Drop for ClaimTransaction {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            // Not committed: an error, or the batch's future dropped midway. Whether
            // the server still holds the transaction open is not known here (a
            // pipelined COMMIT may or may not have run), so the connection is taken
            // out of the pool and closed; closing it rolls back whatever is open.
            drop(Object::take(client));
        }
    }
}

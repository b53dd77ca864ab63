//! The replication gate (`--wait-for-standbys`): no event is published before the
//! standbys a failover would promote have its commit. Without it, a commit that only
//! the old primary had (an asynchronous standby behind, or a synchronous wait that was
//! cancelled) can be published and then lost in the failover: an event for a charge
//! that no longer exists.
//!
//! The claim reports where the WAL ended as it read its first row, at or past every
//! claimed row's commit and before its own row locks (`OutboxClaimPending`); the batch
//! is published once the standbys have flushed that far.
//! Until then it holds its rows (it is their claim); past `bound` it gives up, and the
//! caller drops the transaction, which rolls the claim back: no attempt counted, the
//! rows pending, to be claimed again like after a broker outage.

use std::time::{Duration, Instant};

use charges_store::{ClaimTransaction, ReplicationStore};

use crate::RelayError;
use crate::metrics::{STANDBY_LAG, STANDBY_TIMEOUTS};

/// The first pause between two looks at the standbys, doubled up to [`MAX_PAUSE`]: a
/// synchronous standby has usually flushed by the first look.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const MAX_PAUSE: Duration = Duration::from_millis(100);

/// Waits until `standbys` (empty: any one) have flushed the claim's WAL, at most `bound`.
pub async fn wait_for_standbys(
    transaction: &ClaimTransaction,
    standbys: &[String],
    bound: Duration,
) -> Result<(), RelayError> {
    let client = transaction.connection()?;
    let Some(position) = transaction.position().map(str::to_owned) else {
        return Ok(()); // nothing claimed, nothing to publish
    };
    let deadline = Instant::now() + bound;
    let mut pause = FIRST_PAUSE;
    loop {
        let progress = ReplicationStore::standbys_confirmed(client, &position, standbys).await?;
        metrics::gauge!(STANDBY_LAG).set(progress.lag_bytes.map_or(-1.0, |lag| lag.max(0.0)));
        if progress.confirmed {
            return Ok(());
        }
        if Instant::now() + pause >= deadline {
            metrics::counter!(STANDBY_TIMEOUTS).increment(1);
            return Err(RelayError::StandbysBehind {
                position,
                lag: progress
                    .lag_bytes
                    .map_or("no such standby streaming".to_owned(), |lag| {
                        format!("{lag} bytes behind")
                    }),
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

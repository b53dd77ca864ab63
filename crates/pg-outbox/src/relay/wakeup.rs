//! Asking for notifications. An idle relay asks inserts to notify (`outbox_wakeup`); a
//! busy one withdraws and polls after [`Pacing::busy_poll_interval`], because a
//! transaction that notifies commits only after every other notifying transaction
//! before it (migration V9). So under load no writer's commit waits for a NOTIFY, and
//! an isolated event still wakes an idle relay at once.
//!
//! [`Pacing::busy_poll_interval`]: crate::relay::Pacing::busy_poll_interval

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pg_plumbing::{Pool, StoreError};

use crate::OutboxWakeupStore;
use crate::relay::error::error_chain;

/// One process's request for notifications, shared by its batch loops.
pub struct WakeupRequest {
    pool: Pool,
    /// This process asked and has not withdrawn since.
    asked: AtomicBool,
    /// When this process last wrote the flag; another replica's request, left behind
    /// when it died or turned busy, is withdrawn at most this long after.
    last_write: Mutex<Instant>,
    recheck: Duration,
    /// This process LISTENs; without a listener, asking would make every insert
    /// NOTIFY for nobody.
    listening: bool,
}

impl WakeupRequest {
    /// `recheck`: how long a busy relay trusts that nobody asked (the poll interval:
    /// the same bound the fallback polling gives).
    /// `listening`: whether this process has a LISTEN session to be woken on.
    pub fn new(pool: Pool, recheck: Duration, listening: bool) -> WakeupRequest {
        WakeupRequest {
            pool,
            asked: AtomicBool::new(false),
            last_write: Mutex::new(Instant::now()),
            recheck,
            listening,
        }
    }

    /// The relay found nothing to claim: inserts notify from now on. The caller claims
    /// once more afterwards, since rows committed before the request took effect sent
    /// no notification.
    pub async fn ask(&self) {
        if !self.listening {
            return;
        }
        self.asked.store(true, Ordering::Relaxed);
        self.write(true).await;
    }

    /// The relay claimed rows: inserts stop notifying while it is busy.
    pub async fn withdraw(&self) {
        let asked = self.asked.swap(false, Ordering::Relaxed);
        if asked || self.since_last_write() >= self.recheck {
            self.write(false).await;
        }
    }

    fn since_last_write(&self) -> Duration {
        self.last_write
            .lock()
            .map(|at| at.elapsed())
            .unwrap_or(Duration::MAX)
    }

    /// Best effort: a flag that could not be written costs latency (a missed wake-up
    /// waits for the poll) or commit throughput (a needless NOTIFY), never an event.
    async fn write(&self, requested: bool) {
        let written: Result<(), StoreError> = async {
            let client = self.pool.get().await?;
            OutboxWakeupStore::set_requested(&client, requested).await
        }
        .await;
        match written {
            Ok(()) => {
                if let Ok(mut at) = self.last_write.lock() {
                    *at = Instant::now();
                }
            }
            Err(e) => tracing::debug!(
                requested,
                error = %error_chain(&e),
                "could not write the wake-up request; polling covers it"
            ),
        }
    }
}

//! The replication gate ([`RelaySettings::standbys`]): no event is published before
//! the standbys a failover would promote have its commit. Without it, a commit that
//! only the old primary had (an asynchronous standby behind, or a synchronous wait that
//! was cancelled) can be published and then lost in the failover: an event about a
//! change that no longer exists.
//!
//! [`RelaySettings::standbys`]: crate::relay::RelaySettings::standbys
//!
//! The claim reports how far the WAL was flushed as it read its first row, at or past
//! every claimed row's commit (`OutboxClaimPending`), and on which server; the batch is
//! published once that server's standbys have flushed that far. Until then it holds its rows
//! (it is their claim); past `bound` it gives up, and the caller drops the transaction,
//! which rolls the claim back: no attempt counted, the rows pending, to be claimed
//! again like after a broker outage.
//!
//! One watcher per process asks the database how far the standbys have flushed, and
//! only while a batch waits: every waiting batch reads the same answers, so a batch
//! costs no statement of its own and no back-off between looks, and the other batch
//! loops claim, publish and commit meanwhile. An answer speaks only for claims made
//! before its question was sent: the set of standbys `sync` follows may have changed
//! since an older one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pg_plumbing::Pool;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use crate::relay::error::EngineError;
use crate::relay::metrics;
use crate::{GateStandbys, ReplicationStore, StandbyFlush, WalPosition};

/// Between two questions while a batch waits: a synchronous standby flushes within a
/// round trip or two, and a question is one short statement.
const ASK_EVERY: Duration = Duration::from_millis(1);
/// Between two questions after one failed (the database unreachable): the waiting
/// batches time out by themselves, no need to hammer a server that is down.
const ASK_AGAIN_AFTER_FAILURE: Duration = Duration::from_millis(100);

/// The standbys' last answer, and when its question was sent.
#[derive(Debug, Clone, Copy)]
struct Answer {
    asked_at: Instant,
    /// `None`: the question failed.
    flush: Option<StandbyFlush>,
}

/// The gate one relay process shares between its batch loops.
pub struct StandbyGate {
    pool: Pool,
    standbys: GateStandbys,
    latest: watch::Sender<Answer>,
    waiting: AtomicUsize,
    someone_waits: Notify,
}

/// The gate and its watcher task, which ends when this is dropped.
pub struct RunningGate {
    pub gate: Arc<StandbyGate>,
    watcher: JoinHandle<()>,
}

impl Drop for RunningGate {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

impl StandbyGate {
    /// The gate for `standbys`, its watcher asking through `pool`.
    pub fn start(pool: Pool, standbys: GateStandbys) -> RunningGate {
        let (latest, _) = watch::channel(Answer {
            asked_at: Instant::now(),
            flush: None,
        });
        let gate = Arc::new(StandbyGate {
            pool,
            standbys,
            latest,
            waiting: AtomicUsize::new(0),
            someone_waits: Notify::new(),
        });
        let watcher = tokio::spawn(gate.clone().watch());
        RunningGate { gate, watcher }
    }

    /// Waits until the standbys have flushed up to `position`, which a claim read
    /// before `claimed_at`; at most `bound`.
    pub async fn wait(
        &self,
        position: WalPosition,
        claimed_at: Instant,
        bound: Duration,
    ) -> Result<(), EngineError> {
        let mut answers = self.latest.subscribe();
        let _waiting = Waiting::enter(self);
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let answer = *answers.borrow_and_update();
            if answer.asked_at >= claimed_at && answer.flush.is_some_and(|f| f.covers(position)) {
                return Ok(());
            }
            if let Ok(Ok(())) = tokio::time::timeout_at(deadline, answers.changed()).await {
                continue;
            }
            metrics::standby_timed_out();
            return Err(EngineError::StandbysBehind {
                position: position.to_string(),
                lag: match answer.flush {
                    Some(flush) if flush.server != position.server => {
                        "the claim's server no longer answers".to_owned()
                    }
                    Some(StandbyFlush {
                        lag_bytes: Some(lag),
                        ..
                    }) => format!("{lag} bytes behind"),
                    Some(_) => "no such standby streaming".to_owned(),
                    None => "their positions could not be read".to_owned(),
                },
            });
        }
    }

    /// Asks while a batch waits, and only then.
    async fn watch(self: Arc<Self>) {
        loop {
            while self.waiting.load(Ordering::SeqCst) == 0 {
                self.someone_waits.notified().await;
            }
            let asked_at = Instant::now();
            let flush = self.ask().await;
            let pause = if flush.is_some() {
                ASK_EVERY
            } else {
                ASK_AGAIN_AFTER_FAILURE
            };
            self.latest.send_replace(Answer { asked_at, flush });
            tokio::time::sleep(pause).await;
        }
    }

    async fn ask(&self) -> Option<StandbyFlush> {
        let asked = async {
            let client = self.pool.get().await?;
            ReplicationStore::standbys_flushed(&client, &self.standbys).await
        };
        match asked.await {
            Ok(flush) => {
                let lag = match flush {
                    StandbyFlush {
                        everything: true, ..
                    } => 0.0,
                    StandbyFlush {
                        lag_bytes: Some(lag),
                        ..
                    } => lag.max(0.0),
                    StandbyFlush { .. } => -1.0,
                };
                metrics::standby_lag(lag);
                Some(flush)
            }
            Err(error) => {
                tracing::debug!(error = %error, "the replication gate could not read the standbys' positions");
                None
            }
        }
    }
}

/// A batch counted as waiting for as long as it lives.
struct Waiting<'a>(&'a StandbyGate);

impl<'a> Waiting<'a> {
    fn enter(gate: &'a StandbyGate) -> Self {
        gate.waiting.fetch_add(1, Ordering::SeqCst);
        gate.someone_waits.notify_one();
        Waiting(gate)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

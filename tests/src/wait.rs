//! Waiting for events. A test waits for the state it expects (a row, a log line, a
//! metric, a message), polling, and never for a fixed time; [`DEADLINE`] only turns a
//! hang into a failure.

use std::time::Duration;

use crate::{Process, TestDb};

/// The longest a test waits for an event: never an expectation of speed, only the
/// point where waiting longer would not help. Timing claims belong in benchmarks and
/// in the `slow_*` tests of `make chaos`.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// How often a probe runs.
const EVERY: Duration = Duration::from_millis(50);

/// Runs `probe` every 50 ms until it returns `Some`; panics with `what` after
/// [`DEADLINE`].
pub async fn poll_until<T>(what: &str, probe: impl AsyncFnMut() -> Option<T>) -> T {
    match poll_within(DEADLINE, probe).await {
        Some(value) => value,
        None => panic!("never within {DEADLINE:?}: {what}"),
    }
}

/// [`poll_until`] with another limit, returning `None` when `limit` passes first (for
/// callers that report instead of panicking, or that wait for a larger backlog).
pub async fn poll_within<T>(
    limit: Duration,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = probe().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(EVERY).await;
    }
}

impl TestDb {
    /// Polls `sql` (one row, one `bool` column) until it is true.
    pub async fn wait_for(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        what: &str,
    ) {
        poll_until(what, async || {
            let holds: bool = self
                .client()
                .query_one(sql, params)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .get(0);
            holds.then_some(())
        })
        .await;
    }
}

impl Process {
    /// Waits until the process has logged `marker` at least `times` times.
    pub async fn wait_for_log(&self, marker: &str, times: usize) {
        let logged = poll_within(DEADLINE, async || {
            (self.output_text().matches(marker).count() >= times).then_some(())
        })
        .await;
        assert!(
            logged.is_some(),
            "never logged {marker:?} {times} times:\n{}",
            self.output_text()
        );
    }
}

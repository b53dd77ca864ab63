//! The one runner every maintenance job goes through (see the crate documentation).

use std::future::Future;
use std::time::{Duration, Instant};

use std::sync::Arc;

use charges_runtime::readiness::Health;
use charges_store::statements::{self, Sql, Type};
use charges_store::{Pool, StoreError, Transaction};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::metrics;

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The run is complete; `n` rows were affected by this step.
    Done(u64),
    /// `n` rows were affected and there may be more: run another step now.
    More(u64),
}

/// A periodic maintenance job.
pub trait Job: Send + Sync + 'static {
    /// Its one name: the `task` metric label and log field, its file and (in
    /// `CamelCase`) its type; `snake_case`.
    const NAME: &'static str;

    /// How often it runs.
    fn interval(&self) -> Duration;

    /// `Some(key)`: at most one process runs a step of this job at a time (the step's
    /// transaction holds `pg_try_advisory_xact_lock(key)`; a busy lock skips the run).
    fn lock_key(&self) -> Option<i64>;

    /// One step, on its own transaction, which the runner commits.
    fn step(&self, tx: &Transaction<'_>) -> impl Future<Output = Result<Step, StoreError>> + Send;
}

/// How one run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    Ran {
        rows: u64,
    },
    /// Another process holds the job's lock.
    Skipped,
}

/// Runs `job` once, step after step, until it is done, another process holds its
/// lock, or `shutdown` is set (between steps: a step is never cut short). For one-shot
/// commands and for the runner's timer alike; records the job's metrics.
pub async fn run_once<J: Job>(
    pool: &Pool,
    job: &J,
    shutdown: &watch::Receiver<bool>,
) -> Result<RunOutcome, StoreError> {
    let started = Instant::now();
    let result = steps(pool, job, shutdown).await;
    metrics::run_finished(J::NAME, &result, started.elapsed());
    result
}

async fn steps<J: Job>(
    pool: &Pool,
    job: &J,
    shutdown: &watch::Receiver<bool>,
) -> Result<RunOutcome, StoreError> {
    let mut rows = 0;
    loop {
        let mut client = pool.get().await?;
        let tx = client.transaction().await?;
        if let Some(key) = job.lock_key()
            && !try_lock(&tx, key).await?
        {
            tracing::debug!(task = J::NAME, "another process is running this job");
            return Ok(if rows == 0 {
                RunOutcome::Skipped
            } else {
                RunOutcome::Ran { rows }
            });
        }
        let step = job.step(&tx).await?;
        tx.commit().await?;
        match step {
            Step::Done(n) => return Ok(RunOutcome::Ran { rows: rows + n }),
            Step::More(n) => rows += n,
        }
        if *shutdown.borrow() {
            return Ok(RunOutcome::Ran { rows });
        }
    }
}

/// `MaintenanceTryLock`: released when the step's transaction ends.
const TRY_LOCK: Sql = Sql::new(
    "SELECT pg_try_advisory_xact_lock($1) AS locked",
    &[Type::INT8],
);

async fn try_lock(tx: &Transaction<'_>, key: i64) -> Result<bool, StoreError> {
    Ok(statements::query_one(tx, &TRY_LOCK, &[&key])
        .await?
        .try_get("locked")?)
}

/// A job's task ended, which only a bug can make it do.
#[derive(Debug, thiserror::Error)]
#[error("maintenance job {task} stopped: {reason}")]
pub struct JobFailed {
    pub task: &'static str,
    pub reason: String,
}

/// Runs jobs on their intervals until shutdown.
pub struct JobRunner {
    pool: Pool,
    health: Arc<Health>,
    shutdown: watch::Receiver<bool>,
    tasks: JoinSet<()>,
    names: Vec<(tokio::task::Id, &'static str)>,
}

impl JobRunner {
    /// Jobs that keep failing are reported to `health` (the process's `/readyz`).
    pub fn new(pool: Pool, health: Arc<Health>, shutdown: watch::Receiver<bool>) -> JobRunner {
        JobRunner {
            pool,
            health,
            shutdown,
            tasks: JoinSet::new(),
            names: Vec::new(),
        }
    }

    /// Starts `job`: a run now, then one every interval.
    pub fn spawn<J: Job>(&mut self, job: J) {
        let name = J::NAME;
        let pool = self.pool.clone();
        let health = self.health.clone();
        let shutdown = self.shutdown.clone();
        let handle = self
            .tasks
            .spawn(every_interval(pool, job, health, shutdown));
        self.names.push((handle.id(), name));
    }

    /// Resolves when a job's task ends before shutdown, which means the process
    /// should exit; pending forever otherwise.
    pub async fn failed(&mut self) -> JobFailed {
        loop {
            let Some(ended) = self.tasks.join_next_with_id().await else {
                return std::future::pending().await;
            };
            if *self.shutdown.borrow() {
                continue;
            }
            let (id, reason) = match ended {
                Ok((id, ())) => (id, "its task returned".to_owned()),
                Err(e) => (e.id(), e.to_string()),
            };
            let task = self
                .names
                .iter()
                .find(|(spawned, _)| *spawned == id)
                .map_or("unknown", |(_, name)| name);
            return JobFailed { task, reason };
        }
    }

    /// After shutdown was signalled: waits for every job to finish its current step.
    pub async fn join(mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

async fn every_interval<J: Job>(
    pool: Pool,
    job: J,
    health: Arc<Health>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut failures = 0;
    let mut ticks = tokio::time::interval(job.interval());
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            changed = shutdown.changed() => if changed.is_err() { return },
        }
        if *shutdown.borrow() {
            return;
        }
        match run_once(&pool, &job, &shutdown).await {
            Ok(outcome) => {
                failures = 0;
                health.ok(J::NAME);
                if let RunOutcome::Ran { rows } = outcome
                    && rows > 0
                {
                    tracing::info!(task = J::NAME, rows, "maintenance job done");
                }
            }
            Err(e) => {
                failures += 1;
                let error = charges_runtime::error_chain(&e);
                tracing::warn!(task = J::NAME, %error, retry_in = ?job.interval(), "maintenance job failed");
                // An unreachable database already makes /readyz fail on its own.
                if !e.is_unavailable() {
                    health.failed(J::NAME, failures, error);
                }
            }
        }
    }
}

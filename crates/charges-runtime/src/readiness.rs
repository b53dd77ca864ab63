//! `/readyz` for every binary: the database answers, and its schema is at least the
//! version this build expects (a schema ahead is fine: migrations are additive, and
//! during a rolling deploy the old pods must stay ready).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use charges_store::Pool;
use pg_plumbing::migrations::{self, SchemaSet, SchemaStatus};

use crate::problem::Problem;

/// Probes give up after a second or two: answer before that even when the pool is
/// exhausted or the database does not respond.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a process is not ready, in words for the probe's caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotReady(pub String);

impl NotReady {
    /// The `/readyz` 503 body.
    pub fn problem(&self) -> Problem<'static> {
        Problem {
            kind: "/problems/not-ready",
            title: "Not ready",
            status: 503,
            detail: self.0.clone(),
        }
    }
}

/// Asks the database for its schema version, within [`READY_TIMEOUT`], and logs why
/// the answer is "not ready".
pub async fn check_database(pool: &Pool, schema: &[SchemaSet]) -> Result<(), NotReady> {
    let unreachable = || NotReady("the database cannot be reached".to_owned());
    match tokio::time::timeout(READY_TIMEOUT, migrations::status(pool, schema)).await {
        Ok(Ok(SchemaStatus::Current)) => Ok(()),
        Ok(Ok(SchemaStatus::Behind {
            set,
            current,
            expected,
        })) => {
            tracing::warn!(
                set,
                ?current,
                ?expected,
                "not ready: database schema is behind"
            );
            Err(NotReady(format!(
                "the database's {set} schema is at version {} but this build expects {}",
                version_text(current),
                version_text(expected)
            )))
        }
        Ok(Err(error)) => {
            tracing::warn!(error = %crate::error_chain(&error), "not ready: database unreachable");
            Err(unreachable())
        }
        Err(_) => {
            tracing::warn!("not ready: database did not answer in time");
            Err(unreachable())
        }
    }
}

/// Polls the schema every few seconds until it is at least this build's version, logging
/// once while it waits. `false` if `stop` (a shutdown signal) resolved first.
pub async fn wait_for_schema(
    pool: &Pool,
    schema: &[SchemaSet],
    stop: &mut (impl Future + Unpin),
) -> bool {
    let mut logged = false;
    loop {
        match migrations::status(pool, schema).await {
            Ok(SchemaStatus::Current) => return true,
            Ok(SchemaStatus::Behind {
                set,
                current,
                expected,
            }) if !logged => {
                tracing::warn!(
                    set,
                    ?current,
                    ?expected,
                    "waiting for the database schema: run the migrations"
                );
                logged = true;
            }
            Ok(SchemaStatus::Behind { .. }) => {}
            Err(error) => {
                tracing::warn!(error = %crate::error_chain(&error), "waiting for the database");
            }
        }
        tokio::select! {
            _ = &mut *stop => return false,
            () = tokio::time::sleep(SCHEMA_POLL) => {}
        }
    }
}

/// How often a process waiting for its schema looks again.
const SCHEMA_POLL: Duration = Duration::from_secs(2);

fn version_text(version: Option<i32>) -> String {
    version.map_or_else(|| "none".to_owned(), |v| v.to_string())
}

/// What a process knows about its own parts: the components (a maintenance job, the
/// relay's batch loops) that keep failing for a reason other than an unreachable
/// database. `/readyz` answers 503 naming them, so that a broken part is seen in
/// `kubectl get pods`, not only in the logs.
#[derive(Debug, Default)]
pub struct Health {
    failing: Mutex<BTreeMap<&'static str, String>>,
}

/// Consecutive failures after which a component counts as failing: one failure is a
/// blip worth a log line, three in a row are a state.
pub const FAILURES_BEFORE_NOT_READY: u32 = 3;

impl Health {
    /// `component` failed its `consecutive`-th time in a row with `reason`.
    pub fn failed(&self, component: &'static str, consecutive: u32, reason: String) {
        if consecutive < FAILURES_BEFORE_NOT_READY {
            return;
        }
        if let Ok(mut failing) = self.failing.lock()
            && failing.insert(component, reason.clone()).is_none()
        {
            tracing::error!(component, %reason, consecutive, "not ready: a component keeps failing");
        }
    }

    /// `component` worked.
    pub fn ok(&self, component: &'static str) {
        if let Ok(mut failing) = self.failing.lock()
            && failing.remove(component).is_some()
        {
            tracing::info!(component, "component works again");
        }
    }

    /// `Err` naming every failing component.
    pub fn check(&self) -> Result<(), NotReady> {
        let failing = match self.failing.lock() {
            Ok(failing) => failing,
            Err(poisoned) => poisoned.into_inner(),
        };
        if failing.is_empty() {
            return Ok(());
        }
        let parts: Vec<String> = failing
            .iter()
            .map(|(component, reason)| format!("{component} keeps failing: {reason}"))
            .collect();
        Err(NotReady(parts.join("; ")))
    }
}

//! `/readyz` for every binary: the database answers, and its schema is at least the
//! version this build expects (a schema ahead is fine: migrations are additive, and
//! during a rolling deploy the old pods must stay ready).

use std::time::Duration;

use charges_store::Pool;
use charges_store::migrations::{self, SchemaStatus};

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
pub async fn check_database(pool: &Pool) -> Result<(), NotReady> {
    let unreachable = || NotReady("the database cannot be reached".to_owned());
    match tokio::time::timeout(READY_TIMEOUT, migrations::status(pool)).await {
        Ok(Ok(SchemaStatus::Current { .. })) => Ok(()),
        Ok(Ok(SchemaStatus::Behind { current, expected })) => {
            tracing::warn!(?current, ?expected, "not ready: database schema is behind");
            Err(NotReady(format!(
                "the database schema is at version {} but this build expects {}",
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

fn version_text(version: Option<i32>) -> String {
    version.map_or_else(|| "none".to_owned(), |v| v.to_string())
}

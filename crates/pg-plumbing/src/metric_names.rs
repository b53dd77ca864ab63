//! The names of the counters this crate increments, under the embedding service's
//! namespace.
//!
//! A library cannot know the prefix its users' dashboards and alerts expect, and a
//! metric renamed under a running deployment silently empties its panels. So the
//! service names its namespace once, at start-up, before it builds a pool:
//! [`set_namespace`]`("payments")` makes the pool-timeout counter
//! `payments_db_pool_timeouts_total`. A process that never calls it gets `pg`.

use std::sync::OnceLock;

/// The namespace used when the service names none.
pub const DEFAULT_NAMESPACE: &str = "pg";

/// The counters this crate increments, fully named.
#[derive(Debug, PartialEq, Eq)]
pub struct MetricNames {
    /// The namespace itself, for crates that name metrics of their own under it (the
    /// outbox relay's `<ns>_relay_…`).
    pub namespace: &'static str,
    /// Waits for a pooled connection that timed out: `<ns>_db_pool_timeouts_total`.
    pub pool_timeouts: &'static str,
    /// Commits whose wait for synchronous replication was cancelled, each answered as
    /// a failure (see `unreplicated_commit`): `<ns>_db_unreplicated_commits_total`.
    pub unreplicated_commits: &'static str,
}

static NAMES: OnceLock<MetricNames> = OnceLock::new();

/// Names this crate's metrics `<namespace>_db_…` for the rest of the process. The
/// first call wins (a metric keeps one name for a process's life); it returns the
/// names in force, so a caller can tell whether its namespace was taken.
pub fn set_namespace(namespace: &str) -> &'static MetricNames {
    NAMES.get_or_init(|| MetricNames::under(namespace))
}

/// The names in force: the namespace set first, or [`DEFAULT_NAMESPACE`].
pub fn metric_names() -> &'static MetricNames {
    set_namespace(DEFAULT_NAMESPACE)
}

/// The namespace in force: the one set first, or [`DEFAULT_NAMESPACE`]. Asking fixes
/// it, as [`metric_names`] does, so a service sets its own before anything names a
/// metric.
pub fn namespace() -> &'static str {
    metric_names().namespace
}

impl MetricNames {
    fn under(namespace: &str) -> Self {
        // Leaked once per process: the `metrics` macros want `'static` names, and
        // formatting one per increment would allocate on every timeout.
        let name = |suffix: &str| -> &'static str {
            Box::leak(format!("{namespace}_{suffix}").into_boxed_str())
        };
        MetricNames {
            namespace: Box::leak(namespace.to_owned().into_boxed_str()),
            pool_timeouts: name("db_pool_timeouts_total"),
            unreplicated_commits: name("db_unreplicated_commits_total"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_namespace() {
        let names = MetricNames::under("payments");
        assert_eq!(names.namespace, "payments");
        assert_eq!(names.pool_timeouts, "payments_db_pool_timeouts_total");
        assert_eq!(
            names.unreplicated_commits,
            "payments_db_unreplicated_commits_total"
        );
    }
}

//! Every metric the maintenance jobs export. Labels hold job names only, under `task`:
//! Prometheus already gives every scraped series a `job` label (the scrape job).
//! Names say what they measure, not which process exports them: the outbox gauges are
//! `charges_outbox_*`, whoever runs `outbox_stats`.

use std::time::Duration;

use charges_store::{OutboxStats, StoreError};
use metrics_exporter_prometheus::Matcher;

use crate::runner::RunOutcome;

/// Counter: runs by `task` (the job) and `outcome` (`ok`, `skipped`, `failed`).
pub const RUNS: &str = "charges_maintenance_runs_total";
/// Counter: rows a job deleted, by `task`.
pub const ROWS: &str = "charges_maintenance_rows_total";
/// Histogram: one run, by `task`.
pub const DURATION: &str = "charges_maintenance_duration_seconds";
/// Gauge: Unix time of the last successful run, by `task` (alert when it stalls).
pub const LAST_SUCCESS: &str = "charges_maintenance_last_success_timestamp_seconds";

/// Gauge: outbox rows neither published nor dead (including rows waiting for a retry).
pub const OUTBOX_PENDING: &str = "charges_outbox_pending_rows";
/// Gauge: age of the oldest pending outbox row; 0 when none is pending.
pub const OUTBOX_OLDEST_PENDING_AGE: &str = "charges_outbox_oldest_pending_age_seconds";
/// Gauge: dead outbox rows (waiting for `charges-relay dead requeue`).
pub const OUTBOX_DEAD: &str = "charges_outbox_dead_rows";

/// The outbox gauges' names before they said what they measure, each with its new
/// name: deprecated, exported with the same values for one more release so that
/// dashboards and alerts can move (docs/operations.md, "Metrics"), then removed.
pub const DEPRECATED_OUTBOX_GAUGES: [(&str, &str); 3] = [
    ("charges_relay_outbox_pending_rows", OUTBOX_PENDING),
    (
        "charges_relay_outbox_oldest_pending_age_seconds",
        OUTBOX_OLDEST_PENDING_AGE,
    ),
    ("charges_relay_outbox_dead_rows", OUTBOX_DEAD),
];
/// Gauge: charges without their `ChargeCreated` outbox row. Must be 0.
pub const CHARGES_WITHOUT_OUTBOX: &str = "charges_reconcile_charges_without_outbox";
/// Gauge: committed `STARTED` idempotency keys older than the threshold. Must be 0.
pub const STALE_STARTED_KEYS: &str = "charges_reconcile_stale_started_idempotency_keys";
/// Gauge: Unix time the exported reconciliation counts were counted, by whichever
/// relay checked (alert when it stops moving).
pub const RECONCILE_CHECKED_AT: &str = "charges_reconcile_checked_at_timestamp_seconds";

/// A run takes from milliseconds (a gauge) to seconds (a backlog of deletes).
const DURATION_BUCKETS: &[f64] = &[0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0];

/// The histogram buckets to install with the process's recorder.
pub fn buckets() -> Vec<(Matcher, &'static [f64])> {
    vec![(Matcher::Full(DURATION.to_owned()), DURATION_BUCKETS)]
}

/// Describes every metric; call once after the recorder is installed.
pub fn describe() {
    metrics::describe_counter!(RUNS, "Maintenance job runs by job and outcome");
    metrics::describe_counter!(ROWS, "Rows deleted by maintenance jobs");
    metrics::describe_histogram!(
        DURATION,
        metrics::Unit::Seconds,
        "Maintenance job run duration"
    );
    metrics::describe_gauge!(
        LAST_SUCCESS,
        metrics::Unit::Seconds,
        "Unix time of the last successful run of a maintenance job"
    );
    metrics::describe_gauge!(OUTBOX_PENDING, "Outbox rows neither published nor dead");
    metrics::describe_gauge!(
        OUTBOX_OLDEST_PENDING_AGE,
        metrics::Unit::Seconds,
        "Age of the oldest pending outbox row"
    );
    metrics::describe_gauge!(OUTBOX_DEAD, "Dead outbox rows");
    for (old, new) in DEPRECATED_OUTBOX_GAUGES {
        metrics::describe_gauge!(old, format!("Deprecated: use {new}"));
    }
    metrics::describe_gauge!(
        CHARGES_WITHOUT_OUTBOX,
        "Charges without a ChargeCreated outbox row (must be 0)"
    );
    metrics::describe_gauge!(
        STALE_STARTED_KEYS,
        "Committed STARTED idempotency keys older than the threshold (must be 0)"
    );
    metrics::describe_gauge!(
        RECONCILE_CHECKED_AT,
        "Unix time the exported reconciliation counts were counted (by any relay)"
    );
}

pub(crate) fn run_finished(
    job: &'static str,
    result: &Result<RunOutcome, StoreError>,
    elapsed: Duration,
) {
    let outcome = match result {
        Ok(RunOutcome::Ran { rows }) => {
            metrics::counter!(ROWS, "task" => job).increment(*rows);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            metrics::gauge!(LAST_SUCCESS, "task" => job).set(now.as_secs_f64());
            "ok"
        }
        Ok(RunOutcome::Skipped) => "skipped",
        Err(_) => "failed",
    };
    metrics::counter!(RUNS, "task" => job, "outcome" => outcome).increment(1);
    metrics::histogram!(DURATION, "task" => job).record(elapsed.as_secs_f64());
}

pub(crate) fn outbox_stats(stats: &OutboxStats) {
    let values = [
        stats.pending as f64,
        stats.oldest_pending_age_seconds,
        stats.dead as f64,
    ];
    for ((old, new), value) in DEPRECATED_OUTBOX_GAUGES.into_iter().zip(values) {
        metrics::gauge!(new).set(value);
        metrics::gauge!(old).set(value);
    }
}

pub(crate) fn reconciled(counts: &charges_store::ReconciliationCounts) {
    metrics::gauge!(CHARGES_WITHOUT_OUTBOX).set(counts.charges_without_outbox as f64);
    metrics::gauge!(STALE_STARTED_KEYS).set(counts.stale_started_keys as f64);
    metrics::gauge!(RECONCILE_CHECKED_AT).set(counts.checked_at.timestamp_millis() as f64 / 1000.0);
}

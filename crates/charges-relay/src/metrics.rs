//! Prometheus metrics: the recorder and every metric name the relay exports.
//! Labels hold bounded values only (the topic, a table name).

use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// Gauge: outbox rows neither published nor dead (including rows waiting for a retry).
pub const OUTBOX_PENDING: &str = "charges_relay_outbox_pending_rows";
/// Gauge: age of the oldest pending outbox row; 0 when none is pending.
pub const OUTBOX_OLDEST_PENDING_AGE: &str = "charges_relay_outbox_oldest_pending_age_seconds";
/// Gauge: dead outbox rows (waiting for `charges-relay dead requeue`).
pub const OUTBOX_DEAD: &str = "charges_relay_outbox_dead_rows";
/// Counter: rows acknowledged by the broker and marked published, by `topic`.
pub const PUBLISHED: &str = "charges_relay_published_total";
/// Counter: failed publish attempts, by `topic`.
pub const PUBLISH_ERRORS: &str = "charges_relay_publish_errors_total";
/// Counter: rows this relay set dead, by `topic`.
pub const DEAD_LETTERED: &str = "charges_relay_dead_lettered_total";
/// Histogram: one non-empty batch, claim to commit.
pub const BATCH_DURATION: &str = "charges_relay_batch_duration_seconds";
/// Histogram: outbox insert (`created_at`) to broker acknowledgement.
pub const DELIVERY_LAG: &str = "charges_relay_delivery_lag_seconds";
/// Counter: rows deleted by retention, by `table`.
pub const RETENTION_DELETED: &str = "charges_relay_retention_deleted_total";
/// Gauge: charges without their `ChargeCreated` outbox row. Must be 0.
pub const CHARGES_WITHOUT_OUTBOX: &str = "charges_reconcile_charges_without_outbox";
/// Gauge: committed `STARTED` idempotency keys older than the threshold. Must be 0.
pub const STALE_STARTED_KEYS: &str = "charges_reconcile_stale_started_idempotency_keys";
/// Gauge: Unix time of the last successful reconciliation (alert when it stalls).
pub const RECONCILE_LAST_SUCCESS: &str = "charges_reconcile_last_success_timestamp_seconds";

/// A batch takes from milliseconds to the publish timeout.
const BATCH_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Delivery lag reaches minutes while the broker is down.
const LAG_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// How often histogram samples are folded into their buckets between scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Installs the process-wide recorder. Only the first call in a process succeeds.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    // Explicit buckets: the exporter's default (summaries) cannot be aggregated
    // across replicas.
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(BATCH_DURATION.to_owned()), BATCH_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(DELIVERY_LAG.to_owned()), LAG_BUCKETS)?
        .install_recorder()?;
    metrics::describe_gauge!(OUTBOX_PENDING, "Outbox rows neither published nor dead");
    metrics::describe_gauge!(
        OUTBOX_OLDEST_PENDING_AGE,
        metrics::Unit::Seconds,
        "Age of the oldest pending outbox row"
    );
    metrics::describe_gauge!(OUTBOX_DEAD, "Dead outbox rows");
    metrics::describe_counter!(PUBLISHED, "Outbox rows acknowledged and marked published");
    metrics::describe_counter!(PUBLISH_ERRORS, "Failed publish attempts");
    metrics::describe_counter!(DEAD_LETTERED, "Outbox rows set dead by this relay");
    metrics::describe_histogram!(
        BATCH_DURATION,
        metrics::Unit::Seconds,
        "Duration of a non-empty relay batch"
    );
    metrics::describe_histogram!(
        DELIVERY_LAG,
        metrics::Unit::Seconds,
        "Outbox insert to broker acknowledgement"
    );
    metrics::describe_counter!(RETENTION_DELETED, "Rows deleted by retention");
    metrics::describe_gauge!(
        CHARGES_WITHOUT_OUTBOX,
        "Charges without a ChargeCreated outbox row (must be 0)"
    );
    metrics::describe_gauge!(
        STALE_STARTED_KEYS,
        "Committed STARTED idempotency keys older than the threshold (must be 0)"
    );
    metrics::describe_gauge!(
        RECONCILE_LAST_SUCCESS,
        metrics::Unit::Seconds,
        "Unix time of the last successful reconciliation"
    );
    Ok(handle)
}

/// Keeps the recorder's memory bounded; runs until the task is aborted.
pub async fn upkeep(handle: PrometheusHandle) {
    let mut interval = tokio::time::interval(UPKEEP_INTERVAL);
    loop {
        interval.tick().await;
        handle.run_upkeep();
    }
}

pub fn batch_finished(topic: &str, published: u64, failed: usize, dead: usize, elapsed: Duration) {
    let topic = topic.to_owned();
    metrics::counter!(PUBLISHED, "topic" => topic.clone()).increment(published);
    metrics::counter!(PUBLISH_ERRORS, "topic" => topic.clone()).increment(failed as u64);
    metrics::counter!(DEAD_LETTERED, "topic" => topic).increment(dead as u64);
    metrics::histogram!(BATCH_DURATION).record(elapsed.as_secs_f64());
}

pub fn delivered(lag: Duration) {
    metrics::histogram!(DELIVERY_LAG).record(lag.as_secs_f64());
}

pub fn retention_deleted(table: &'static str, rows: u64) {
    metrics::counter!(RETENTION_DELETED, "table" => table).increment(rows);
}

pub fn outbox_stats(stats: &charges_store::OutboxStats) {
    metrics::gauge!(OUTBOX_PENDING).set(stats.pending as f64);
    metrics::gauge!(OUTBOX_OLDEST_PENDING_AGE).set(stats.oldest_pending_age_seconds);
    metrics::gauge!(OUTBOX_DEAD).set(stats.dead as f64);
}

pub fn reconciled(charges_without_outbox: i64, stale_started_keys: i64) {
    metrics::gauge!(CHARGES_WITHOUT_OUTBOX).set(charges_without_outbox as f64);
    metrics::gauge!(STALE_STARTED_KEYS).set(stale_started_keys as f64);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    metrics::gauge!(RECONCILE_LAST_SUCCESS).set(now.as_secs_f64());
}

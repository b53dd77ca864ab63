//! Prometheus metrics of the outbox relay itself. The backlog gauges and the
//! retention and reconciliation metrics belong to the maintenance jobs
//! (`charges_maintenance::metrics`). Labels hold bounded values only (the topic).

use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusHandle};

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
/// Gauge: 1 while this relay considers the broker available, 0 during an outage.
pub const BROKER_AVAILABLE: &str = "charges_relay_broker_available";
/// Counter: outages this relay declared (a batch with only availability errors).
pub const BROKER_OUTAGES: &str = "charges_relay_broker_outages_total";
/// Gauge: 1 while a LISTEN session wakes this relay on new rows, 0 while it only polls
/// (its listener connection is down, or it has none behind a transaction pooler).
pub const LISTENER_CONNECTED: &str = "charges_relay_listener_connected";
/// Gauge: bytes of WAL the replication gate's standby furthest behind lacked at the
/// last batch (-1: none of them streaming). Only with `--wait-for-standbys`.
pub const STANDBY_LAG: &str = "charges_relay_standby_lag_bytes";
/// Counter: batches rolled back because the standbys did not confirm their WAL in time.
pub const STANDBY_TIMEOUTS: &str = "charges_relay_standby_timeouts_total";

/// A batch takes from milliseconds to the publish timeout.
const BATCH_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Delivery lag reaches minutes while the broker is down.
const LAG_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// Installs the process-wide recorder with the relay's and the maintenance jobs'
/// histograms, and describes their metrics. Only the first call in a process succeeds.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let mut buckets = vec![
        (Matcher::Full(BATCH_DURATION.to_owned()), BATCH_BUCKETS),
        (Matcher::Full(DELIVERY_LAG.to_owned()), LAG_BUCKETS),
    ];
    buckets.extend(charges_maintenance::metrics::buckets());
    let handle = charges_runtime::metrics::install("charges-relay", &buckets)?;
    charges_maintenance::metrics::describe();
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
    metrics::describe_gauge!(
        BROKER_AVAILABLE,
        "1 while the broker takes messages, 0 while the relay waits out an outage"
    );
    metrics::describe_counter!(BROKER_OUTAGES, "Broker outages declared by this relay");
    metrics::describe_gauge!(
        STANDBY_LAG,
        "WAL bytes the gate's standby furthest behind lacked at the last batch (-1: none streaming)"
    );
    metrics::describe_counter!(
        STANDBY_TIMEOUTS,
        "Batches rolled back because the standbys did not confirm their WAL in time"
    );
    // Exported from the start, so that an alert on its increase has a series to read.
    metrics::counter!(STANDBY_TIMEOUTS).increment(0);
    metrics::describe_gauge!(
        LISTENER_CONNECTED,
        "1 while a LISTEN session wakes this relay, 0 while it only polls"
    );
    Ok(handle)
}

/// One batch's outcome on one topic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TopicCounts {
    pub published: u64,
    pub failed: u64,
    pub dead: u64,
}

pub fn published(topic: &str, counts: TopicCounts) {
    let topic = topic.to_owned();
    metrics::counter!(PUBLISHED, "topic" => topic.clone()).increment(counts.published);
    metrics::counter!(PUBLISH_ERRORS, "topic" => topic.clone()).increment(counts.failed);
    metrics::counter!(DEAD_LETTERED, "topic" => topic).increment(counts.dead);
}

pub fn batch_finished(elapsed: Duration) {
    metrics::histogram!(BATCH_DURATION).record(elapsed.as_secs_f64());
}

pub fn delivered(lag: Duration) {
    metrics::histogram!(DELIVERY_LAG).record(lag.as_secs_f64());
}

pub fn broker_available(available: bool) {
    metrics::gauge!(BROKER_AVAILABLE).set(if available { 1.0 } else { 0.0 });
    // Exported from the start, so that `increase()` sees the first outage.
    metrics::counter!(BROKER_OUTAGES).increment(0);
}

pub fn broker_outage_began() {
    broker_available(false);
    metrics::counter!(BROKER_OUTAGES).increment(1);
}

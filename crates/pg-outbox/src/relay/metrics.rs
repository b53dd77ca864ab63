//! Prometheus metrics of the relay engine, named `<ns>_relay_…` under `pg_plumbing`'s
//! namespace ([`pg_plumbing::set_namespace`], `pg` by default). The names are fixed
//! the first time one is asked for, so a service sets its namespace before it builds
//! its recorder's buckets ([`buckets`]) or starts a relay. Labels hold bounded values
//! only (the topic).
//!
//! The engine records; installing a recorder and serving `/metrics` is the binary's
//! business. It calls [`describe`] once its recorder is installed.

use std::sync::OnceLock;
use std::time::Duration;

/// The relay's metrics, fully named.
#[derive(Debug, PartialEq, Eq)]
pub struct RelayMetricNames {
    /// Counter: rows acknowledged by the broker and marked published, by `topic`.
    pub published: &'static str,
    /// Counter: failed publish attempts, by `topic`.
    pub publish_errors: &'static str,
    /// Counter: rows this relay set dead, by `topic`.
    pub dead_lettered: &'static str,
    /// Histogram: one non-empty batch, claim to commit.
    pub batch_duration: &'static str,
    /// Histogram: outbox insert (`created_at`) to broker acknowledgement.
    pub delivery_lag: &'static str,
    /// Gauge: 1 while this relay considers the broker available, 0 during an outage.
    pub broker_available: &'static str,
    /// Counter: outages this relay declared (a batch with only availability errors).
    pub broker_outages: &'static str,
    /// Gauge: 1 while a LISTEN session wakes this relay on new rows, 0 while it only
    /// polls (its listener connection is down, or it has none behind a transaction
    /// pooler).
    pub listener_connected: &'static str,
    /// Gauge: bytes of WAL the replication gate's standby furthest behind lacked at the
    /// last batch (-1: none of them streaming). Only with the gate on.
    pub standby_lag: &'static str,
    /// Counter: batches rolled back because the standbys did not confirm their WAL in
    /// time.
    pub standby_timeouts: &'static str,
}

impl RelayMetricNames {
    fn under(namespace: &str) -> RelayMetricNames {
        // Leaked once per process: the `metrics` macros want `'static` names, and
        // formatting one per record would allocate on every batch.
        let name = |suffix: &str| -> &'static str {
            Box::leak(format!("{namespace}_relay_{suffix}").into_boxed_str())
        };
        RelayMetricNames {
            published: name("published_total"),
            publish_errors: name("publish_errors_total"),
            dead_lettered: name("dead_lettered_total"),
            batch_duration: name("batch_duration_seconds"),
            delivery_lag: name("delivery_lag_seconds"),
            broker_available: name("broker_available"),
            broker_outages: name("broker_outages_total"),
            listener_connected: name("listener_connected"),
            standby_lag: name("standby_lag_bytes"),
            standby_timeouts: name("standby_timeouts_total"),
        }
    }
}

static NAMES: OnceLock<RelayMetricNames> = OnceLock::new();

/// The names in force, under the namespace `pg_plumbing` has (fixing it, if nothing
/// set one yet).
pub fn names() -> &'static RelayMetricNames {
    NAMES.get_or_init(|| RelayMetricNames::under(pg_plumbing::namespace()))
}

/// A batch takes from milliseconds to the publish timeout.
const BATCH_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Delivery lag reaches minutes while the broker is down.
const LAG_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// The histograms' buckets, `(full name, bucket bounds)`, for the binary's recorder
/// (without them a Prometheus exporter renders summaries, which cannot be aggregated
/// across replicas).
pub fn buckets() -> Vec<(&'static str, &'static [f64])> {
    let names = names();
    vec![
        (names.batch_duration, BATCH_BUCKETS),
        (names.delivery_lag, LAG_BUCKETS),
    ]
}

/// Describes every metric; call once after the recorder is installed.
pub fn describe() {
    let names = names();
    metrics::describe_counter!(
        names.published,
        "Outbox rows acknowledged and marked published"
    );
    metrics::describe_counter!(names.publish_errors, "Failed publish attempts");
    metrics::describe_counter!(names.dead_lettered, "Outbox rows set dead by this relay");
    metrics::describe_histogram!(
        names.batch_duration,
        metrics::Unit::Seconds,
        "Duration of a non-empty relay batch"
    );
    metrics::describe_histogram!(
        names.delivery_lag,
        metrics::Unit::Seconds,
        "Outbox insert to broker acknowledgement"
    );
    metrics::describe_gauge!(
        names.broker_available,
        "1 while the broker takes messages, 0 while the relay waits out an outage"
    );
    metrics::describe_counter!(
        names.broker_outages,
        "Broker outages declared by this relay"
    );
    metrics::describe_gauge!(
        names.standby_lag,
        "WAL bytes the gate's standby furthest behind lacked at the last batch (-1: none streaming)"
    );
    metrics::describe_counter!(
        names.standby_timeouts,
        "Batches rolled back because the standbys did not confirm their WAL in time"
    );
    // Exported from the start, so that an alert on its increase has a series to read.
    metrics::counter!(names.standby_timeouts).increment(0);
    metrics::describe_gauge!(
        names.listener_connected,
        "1 while a LISTEN session wakes this relay, 0 while it only polls"
    );
}

/// One batch's outcome on one topic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TopicCounts {
    pub published: u64,
    pub failed: u64,
    pub dead: u64,
}

pub fn published(topic: &str, counts: TopicCounts) {
    let names = names();
    let topic = topic.to_owned();
    metrics::counter!(names.published, "topic" => topic.clone()).increment(counts.published);
    metrics::counter!(names.publish_errors, "topic" => topic.clone()).increment(counts.failed);
    metrics::counter!(names.dead_lettered, "topic" => topic).increment(counts.dead);
}

pub fn batch_finished(elapsed: Duration) {
    metrics::histogram!(names().batch_duration).record(elapsed.as_secs_f64());
}

pub fn delivered(lag: Duration) {
    metrics::histogram!(names().delivery_lag).record(lag.as_secs_f64());
}

pub fn broker_available(available: bool) {
    let names = names();
    metrics::gauge!(names.broker_available).set(if available { 1.0 } else { 0.0 });
    // Exported from the start, so that `increase()` sees the first outage.
    metrics::counter!(names.broker_outages).increment(0);
}

pub fn broker_outage_began() {
    broker_available(false);
    metrics::counter!(names().broker_outages).increment(1);
}

pub fn listener_connected(connected: bool) {
    metrics::gauge!(names().listener_connected).set(if connected { 1.0 } else { 0.0 });
}

/// `lag`: bytes, or -1 when none of the gate's standbys streams.
pub fn standby_lag(lag: f64) {
    metrics::gauge!(names().standby_lag).set(lag);
}

pub fn standby_timed_out() {
    metrics::counter!(names().standby_timeouts).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_namespace() {
        let names = RelayMetricNames::under("payments");
        assert_eq!(names.published, "payments_relay_published_total");
        assert_eq!(names.standby_lag, "payments_relay_standby_lag_bytes");
        assert_eq!(names.delivery_lag, "payments_relay_delivery_lag_seconds");
    }
}

//! Prometheus metrics of the consumer. Labels hold bounded values only.

use metrics_exporter_prometheus::{BuildError, PrometheusHandle};

/// Counter: messages by `outcome`: `applied`, `duplicate` (already applied: skipped),
/// `parked` (not applied, kept for `parked replay`), `failed` (an attempt to apply
/// failed).
pub const EVENTS: &str = "charges_consumer_events_total";
/// Counter: events applied before their charge's previous event (`--ordering
/// per-aggregate`).
pub const OUT_OF_ORDER: &str = "charges_consumer_out_of_order_total";

/// Gauge: messages between this member's position and the end of each partition it
/// is assigned, by `partition` (from librdkafka's statistics, every 5 s).
pub const LAG: &str = "charges_consumer_lag_messages";

/// Installs the process-wide recorder and describes the metrics.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = charges_runtime::metrics::install("charges-consumer", &[])?;
    metrics::describe_counter!(EVENTS, "Messages handled, by outcome");
    metrics::describe_counter!(
        OUT_OF_ORDER,
        "Events applied before their charge's previous event"
    );
    for outcome in ["applied", "duplicate", "parked", "failed"] {
        metrics::counter!(EVENTS, "outcome" => outcome).increment(0);
    }
    metrics::counter!(OUT_OF_ORDER).increment(0);
    metrics::describe_gauge!(LAG, "Messages behind the end of each assigned partition");
    Ok(handle)
}

pub fn event(outcome: &'static str) {
    metrics::counter!(EVENTS, "outcome" => outcome).increment(1);
}

pub fn out_of_order() {
    metrics::counter!(OUT_OF_ORDER).increment(1);
}

pub fn lag(partition: i32, messages: i64) {
    metrics::gauge!(LAG, "partition" => partition.to_string()).set(messages as f64);
}

//! Prometheus metrics of the consumer. Labels hold bounded values only.

use metrics_exporter_prometheus::{BuildError, PrometheusHandle};

/// Counter: messages by `outcome`: `applied`, `duplicate` (already applied: skipped),
/// `skipped` (can never be applied: no id, undecodable), `failed` (an attempt to apply
/// failed and is retried).
pub const EVENTS: &str = "charges_consumer_events_total";
/// Counter: events applied before their charge's previous event (`--ordering
/// per-aggregate`).
pub const OUT_OF_ORDER: &str = "charges_consumer_out_of_order_total";

/// Installs the process-wide recorder and describes the metrics.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = charges_runtime::metrics::install(&[])?;
    metrics::describe_counter!(EVENTS, "Messages handled, by outcome");
    metrics::describe_counter!(
        OUT_OF_ORDER,
        "Events applied before their charge's previous event"
    );
    for outcome in ["applied", "duplicate", "skipped", "failed"] {
        metrics::counter!(EVENTS, "outcome" => outcome).increment(0);
    }
    metrics::counter!(OUT_OF_ORDER).increment(0);
    Ok(handle)
}

pub fn event(outcome: &'static str) {
    metrics::counter!(EVENTS, "outcome" => outcome).increment(1);
}

pub fn out_of_order() {
    metrics::counter!(OUT_OF_ORDER).increment(1);
}

//! The Prometheus recorder every binary installs, and its upkeep.

use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// How often histogram samples are folded into their buckets between scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Installs the process-wide recorder with explicit buckets for the histograms that
/// `buckets` names (without buckets the exporter renders summaries, which cannot be
/// aggregated across replicas). Only the first call in a process succeeds.
pub fn install(buckets: &[(Matcher, &[f64])]) -> Result<PrometheusHandle, BuildError> {
    let mut builder = PrometheusBuilder::new();
    for (matcher, values) in buckets {
        builder = builder.set_buckets_for_metric(matcher.clone(), values)?;
    }
    builder.install_recorder()
}

/// Keeps the recorder's memory bounded; runs until its task is dropped.
pub async fn upkeep(handle: PrometheusHandle) {
    let mut interval = tokio::time::interval(UPKEEP_INTERVAL);
    loop {
        interval.tick().await;
        handle.run_upkeep();
    }
}

/// The body of `GET /metrics`.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

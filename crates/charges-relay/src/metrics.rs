//! The Prometheus recorder of `charges-relay`: the relay engine's metrics
//! (`pg_outbox::relay::metrics`, `charges_relay_…`), the maintenance jobs' backlog,
//! retention and reconciliation metrics (`charges_maintenance::metrics`), and what
//! every charges binary exports (`charges_runtime::metrics`).

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusHandle};
use pg_outbox::relay::metrics as relay;

/// Installs the process-wide recorder with the relay's and the maintenance jobs'
/// histograms, and describes their metrics. Only the first call in a process succeeds.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    // Before the engine's names are first asked for (its buckets, just below): they
    // are fixed then, and its dashboards and alerts read `charges_relay_…`.
    pg_plumbing::set_namespace(charges_runtime::metrics::NAMESPACE);
    let mut buckets: Vec<(Matcher, &[f64])> = relay::buckets()
        .into_iter()
        .map(|(name, bounds)| (Matcher::Full(name.to_owned()), bounds))
        .collect();
    buckets.extend(charges_maintenance::metrics::buckets());
    let handle = charges_runtime::metrics::install("charges-relay", &buckets)?;
    charges_maintenance::metrics::describe();
    relay::describe();
    Ok(handle)
}

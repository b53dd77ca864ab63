//! The Prometheus recorder every binary installs, what every binary exports besides
//! its own metrics (build info, process metrics, the database pool), and `/metrics`.

use std::time::Duration;

use charges_store::Pool;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

/// Gauge, always 1: `binary` and `version` as labels, for dashboards and for alerts on
/// a fleet running mixed versions.
pub const BUILD_INFO: &str = "charges_build_info";
/// Gauge: connections the pool may open (`--db-pool-size` and the like).
pub const POOL_MAX: &str = "charges_db_pool_max_connections";
/// Gauge: connections the pool holds open now.
pub const POOL_OPEN: &str = "charges_db_pool_connections";
/// Gauge: open connections idle in the pool.
pub const POOL_IDLE: &str = "charges_db_pool_idle_connections";
/// Gauge: callers waiting for a connection.
pub const POOL_WAITING: &str = "charges_db_pool_waiting";
/// The namespace of the metrics the libraries name themselves (`pg-plumbing`'s
/// `charges_db_pool_timeouts_total` and `charges_db_unreplicated_commits_total`).
pub const NAMESPACE: &str = "charges";

/// How often histogram samples are folded into their buckets between scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The body of `GET /metrics`.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Installs the process-wide recorder with explicit buckets for the histograms that
/// `buckets` names (without buckets the exporter renders summaries, which cannot be
/// aggregated across replicas), and exports `binary`'s build info and the process and
/// pool metric descriptions. Only the first call in a process succeeds.
pub fn install(
    binary: &'static str,
    buckets: &[(Matcher, &[f64])],
) -> Result<PrometheusHandle, BuildError> {
    let mut builder = PrometheusBuilder::new();
    for (matcher, values) in buckets {
        builder = builder.set_buckets_for_metric(matcher.clone(), values)?;
    }
    let handle = builder.install_recorder()?;
    let plumbing = pg_plumbing::set_namespace(NAMESPACE);
    metrics::describe_gauge!(BUILD_INFO, "Always 1; the binary and its version as labels");
    metrics::gauge!(BUILD_INFO, "binary" => binary, "version" => env!("CARGO_PKG_VERSION"))
        .set(1.0);
    metrics::describe_gauge!(POOL_MAX, "Database connections the pool may open");
    metrics::describe_gauge!(POOL_OPEN, "Database connections open");
    metrics::describe_gauge!(POOL_IDLE, "Open database connections idle in the pool");
    metrics::describe_gauge!(POOL_WAITING, "Callers waiting for a database connection");
    metrics::describe_counter!(
        plumbing.pool_timeouts,
        "Waits for a database connection that timed out"
    );
    metrics::counter!(plumbing.pool_timeouts).increment(0);
    metrics::describe_counter!(
        plumbing.unreplicated_commits,
        "Commits whose wait for the synchronous standby was cancelled, reported as failed"
    );
    metrics::counter!(plumbing.unreplicated_commits).increment(0);
    metrics_process::Collector::default().describe();
    Ok(handle)
}

/// Keeps the recorder's memory bounded; runs until its task is dropped.
pub async fn upkeep(handle: PrometheusHandle) {
    let mut interval = tokio::time::interval(UPKEEP_INTERVAL);
    loop {
        interval.tick().await;
        handle.run_upkeep();
    }
}

/// The exposition text: the process and pool metrics are read now, then everything is
/// rendered.
pub fn render(handle: &PrometheusHandle, pool: &Pool) -> String {
    metrics_process::Collector::default().collect();
    let status = pool.status();
    metrics::gauge!(POOL_MAX).set(status.max_size as f64);
    metrics::gauge!(POOL_OPEN).set(status.size as f64);
    metrics::gauge!(POOL_IDLE).set(status.available as f64);
    metrics::gauge!(POOL_WAITING).set(status.waiting as f64);
    handle.render()
}

//! Prometheus metrics: the recorder, every metric name the API exports, and
//! `GET /metrics`. Labels only ever hold bounded values (route patterns, outcomes,
//! status codes): never an Idempotency-Key, an id or a concrete path.

use std::time::Duration;

use actix_web::{HttpResponse, web};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusHandle};

use crate::AppState;

/// Counter: idempotent requests by `endpoint` (route pattern) and `outcome`
/// (`created`, `replayed`, `payload_conflict`, `in_flight`, `invalid_key`).
pub const IDEMPOTENCY_REQUESTS: &str = "charges_api_idempotency_requests_total";
/// Histogram: request duration by `route` (pattern, or `unmatched`) and `status`.
pub const REQUEST_DURATION: &str = "charges_api_http_request_duration_seconds";

/// Request durations from 5 ms (a replay) to 10 s (past the statement timeout).
const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Installs the process-wide recorder. Only the first call in a process succeeds.
pub fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = charges_runtime::metrics::install(
        "charges-api",
        &[(Matcher::Suffix("_seconds".to_owned()), DURATION_BUCKETS)],
    )?;
    metrics::describe_counter!(
        IDEMPOTENCY_REQUESTS,
        "Requests with an Idempotency-Key, by endpoint (route pattern) and outcome"
    );
    metrics::describe_histogram!(
        REQUEST_DURATION,
        metrics::Unit::Seconds,
        "HTTP request duration by route pattern and status"
    );
    Ok(handle)
}

pub fn idempotency_outcome(route: &str, outcome: &'static str) {
    metrics::counter!(IDEMPOTENCY_REQUESTS, "endpoint" => route.to_owned(), "outcome" => outcome)
        .increment(1);
}

pub fn request_finished(route: String, status: u16, elapsed: Duration) {
    metrics::histogram!(REQUEST_DURATION, "route" => route, "status" => status.to_string())
        .record(elapsed.as_secs_f64());
}

/// `GET /metrics`: Prometheus text exposition format.
pub async fn render(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(charges_runtime::metrics::CONTENT_TYPE)
        .body(charges_runtime::metrics::render(
            &state.metrics,
            &state.pool,
        ))
}

//! The relay's operations port (`--metrics-listen`): `GET /metrics`, `GET /healthz`
//! (the process answers) and `GET /readyz` (the database answers and its schema is at
//! least the version this binary was built for), the same contract as the API's.

use std::net::SocketAddr;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use actix_web::{App, HttpResponse, HttpServer, web};
use charges_store::Pool;
use charges_store::migrations::{self, SchemaStatus};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::RelayError;

/// Probes time out after a second or two; answer before that even when the pool is
/// exhausted or the database does not respond.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

struct OpsState {
    pool: Pool,
    metrics: PrometheusHandle,
}

/// Binds `addr` and serves on the current Tokio runtime until the returned handle is
/// stopped. Signals are the relay's to handle, not actix's.
pub fn start(
    addr: SocketAddr,
    pool: Pool,
    metrics: PrometheusHandle,
) -> Result<(ServerHandle, Vec<SocketAddr>), RelayError> {
    let state = web::Data::new(OpsState { pool, metrics });
    let server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .route("/metrics", web::get().to(render))
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .bind(addr)
    .map_err(|e| RelayError::MetricsListen(addr, e))?;
    let addrs = server.addrs();
    let server = server.run();
    let handle = server.handle();
    tokio::spawn(async move {
        if let Err(e) = server.await {
            tracing::error!(error = %e, "operations server failed");
        }
    });
    Ok((handle, addrs))
}

async fn render(state: web::Data<OpsState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(state.metrics.render())
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn readyz(state: web::Data<OpsState>) -> HttpResponse {
    let detail = match tokio::time::timeout(READY_TIMEOUT, migrations::status(&state.pool)).await {
        Ok(Ok(SchemaStatus::Current { .. })) => {
            return HttpResponse::Ok()
                .content_type("text/plain")
                .body("ready\n");
        }
        Ok(Ok(SchemaStatus::Behind { current, expected })) => {
            tracing::warn!(?current, ?expected, "not ready: database schema is behind");
            format!(
                "the database schema is at version {} but this build expects {}",
                version_text(current),
                version_text(expected)
            )
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %crate::error_chain(&e), "not ready: database unreachable");
            "the database cannot be reached".to_owned()
        }
        Err(_) => {
            tracing::warn!("not ready: database did not answer in time");
            "the database cannot be reached".to_owned()
        }
    };
    let problem = serde_json::json!({
        "type": "/problems/not-ready",
        "title": "Not ready",
        "status": StatusCode::SERVICE_UNAVAILABLE.as_u16(),
        "detail": detail,
    });
    HttpResponse::ServiceUnavailable()
        .content_type("application/problem+json")
        .insert_header(("retry-after", "1"))
        .body(problem.to_string())
}

fn version_text(version: Option<i32>) -> String {
    version.map_or_else(|| "none".to_owned(), |v| v.to_string())
}

//! The operations port of the background processes (`charges-relay`, and any process
//! without an HTTP API of its own): `GET /metrics`, `GET /healthz` (the process
//! answers) and `GET /readyz` ([`crate::readiness`]). The API serves the same three
//! routes on its own port.

use std::net::SocketAddr;

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpResponse, HttpServer, web};
use charges_store::Pool;
use metrics_exporter_prometheus::PrometheusHandle;
use pg_plumbing::SchemaSet;

use std::sync::Arc;

use crate::problem::PROBLEM_JSON;
use crate::readiness::{self, Health};

struct OpsState {
    pool: Pool,
    /// The schema sets this process needs (`/readyz` compares them).
    schema: Vec<SchemaSet>,
    metrics: PrometheusHandle,
    health: Arc<Health>,
}

/// A running operations server.
pub struct OpsServer {
    handle: ServerHandle,
    /// The bound addresses (port 0 resolved).
    pub addrs: Vec<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
#[error("binding the operations listener on {addr} failed")]
pub struct OpsBindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

impl OpsServer {
    /// Binds `addr` and serves on the current Tokio runtime until [`OpsServer::stop`].
    /// Signals are the process's to handle, not actix's.
    pub fn start(
        addr: SocketAddr,
        pool: Pool,
        schema: Vec<SchemaSet>,
        metrics: PrometheusHandle,
        health: Arc<Health>,
    ) -> Result<OpsServer, OpsBindError> {
        let state = web::Data::new(OpsState {
            pool,
            schema,
            metrics,
            health,
        });
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
        .map_err(|source| OpsBindError { addr, source })?;
        let addrs = server.addrs();
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "operations server failed");
            }
        });
        Ok(OpsServer { handle, addrs })
    }

    /// The first bound address as text, for the start-up log line.
    pub fn addr_text(&self) -> String {
        self.addrs
            .first()
            .map_or_else(String::new, ToString::to_string)
    }

    pub async fn stop(self) {
        self.handle.stop(true).await;
    }
}

async fn render(state: web::Data<OpsState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(crate::metrics::CONTENT_TYPE)
        .body(crate::metrics::render(&state.metrics, &state.pool))
}

/// Liveness: the process answers. Nothing outside it (database, broker) can make it
/// fail: restarting a process does not bring a database back.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn readyz(state: web::Data<OpsState>) -> HttpResponse {
    let ready = match readiness::check_database(&state.pool, &state.schema).await {
        Ok(()) => state.health.check(),
        Err(not_ready) => Err(not_ready),
    };
    match ready {
        Ok(()) => HttpResponse::Ok()
            .content_type("text/plain")
            .body("ready\n"),
        Err(not_ready) => HttpResponse::ServiceUnavailable()
            .content_type(PROBLEM_JSON)
            .insert_header(("retry-after", "1"))
            .body(not_ready.problem().to_json()),
    }
}

//! Routes, shared state, and the server's lifecycle.

use actix_web::{App, HttpResponse, HttpServer, middleware, web};
use charges_store::{IdempotencyStore, Pool};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::cli::ServeArgs;
use crate::problem::ApiError;
use crate::{charges, health, metrics, refunds, request_id};

/// What every worker shares.
pub struct AppState {
    pub pool: Pool,
    pub idempotency: IdempotencyStore,
    pub max_body_bytes: usize,
    pub metrics: PrometheusHandle,
}

/// Registers every route on an actix `App`.
pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(
            web::resource("/charges")
                .route(web::post().to(charges::create))
                .default_service(allow("POST")),
        )
        .service(
            web::resource("/charges/{id}")
                .route(web::get().to(charges::get))
                .default_service(allow("GET")),
        )
        .service(
            web::resource("/charges/{id}/refunds")
                .route(web::post().to(refunds::create))
                .default_service(allow("POST")),
        )
        .service(
            web::resource("/healthz")
                .route(web::get().to(health::healthz))
                .default_service(allow("GET")),
        )
        .service(
            web::resource("/readyz")
                .route(web::get().to(health::readyz))
                .default_service(allow("GET")),
        )
        .service(
            web::resource("/metrics")
                .route(web::get().to(metrics::render))
                .default_service(allow("GET")),
        )
        .default_service(web::to(not_found));
}

async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}

/// A resource's answer to any method it does not serve.
fn allow(methods: &'static str) -> actix_web::Route {
    web::to(
        move || async move { Err::<HttpResponse, _>(ApiError::MethodNotAllowed { allow: methods }) },
    )
}

/// Serves until SIGTERM or SIGINT, then stops accepting, lets in-flight requests finish
/// (at most `shutdown_timeout`) and returns. `metrics` is the installed recorder's
/// handle ([`metrics::install`]).
pub async fn serve(pool: Pool, args: &ServeArgs, metrics: PrometheusHandle) -> std::io::Result<()> {
    actix_web::rt::spawn(metrics::upkeep(metrics.clone()));
    let state = web::Data::new(AppState {
        pool,
        idempotency: IdempotencyStore::new(args.idempotency_ttl),
        max_body_bytes: args.max_body_bytes,
        metrics,
    });
    let mut server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            .wrap(middleware::from_fn(request_id::middleware))
            .configure(routes)
    })
    .shutdown_timeout(args.shutdown_timeout.as_secs())
    .client_request_timeout(args.client_request_timeout)
    .keep_alive(args.keep_alive);
    if let Some(workers) = args.workers {
        server = server.workers(workers);
    }
    let server = server.bind(args.listen)?;
    for addr in server.addrs() {
        tracing::info!(%addr, "listening");
    }
    server.run().await?;
    tracing::info!("stopped");
    Ok(())
}

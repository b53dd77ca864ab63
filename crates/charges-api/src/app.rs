//! Routes, shared state, and the server's lifecycle.

use actix_web::{App, HttpResponse, HttpServer, middleware, web};
use charges_store::{IdempotencyStore, Pool};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::auth::{self, ApiKeys};
use crate::cli::ServeArgs;
use crate::problem::ApiError;
use crate::{charges, health, metrics, refunds, request_id};

/// What every worker shares.
pub struct AppState {
    pub pool: Pool,
    pub idempotency: IdempotencyStore,
    pub max_body_bytes: usize,
    /// The whole request body must arrive within this (`--client-request-timeout`).
    pub body_timeout: std::time::Duration,
    pub metrics: PrometheusHandle,
    /// `None`: authentication off (see `auth`).
    pub api_keys: Option<ApiKeys>,
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
/// handle ([`metrics::install`]). `api_keys` turns authentication on.
pub async fn serve(
    pool: Pool,
    args: &ServeArgs,
    metrics: PrometheusHandle,
    api_keys: Option<ApiKeys>,
) -> std::io::Result<()> {
    actix_web::rt::spawn(charges_runtime::metrics::upkeep(metrics.clone()));
    match &api_keys {
        // The count only: client ids are not secret, but a log needs none of them.
        Some(keys) => tracing::info!(keys = keys.len(), "API-key authentication on"),
        None => tracing::warn!("API-key authentication off: no API keys configured"),
    }
    let state = web::Data::new(AppState {
        pool,
        idempotency: IdempotencyStore::with_replay_cache(
            args.idempotency_ttl,
            args.replay_cache_entries as usize,
        ),
        max_body_bytes: args.max_body_bytes as usize,
        body_timeout: args.client_request_timeout,
        metrics,
        api_keys,
    });
    let mut server = HttpServer::new(move || {
        App::new()
            .app_data(state.clone())
            // The last `wrap` is the outermost: request ids and the access log cover
            // the 401s too.
            .wrap(middleware::from_fn(auth::middleware))
            .wrap(middleware::from_fn(request_id::middleware))
            .configure(routes)
    })
    .shutdown_timeout(args.shutdown_timeout.as_secs())
    .client_request_timeout(args.client_request_timeout)
    .keep_alive(args.keep_alive);
    if let Some(workers) = args.workers {
        server = server.workers(workers as usize);
    }
    let server = server.bind(args.listen)?;
    for addr in server.addrs() {
        tracing::info!(%addr, "listening");
    }
    server.run().await?;
    tracing::info!("stopped");
    Ok(())
}

//! Routes, shared state, and the server's lifecycle.

use actix_web::{App, HttpResponse, HttpServer, web};
use charges_store::{IdempotencyStore, Pool};

use crate::charges;
use crate::cli::ServeArgs;
use crate::problem::ApiError;

/// What every worker shares.
pub struct AppState {
    pub pool: Pool,
    pub idempotency: IdempotencyStore,
    pub max_body_bytes: usize,
}

/// Registers every route on an actix `App`.
pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(
            web::resource("/charges")
                .route(web::post().to(charges::create))
                .default_service(web::to(method_not_allowed)),
        )
        .default_service(web::to(not_found));
}

async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}

async fn method_not_allowed() -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed)
}

/// Serves until SIGTERM or SIGINT, then stops accepting, lets in-flight requests finish
/// (at most `shutdown_timeout`) and returns.
pub async fn serve(pool: Pool, args: &ServeArgs) -> std::io::Result<()> {
    let state = web::Data::new(AppState {
        pool,
        idempotency: IdempotencyStore::new(args.idempotency_ttl),
        max_body_bytes: args.max_body_bytes,
    });
    let mut server = HttpServer::new(move || App::new().app_data(state.clone()).configure(routes))
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

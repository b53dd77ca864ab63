//! `GET /healthz` and `GET /readyz`, the same contract as every binary's
//! (`charges_runtime::readiness`).

use actix_web::{HttpResponse, web};

use crate::AppState;
use crate::problem::ApiError;

pub use charges_runtime::ops::healthz;

pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    charges_runtime::readiness::check_database(&state.pool, &charges_store::migrations::sets())
        .await?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain")
        .body("ready\n"))
}

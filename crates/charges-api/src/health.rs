//! `GET /healthz` (the process answers) and `GET /readyz` (the database answers and
//! its schema is at least the version this binary was built for).

use actix_web::{HttpResponse, web};
use charges_store::migrations::{self, SchemaStatus};

use crate::AppState;
use crate::problem::ApiError;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

/// Bounded by the pool's acquire and statement timeouts, so a probe never hangs.
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    match migrations::status(&state.pool).await {
        Ok(SchemaStatus::Current { .. }) => Ok(HttpResponse::Ok()
            .content_type("text/plain")
            .body("ready\n")),
        Ok(SchemaStatus::Behind { current, expected }) => {
            tracing::warn!(?current, ?expected, "not ready: database schema is behind");
            Err(ApiError::NotReady {
                reason: format!(
                    "the database schema is at version {} but this build expects {}",
                    version_text(current),
                    version_text(expected)
                ),
            })
        }
        Err(error) => {
            tracing::warn!(error = %charges_runtime::error_chain(&error), "not ready: database unreachable");
            Err(ApiError::NotReady {
                reason: "the database cannot be reached".to_owned(),
            })
        }
    }
}

fn version_text(version: Option<i32>) -> String {
    version.map_or_else(|| "none".to_owned(), |v| v.to_string())
}

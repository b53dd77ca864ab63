//! Every error the API answers, mapped to HTTP in exactly one place, as RFC 9457
//! `application/problem+json`. Storage failures are logged with their whole chain and
//! answered with an opaque body: no SQL, no driver text ever reaches a client.

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use charges_domain::{ChargeRequestError, InvalidIdempotencyKey};
use charges_store::StoreError;
use serde::Serialize;

use crate::telemetry;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// Seconds a client should wait before retrying a 409 or a 503.
const RETRY_AFTER_SECONDS: &str = "1";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("the request body must be application/json")]
    UnsupportedMediaType,
    #[error(transparent)]
    InvalidIdempotencyKey(#[from] InvalidIdempotencyKey),
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("the request body could not be read")]
    UnreadableBody,
    #[error(transparent)]
    InvalidCharge(#[from] ChargeRequestError),
    #[error(
        "a request with this Idempotency-Key is still being processed; retry after it completes"
    )]
    KeyInFlight,
    #[error("this Idempotency-Key was already used with a different request body")]
    KeyReusedWithDifferentPayload,
    #[error("no resource at this path")]
    NotFound,
    #[error("this method is not allowed on this resource")]
    MethodNotAllowed,
    #[error("storage failure")]
    Store(#[from] StoreError),
}

/// The RFC 9457 body. `type` is a URI reference relative to the API's base URL; the
/// README lists every problem type.
#[derive(Debug, Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    title: &'a str,
    status: u16,
    detail: String,
}

impl ApiError {
    /// `(type, title)`: stable identifiers a client can switch on.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::UnsupportedMediaType => {
                ("/problems/unsupported-media-type", "Unsupported media type")
            }
            ApiError::InvalidIdempotencyKey(_) => (
                "/problems/invalid-idempotency-key",
                "Invalid Idempotency-Key",
            ),
            ApiError::PayloadTooLarge { .. } => {
                ("/problems/payload-too-large", "Request body too large")
            }
            ApiError::UnreadableBody => ("/problems/invalid-request-body", "Invalid request body"),
            ApiError::InvalidCharge(_) => {
                ("/problems/invalid-request-body", "Invalid request body")
            }
            ApiError::KeyInFlight => ("/problems/idempotency-key-in-flight", "Request in progress"),
            ApiError::KeyReusedWithDifferentPayload => (
                "/problems/idempotency-key-reused",
                "Idempotency-Key reused with a different request",
            ),
            ApiError::NotFound => ("/problems/not-found", "Not found"),
            ApiError::MethodNotAllowed => ("/problems/method-not-allowed", "Method not allowed"),
            ApiError::Store(e) if e.is_unavailable() => {
                ("/problems/service-unavailable", "Service unavailable")
            }
            ApiError::Store(_) => ("/problems/internal-error", "Internal error"),
        }
    }

    /// What the client is told. Storage errors say nothing about their cause.
    fn detail(&self) -> String {
        match self {
            ApiError::Store(e) if e.is_unavailable() => {
                "the service cannot reach its database right now; retry with the same Idempotency-Key".to_owned()
            }
            ApiError::Store(_) => {
                "an unexpected error occurred; nothing was stored, retry with the same Idempotency-Key".to_owned()
            }
            other => other.to_string(),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::InvalidIdempotencyKey(_)
            | ApiError::UnreadableBody
            | ApiError::InvalidCharge(_) => StatusCode::BAD_REQUEST,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::KeyInFlight => StatusCode::CONFLICT,
            ApiError::KeyReusedWithDifferentPayload => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Store(e) if e.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        if let ApiError::Store(error) = self {
            tracing::error!(error = %telemetry::chain(error), %status, "request failed in storage");
        }
        let (kind, title) = self.kind();
        let problem = Problem {
            kind,
            title,
            status: status.as_u16(),
            detail: self.detail(),
        };
        let mut response = HttpResponse::build(status);
        response.insert_header((header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON)));
        if matches!(
            status,
            StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE
        ) {
            response.insert_header((
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECONDS),
            ));
        }
        if status == StatusCode::METHOD_NOT_ALLOWED {
            response.insert_header((header::ALLOW, HeaderValue::from_static("POST")));
        }
        match serde_json::to_string(&problem) {
            Ok(body) => response.body(body),
            Err(_) => response.finish(),
        }
    }
}

//! Every error the API answers, mapped to HTTP in exactly one place, as RFC 9457
//! `application/problem+json`. Storage failures are logged with their whole chain and
//! answered with an opaque body: no SQL, no driver text ever reaches a client.

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use charges_domain::{
    ChargeRequestError, InvalidIdempotencyKey, RefundRefused, RefundRequestError,
};
use charges_runtime::problem::Problem;
use charges_runtime::readiness::NotReady;
use charges_store::StoreError;
use charges_store::StoredResponse;

pub use charges_runtime::problem::PROBLEM_JSON;

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
    #[error(transparent)]
    InvalidRefund(#[from] RefundRequestError),
    #[error("the charge id in the path must be a UUID")]
    InvalidChargeId,
    #[error("no charge with this id")]
    ChargeNotFound,
    #[error(transparent)]
    RefundRefused(#[from] RefundRefused),
    #[error(
        "a request with this Idempotency-Key is still being processed; retry after it completes"
    )]
    KeyInFlight,
    #[error("this Idempotency-Key was already used with a different request body")]
    KeyReusedWithDifferentPayload,
    #[error("no resource at this path")]
    NotFound,
    #[error("this method is not allowed on this resource (allowed: {allow})")]
    MethodNotAllowed { allow: &'static str },
    #[error("this API requires `Authorization: Bearer <API key>`")]
    MissingCredentials,
    #[error("the API key is not valid")]
    InvalidCredentials,
    #[error("storage failure")]
    Store(#[from] StoreError),
    /// A response or event could not be serialized: a bug, never the client's fault.
    #[error("encoding {what} as JSON failed")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("not ready: {0}")]
    NotReady(#[from] NotReady),
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
            ApiError::InvalidCharge(_) | ApiError::InvalidRefund(_) => {
                ("/problems/invalid-request-body", "Invalid request body")
            }
            ApiError::InvalidChargeId => ("/problems/invalid-charge-id", "Invalid charge id"),
            ApiError::ChargeNotFound => ("/problems/charge-not-found", "Charge not found"),
            ApiError::RefundRefused(_) => (
                "/problems/refund-exceeds-charge",
                "Refund exceeds the charge",
            ),
            ApiError::KeyInFlight => ("/problems/idempotency-key-in-flight", "Request in progress"),
            ApiError::KeyReusedWithDifferentPayload => (
                "/problems/idempotency-key-reused",
                "Idempotency-Key reused with a different request",
            ),
            ApiError::NotFound => ("/problems/not-found", "Not found"),
            ApiError::MissingCredentials | ApiError::InvalidCredentials => {
                ("/problems/unauthorized", "Unauthorized")
            }
            ApiError::MethodNotAllowed { .. } => {
                ("/problems/method-not-allowed", "Method not allowed")
            }
            ApiError::Store(e) if e.is_unavailable() => {
                ("/problems/service-unavailable", "Service unavailable")
            }
            ApiError::Store(_) | ApiError::Encode { .. } => {
                ("/problems/internal-error", "Internal error")
            }
            ApiError::NotReady(_) => ("/problems/not-ready", "Not ready"),
        }
    }

    /// What the client is told. Storage errors say nothing about their cause.
    fn detail(&self) -> String {
        match self {
            ApiError::Store(e) if e.is_unavailable() => {
                "the service cannot reach its database right now; retry with the same Idempotency-Key".to_owned()
            }
            ApiError::Store(_) | ApiError::Encode { .. } => {
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
            | ApiError::InvalidCharge(_)
            | ApiError::InvalidRefund(_)
            | ApiError::InvalidChargeId => StatusCode::BAD_REQUEST,
            ApiError::ChargeNotFound => StatusCode::NOT_FOUND,
            ApiError::RefundRefused(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::KeyInFlight => StatusCode::CONFLICT,
            ApiError::KeyReusedWithDifferentPayload => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MissingCredentials | ApiError::InvalidCredentials => StatusCode::UNAUTHORIZED,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Store(e) if e.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Store(_) | ApiError::Encode { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::NotReady(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        match self {
            ApiError::Store(error) => {
                tracing::error!(error = %charges_runtime::error_chain(error), %status, "request failed in storage");
            }
            ApiError::Encode { .. } => {
                tracing::error!(error = %charges_runtime::error_chain(self), %status, "request failed");
            }
            _ => {}
        }
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
        // RFC 6750 §3: no error code when no credentials were sent.
        match self {
            ApiError::MissingCredentials => {
                response.insert_header((
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(r#"Bearer realm="charges""#),
                ));
            }
            ApiError::InvalidCredentials => {
                response.insert_header((
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(r#"Bearer realm="charges", error="invalid_token""#),
                ));
            }
            _ => {}
        }
        if let ApiError::MethodNotAllowed { allow } = self {
            response.insert_header((header::ALLOW, HeaderValue::from_static(allow)));
        }
        response.body(self.problem_body())
    }
}

impl ApiError {
    fn problem_body(&self) -> String {
        let (kind, title) = self.kind();
        let problem = Problem {
            kind,
            title,
            status: self.status_code().as_u16(),
            detail: self.detail(),
        };
        problem.to_json()
    }

    /// The problem as a response to remember under an Idempotency-Key, for refusals
    /// that are the result of executing the request.
    pub fn to_stored(&self) -> StoredResponse {
        StoredResponse {
            status: self.status_code().as_u16(),
            headers: vec![(header::CONTENT_TYPE.to_string(), PROBLEM_JSON.to_owned())],
            body: self.problem_body(),
        }
    }
}

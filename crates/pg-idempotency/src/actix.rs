//! The HTTP side for actix-web (feature `actix-web`): the `Idempotency-Key` header, the
//! stored response replayed with `Idempotent-Replayed: true`, and the refusals as RFC
//! 9457 `application/problem+json`.
//!
//! A service that maps errors to HTTP in one place of its own uses [`key_from`] and
//! [`stored_response`] and keeps its own problem types; one that has none returns
//! [`respond`]'s [`IdempotencyRejection`] from its handler as it is.

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use pg_plumbing::StoreError;

use crate::{IdempotencyKey, IdempotentOutcome, InvalidIdempotencyKey, StoredResponse};

/// The request header, lower case as actix-web matches it.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set to `true` on a response served from a key's stored response.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
pub const PROBLEM_JSON: &str = "application/problem+json";
/// Seconds a client should wait before retrying an in-flight key or an unavailable
/// database: long enough for the first request to commit.
const RETRY_AFTER_SECONDS: &str = "1";

/// Exactly one `Idempotency-Key` header, parsed. Several headers are refused rather
/// than guessed at, since they could name different operations.
pub fn key_from(request: &HttpRequest) -> Result<IdempotencyKey, InvalidIdempotencyKey> {
    let mut values = request.headers().get_all(IDEMPOTENCY_KEY);
    let first = values.next().ok_or(InvalidIdempotencyKey::Missing)?;
    if values.next().is_some() {
        return Err(InvalidIdempotencyKey::Repeated);
    }
    IdempotencyKey::parse(first.as_bytes())
}

/// The stored response as sent, byte for byte: status, its headers (JSON unless they
/// say otherwise) and body, marked when it is a replay.
pub fn stored_response(stored: StoredResponse, replayed: bool) -> HttpResponse {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::build(status);
    response.insert_header((
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    ));
    for (name, value) in &stored.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            response.insert_header((name, value));
        }
    }
    if replayed {
        response.insert_header((
            HeaderName::from_static(IDEMPOTENT_REPLAYED),
            HeaderValue::from_static("true"),
        ));
    }
    response.body(stored.body)
}

/// Why a request was not run under its key.
#[derive(Debug, thiserror::Error)]
pub enum IdempotencyRejection {
    #[error(transparent)]
    InvalidKey(#[from] InvalidIdempotencyKey),
    #[error(
        "a request with this Idempotency-Key is still being processed; retry after it completes"
    )]
    InFlight,
    #[error("this Idempotency-Key was already used with a different request body")]
    PayloadConflict,
    /// The body is not a request this endpoint takes: refused before the key is
    /// reserved, so the key stays free for a corrected request.
    #[error("{0}")]
    InvalidRequest(String),
    /// The database failed; whether a retry may work is the error's to say.
    #[error("the request could not be stored")]
    Store(#[from] StoreError),
}

/// The response for an outcome: the stored one (marked when replayed), or a refusal.
pub fn respond(outcome: IdempotentOutcome) -> Result<HttpResponse, IdempotencyRejection> {
    match outcome {
        IdempotentOutcome::Executed(stored) => Ok(stored_response(stored, false)),
        IdempotentOutcome::Replayed(stored) => Ok(stored_response(stored, true)),
        IdempotentOutcome::InFlight => Err(IdempotencyRejection::InFlight),
        IdempotentOutcome::PayloadConflict => Err(IdempotencyRejection::PayloadConflict),
    }
}

impl IdempotencyRejection {
    /// `(type, title)`: stable identifiers a client can switch on.
    fn kind(&self) -> (&'static str, &'static str) {
        match self {
            Self::InvalidKey(_) => (
                "/problems/invalid-idempotency-key",
                "Invalid Idempotency-Key",
            ),
            Self::InFlight => ("/problems/idempotency-key-in-flight", "Request in progress"),
            Self::PayloadConflict => (
                "/problems/idempotency-key-reused",
                "Idempotency-Key reused with a different request",
            ),
            Self::InvalidRequest(_) => ("/problems/invalid-request-body", "Invalid request body"),
            Self::Store(e) if e.is_unavailable() => {
                ("/problems/service-unavailable", "Service unavailable")
            }
            Self::Store(_) => ("/problems/internal-error", "Internal error"),
        }
    }

    /// What the client is told: a storage failure says nothing of its cause.
    fn detail(&self) -> String {
        match self {
            Self::Store(e) if e.is_unavailable() => "the database cannot be reached right now; \
                 retry with the same Idempotency-Key"
                .to_owned(),
            Self::Store(_) => "an unexpected error occurred; nothing was stored, \
                 retry with the same Idempotency-Key"
                .to_owned(),
            other => other.to_string(),
        }
    }
}

impl ResponseError for IdempotencyRejection {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::InvalidKey(_) | Self::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            Self::InFlight => StatusCode::CONFLICT,
            Self::PayloadConflict => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Store(e) if e.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            Self::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        if let Self::Store(error) = self {
            tracing::error!(error = %error, %status, "idempotent request failed in storage");
        }
        let (kind, title) = self.kind();
        let body = serde_json::json!({
            "type": kind,
            "title": title,
            "status": status.as_u16(),
            "detail": self.detail(),
        });
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
        response.body(body.to_string())
    }
}

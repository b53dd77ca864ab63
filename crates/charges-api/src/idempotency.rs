//! The HTTP side of the Idempotency-Key contract, shared by every mutating endpoint.
//! [`idempotent`] is the whole request pipeline: a handler only names its endpoint
//! and says how to turn the body into an [`IdempotentOperation`]. The database side
//! (reserve, replay, store) is `charges_store::IdempotencyStore`.

use actix_web::{HttpRequest, HttpResponse, web};
use charges_domain::IdempotencyKey;
use charges_store::IdempotentOutcome;
use pg_idempotency::actix::{self as http_side, IdempotencyRejection};

use crate::AppState;
use crate::auth;
use crate::body;
use crate::metrics;
use crate::problem::ApiError;

/// Runs a mutating request at most once per `(Idempotency-Key, endpoint)`, and per
/// client when authentication is on ([`auth::idempotency_scope`]): one client's key
/// never replays, conflicts with or blocks another client's request.
///
/// Everything that can refuse the request without looking at the database (media type,
/// key, body size, body validation) happens before the key is reserved, so a refused
/// request leaves nothing behind and its key stays free: only requests that started
/// executing are remembered.
pub async fn idempotent<Op, Parse>(
    request: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
    endpoint: &str,
    parse: Parse,
) -> Result<HttpResponse, ApiError>
where
    Op: Idempotent,
    Parse: FnOnce(&[u8]) -> Result<Op, ApiError>,
{
    body::require_json(request)?;
    // The metric's endpoint label is the route pattern: the refund endpoint's
    // concrete path holds a charge id, one series per charge.
    let route = request.match_pattern();
    let route = route.as_deref().unwrap_or(endpoint);
    let key =
        key_from(request).inspect_err(|_| metrics::idempotency_outcome(route, "invalid_key"))?;
    let bytes =
        body::read_limited(request, payload, state.max_body_bytes, state.body_timeout).await?;
    let operation = parse(&bytes)?;
    let scope = auth::idempotency_scope(auth::client(request).as_ref(), endpoint);
    let endpoint = scope.as_str();
    let outcome = operation.run(state, &key, endpoint).await?;
    // The key may appear in logs (access-controlled, retained like the requests), never
    // in a metric label.
    tracing::info!(idempotency_key = %key, endpoint, outcome = outcome.as_str(), "idempotent request");
    metrics::idempotency_outcome(route, outcome.as_str());
    respond(outcome)
}

/// How an endpoint's operation runs under its reserved key: in a transaction the store
/// opens (`IdempotencyStore::run`, an `IdempotentOperation`) or whole in one statement
/// (`IdempotencyStore::run_one_statement`, a `OneStatementOperation`).
// actix-web handlers run on a single-threaded runtime and do not need `Send` futures.
#[allow(async_fn_in_trait)]
pub trait Idempotent {
    async fn run(
        self,
        state: &AppState,
        key: &IdempotencyKey,
        endpoint: &str,
    ) -> Result<IdempotentOutcome, ApiError>;
}

/// Exactly one `Idempotency-Key` header, parsed.
pub fn key_from(request: &HttpRequest) -> Result<IdempotencyKey, ApiError> {
    Ok(http_side::key_from(request)?)
}

/// The response for an outcome: the stored one (marked when replayed), or a problem
/// of this API's.
fn respond(outcome: IdempotentOutcome) -> Result<HttpResponse, ApiError> {
    http_side::respond(outcome).map_err(|rejection| match rejection {
        IdempotencyRejection::InvalidKey(e) => ApiError::InvalidIdempotencyKey(e),
        IdempotencyRejection::InFlight => ApiError::KeyInFlight,
        IdempotencyRejection::PayloadConflict => ApiError::KeyReusedWithDifferentPayload,
        // Never made by `respond`: bodies are parsed, and refused, by this API itself.
        IdempotencyRejection::InvalidRequest(_) => ApiError::UnreadableBody,
        IdempotencyRejection::Store(e) => ApiError::Store(e),
    })
}

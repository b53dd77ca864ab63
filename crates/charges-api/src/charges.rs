//! `POST /charges`.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use charges_domain::{Charge, ChargeCreated, CreateCharge, EventType, Fingerprint};
use charges_store::{
    ChargeStore, IdempotentOperation, OutboxStore, StoreError, StoredResponse, Transaction,
};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use uuid::Uuid;

use crate::AppState;
use crate::idempotency;
use crate::problem::ApiError;

/// The idempotency scope of this endpoint.
const ENDPOINT: &str = "/charges";

/// Validation happens before the key is reserved, so a refused request leaves nothing
/// behind and its key stays free (only requests that started executing are remembered).
pub async fn create(
    request: HttpRequest,
    body: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    require_json(&request)?;
    let key = idempotency::key_from(&request)?;
    let body = read_body(&request, body, state.max_body_bytes).await?;
    let charge = CreateCharge::from_json(&body)?;
    let outcome = state
        .idempotency
        .run(&state.pool, &key, ENDPOINT, &CreateChargeOperation(charge))
        .await?;
    tracing::info!(idempotency_key = %key, endpoint = ENDPOINT, outcome = outcome.as_str(), "charge request");
    idempotency::respond(outcome)
}

struct CreateChargeOperation(CreateCharge);

impl IdempotentOperation for CreateChargeOperation {
    type Error = ApiError;

    fn fingerprint(&self) -> Fingerprint {
        self.0.fingerprint()
    }

    async fn execute(
        &self,
        tx: &Transaction<'_>,
        now: DateTime<Utc>,
    ) -> Result<StoredResponse, ApiError> {
        let charge = Charge {
            id: Uuid::now_v7(),
            amount_cents: self.0.amount_cents(),
            currency: self.0.currency().to_owned(),
            created_at: now,
        };
        let event = ChargeCreated::new(Uuid::now_v7(), &charge);
        let payload = serde_json::to_value(&event)
            .map_err(|e| StoreError::Corrupt(format!("encode ChargeCreated: {e}")))?;
        let body = serde_json::to_string(&charge)
            .map_err(|e| StoreError::Corrupt(format!("encode charge: {e}")))?;
        ChargeStore::insert(tx, &charge).await?;
        OutboxStore::insert(
            tx,
            event.event_id,
            charge.id,
            EventType::ChargeCreated,
            &payload,
            now,
        )
        .await?;
        Ok(StoredResponse {
            status: 201,
            headers: vec![(header::LOCATION.to_string(), charge.location())],
            body,
        })
    }
}

/// `application/json`, with or without parameters such as `charset=utf-8`.
fn require_json(request: &HttpRequest) -> Result<(), ApiError> {
    let essence = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    match essence.as_deref() {
        Some("application/json") => Ok(()),
        _ => Err(ApiError::UnsupportedMediaType),
    }
}

/// Reads at most `limit` bytes; a declared or actual larger body is refused as soon as
/// that is known, without buffering it.
async fn read_body(
    request: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::BytesMut, ApiError> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| ApiError::UnreadableBody)?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

//! `POST /charges` and `GET /charges/{id}`.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use charges_domain::{
    Charge, ChargeCreated, ChargeWithRefunds, CreateCharge, Fingerprint, IdempotencyKey,
};
use charges_store::{
    ChargeStore, Client, IdempotentOutcome, KeyToComplete, NewCharge, OneStatementOperation,
    Origin, RefundStore, Row, StoreError, StoredResponse,
};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::AppState;
use crate::auth::{self, ClientId};
use crate::idempotency::{Idempotent, idempotent};
use crate::problem::ApiError;
use crate::request_id;

pub async fn create(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let owner = auth::client(&request);
    let origin = request_id::origin(&request);
    idempotent(&request, payload, &state, "/charges", |body| {
        Ok(CreateChargeOperation {
            request: CreateCharge::from_json(body)?,
            owner,
            origin,
        })
    })
    .await
}

struct CreateChargeOperation {
    request: CreateCharge,
    /// The authenticated client, recorded on the charge; `None` without authentication.
    owner: Option<ClientId>,
    /// The request's trace and id, carried by its event.
    origin: Origin,
}

/// A charge about to be created, its event and its response, all decided before the
/// one statement that writes them (`ChargeStore::create_once`).
struct PreparedCharge {
    fingerprint: Fingerprint,
    charge: Charge,
    owner: Option<ClientId>,
    event_id: Uuid,
    event_data: String,
    origin: Origin,
    response: StoredResponse,
}

impl CreateChargeOperation {
    /// The charge's `created_at` is the API's clock, in microseconds as Postgres keeps
    /// it, so that the response and every later read show the same instant.
    fn prepare(self, now: DateTime<Utc>) -> Result<PreparedCharge, ApiError> {
        let created_at = DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now);
        let charge = Charge {
            id: Uuid::now_v7(),
            amount_cents: self.request.amount_cents(),
            currency: self.request.currency().to_owned(),
            created_at,
        };
        let event = ChargeCreated::new(Uuid::now_v7(), &charge);
        let response = StoredResponse {
            status: 201,
            headers: vec![(header::LOCATION.to_string(), charge.location())],
            body: to_json_string(&charge)?,
        };
        Ok(PreparedCharge {
            fingerprint: self.request.fingerprint(),
            event_id: event.event_id,
            event_data: to_json_string(&event)?,
            charge,
            owner: self.owner,
            origin: self.origin,
            response,
        })
    }
}

impl OneStatementOperation for PreparedCharge {
    fn fingerprint(&self) -> Fingerprint {
        self.fingerprint.clone()
    }

    fn response(&self) -> &StoredResponse {
        &self.response
    }

    async fn call(&self, client: &Client, key: &KeyToComplete<'_>) -> Result<Row, StoreError> {
        let new = NewCharge {
            charge: &self.charge,
            owner: self.owner.as_ref().map(ClientId::as_str),
            event_id: self.event_id,
            event_data: &self.event_data,
            origin: &self.origin,
        };
        ChargeStore::create_once(client, key, &new, &self.response).await
    }
}

impl Idempotent for CreateChargeOperation {
    async fn run(
        self,
        state: &AppState,
        key: &IdempotencyKey,
        endpoint: &str,
    ) -> Result<IdempotentOutcome, ApiError> {
        let charge = self.prepare(Utc::now())?;
        Ok(state
            .idempotency
            .run_one_statement(&state.pool, key, endpoint, &charge)
            .await?)
    }
}

/// A safe read: no Idempotency-Key. One read-only snapshot, so the refunded total and
/// the list of refunds always agree. With authentication on, another client's charge is
/// a 404, exactly like an unknown id: its existence is not revealed.
pub async fn get(
    request: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_charge_id(&path)?;
    let mut client = state.pool.get().await.map_err(StoreError::from)?;
    let tx = client
        .build_transaction()
        .isolation_level(charges_store::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(StoreError::from)?;
    let owner = auth::client(&request);
    let (charge, refunded_cents) = ChargeStore::get(&tx, id, owner.as_ref().map(ClientId::as_str))
        .await?
        .ok_or(ApiError::ChargeNotFound)?;
    let refunds = RefundStore::list_for_charge(&tx, id).await?;
    tx.commit().await.map_err(StoreError::from)?;
    let view = ChargeWithRefunds {
        charge,
        refunded_cents,
        refunds,
    };
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(to_json_string(&view)?))
}

pub fn parse_charge_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::try_parse(raw).map_err(|_| ApiError::InvalidChargeId)
}

pub fn to_json_string(value: &impl serde::Serialize) -> Result<String, ApiError> {
    serde_json::to_string(value).map_err(|source| ApiError::Encode {
        what: "the response",
        source,
    })
}

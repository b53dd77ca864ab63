//! `POST /charges` and `GET /charges/{id}`.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use charges_domain::{
    Charge, ChargeCreated, ChargeWithRefunds, CreateCharge, EventType, FIRST_SEQUENCE, Fingerprint,
};
use charges_store::{
    ChargeStore, CompletedKey, IdempotentOperation, KeyCompletion, NewEvent, Origin, OutboxStore,
    RefundStore, StoreError, StoredResponse, Transaction,
};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::AppState;
use crate::auth::{self, ClientId};
use crate::idempotency::idempotent;
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

impl IdempotentOperation for CreateChargeOperation {
    type Error = ApiError;

    fn fingerprint(&self) -> Fingerprint {
        self.request.fingerprint()
    }

    async fn execute(
        &self,
        tx: &Transaction<'_>,
        now: DateTime<Utc>,
        completion: KeyCompletion<'_>,
    ) -> Result<CompletedKey, ApiError> {
        let charge = Charge {
            id: Uuid::now_v7(),
            amount_cents: self.request.amount_cents(),
            currency: self.request.currency().to_owned(),
            created_at: now,
        };
        let event = ChargeCreated::new(Uuid::now_v7(), &charge);
        let data = to_json_string(&event)?;
        let outbox_row = NewEvent {
            id: event.event_id,
            aggregate_id: charge.id,
            event_type: EventType::ChargeCreated,
            sequence: FIRST_SEQUENCE,
            data: &data,
            created_at: now,
            origin: &self.origin,
        };
        let response = StoredResponse {
            status: 201,
            headers: vec![(header::LOCATION.to_string(), charge.location())],
            body: to_json_string(&charge)?,
        };
        // Nothing the inserts return changes the response, so the charge, its event
        // and the key's completion go out together (tokio-postgres pipelines
        // concurrent statements on one connection): one round trip instead of three.
        // Their order does not matter: the outbox has no foreign key (V8), and all
        // three commit or none.
        let writes = async {
            futures::try_join!(
                ChargeStore::insert(tx, &charge, self.owner.as_ref().map(ClientId::as_str)),
                OutboxStore::insert(tx, &outbox_row),
            )
            .map(|_| ())
        };
        Ok(completion.store_with(writes, response).await?)
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

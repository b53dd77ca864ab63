//! `POST /charges/{id}/refunds`.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use charges_domain::{
    ChargeRefunded, CreateRefund, EventType, Fingerprint, IdempotencyKey, Refund,
};
use charges_store::{
    ChargeStore, CompletedKey, IdempotentOperation, IdempotentOutcome, KeyCompletion, NewEvent,
    Origin, OutboxStore, RefundStore, StoreError, StoredResponse, Transaction,
};
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::AppState;
use crate::auth::{self, ClientId};
use crate::charges::{parse_charge_id, to_json_string};
use crate::idempotency::{Idempotent, idempotent};
use crate::problem::ApiError;
use crate::request_id;

/// The idempotency scope is the concrete path, with the id in its canonical form: the
/// same key on two charges' refund endpoints names two operations.
pub async fn create(
    request: HttpRequest,
    path: web::Path<String>,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let charge_id = parse_charge_id(&path)?;
    let endpoint = format!("/charges/{charge_id}/refunds");
    let owner = auth::client(&request);
    let origin = request_id::origin(&request);
    idempotent(&request, payload, &state, &endpoint, |body| {
        Ok(CreateRefundOperation {
            request: CreateRefund::from_json(charge_id, body)?,
            owner,
            origin,
        })
    })
    .await
}

struct CreateRefundOperation {
    request: CreateRefund,
    /// With authentication on, only the owner's charges can be refunded: another
    /// client's charge is "not found".
    owner: Option<ClientId>,
    /// The request's trace and id, carried by its event.
    origin: Origin,
}

impl Idempotent for CreateRefundOperation {
    async fn run(
        self,
        state: &AppState,
        key: &IdempotencyKey,
        endpoint: &str,
    ) -> Result<IdempotentOutcome, ApiError> {
        state
            .idempotency
            .run(&state.pool, key, endpoint, &self)
            .await
    }
}

impl IdempotentOperation for CreateRefundOperation {
    type Error = ApiError;

    fn fingerprint(&self) -> Fingerprint {
        self.request.fingerprint()
    }

    /// The charge's row lock is held from the first statement to commit, so concurrent
    /// refunds of one charge run one after another and each sees the last one's total.
    ///
    /// An unknown charge is an error (nothing is remembered: the key stays free). A
    /// refund larger than what remains is a remembered answer: a retry with the same key
    /// gets the same 422, as it would for any request that was executed.
    async fn execute(
        &self,
        tx: &Transaction<'_>,
        now: DateTime<Utc>,
        completion: KeyCompletion<'_>,
    ) -> Result<CompletedKey, ApiError> {
        let charge_id = self.request.charge_id();
        let owner = self.owner.as_ref().map(ClientId::as_str);
        let charge = ChargeStore::lock_for_refund(tx, charge_id, owner)
            .await?
            .ok_or(ApiError::ChargeNotFound)?;
        let amount_cents = match self
            .request
            .amount_given(charge.amount_cents, charge.refunded_cents)
        {
            Ok(amount) => amount,
            Err(refused) => {
                return Ok(completion
                    .store(ApiError::RefundRefused(refused).to_stored())
                    .await?);
            }
        };
        let refund = Refund {
            id: Uuid::now_v7(),
            charge_id,
            amount_cents,
            currency: charge.currency,
            created_at: now,
        };
        // The row lock makes the new total and the event's sequence known in advance,
        // so the three writes and the key's completion go out together in one round
        // trip; the total the database computed is checked (a mismatch rolls all of
        // it back).
        let refunded_cents = charge.refunded_cents + amount_cents;
        let sequence = charge.event_sequence + 1;
        let event = ChargeRefunded::new(Uuid::now_v7(), &refund, refunded_cents, sequence);
        let data = to_json_string(&event)?;
        let outbox_row = NewEvent {
            id: event.event_id,
            aggregate_type: EventType::ChargeRefunded.aggregate_type(),
            aggregate_id: charge_id,
            event_type: EventType::ChargeRefunded.as_str(),
            sequence,
            data: &data,
            created_at: now,
            origin: &self.origin,
        };
        let response = StoredResponse {
            status: 201,
            headers: vec![(header::LOCATION.to_string(), refund.location())],
            body: to_json_string(&refund)?,
        };
        let writes = async {
            let (stored_total, (), ()) = futures::try_join!(
                ChargeStore::add_refunded(tx, charge_id, amount_cents, sequence),
                RefundStore::insert(tx, &refund),
                OutboxStore::insert(tx, &outbox_row),
            )?;
            if stored_total != refunded_cents {
                return Err(StoreError::Invariant(format!(
                    "refunded total {stored_total} under the row lock, expected {refunded_cents}"
                ))
                .into());
            }
            Ok::<(), ApiError>(())
        };
        completion.store_with(writes, response).await
    }
}

//! The charges domain: what a request means, independent of HTTP and SQL.
//!
//! - [`IdempotencyKey`]: the validated, normalized `Idempotency-Key` header.
//! - [`CreateCharge`]: a validated `POST /charges` body and its [`Fingerprint`].
//! - [`Charge`] and [`ChargeCreated`]: the resource and the event the outbox carries.

mod charge;
mod event;
mod fingerprint;
mod idempotency_key;

pub use charge::{Charge, ChargeRequestError, CreateCharge, MAX_AMOUNT_CENTS};
pub use event::{ChargeCreated, EventType};
pub use fingerprint::Fingerprint;
pub use idempotency_key::{IdempotencyKey, InvalidIdempotencyKey};

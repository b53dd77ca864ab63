//! The charges domain: what a request means, independent of HTTP and SQL.
//!
//! - [`IdempotencyKey`]: the validated, normalized `Idempotency-Key` header.
//! - [`CreateCharge`]: a validated `POST /charges` body and its [`Fingerprint`].
//! - [`CreateRefund`]: a validated refund request and the rule that refunds never exceed
//!   the charge.
//! - [`Charge`], [`Refund`] and the events the outbox carries ([`ChargeCreated`],
//!   [`ChargeRefunded`]).

mod charge;
mod event;
mod json;
mod refund;

pub use charge::{Charge, ChargeRequestError, CreateCharge, MAX_AMOUNT_CENTS};
pub use event::{ChargeCreated, ChargeRefunded, EventType, FIRST_SEQUENCE};
pub use pg_idempotency::{Fingerprint, IdempotencyKey, InvalidIdempotencyKey};
pub use refund::{ChargeWithRefunds, CreateRefund, Refund, RefundRefused, RefundRequestError};

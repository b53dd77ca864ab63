//! The charges HTTP API. It only ever writes to Postgres: every mutating request is one
//! database transaction holding the idempotency key, the change, its outbox event and
//! the replayable response. Publishing to Kafka is the relay's job.

pub mod app;
pub mod auth;
mod body;
mod charges;
pub mod cli;
mod health;
mod idempotency;
pub mod metrics;
mod problem;
mod refunds;
mod request_id;

pub use app::{AppState, serve};

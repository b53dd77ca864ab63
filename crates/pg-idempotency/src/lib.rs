#![doc = include_str!("../README.md")]

#[cfg(feature = "actix-web")]
pub mod actix;
mod fingerprint;
mod key;
mod replay_cache;
mod schema;
pub mod store;

pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, InvalidIdempotencyKey};
pub use schema::schema;
pub use store::{
    CompletedKey, DEFAULT_REPLAY_CACHE_ENTRIES, IdempotencyStore, IdempotentOperation,
    IdempotentOutcome, KeyCompletion, KeyToComplete, OneStatementOperation, StoredResponse,
    encode_headers,
};

#![doc = include_str!("../README.md")]

mod fingerprint;
mod key;
mod replay_cache;
pub mod store;

pub use fingerprint::Fingerprint;
pub use key::{IdempotencyKey, InvalidIdempotencyKey};
pub use store::{
    CompletedKey, DEFAULT_REPLAY_CACHE_ENTRIES, IdempotencyStore, IdempotentOperation,
    IdempotentOutcome, KeyCompletion, KeyToComplete, OneStatementOperation, StoredResponse,
    encode_headers,
};

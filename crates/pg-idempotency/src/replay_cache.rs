//! Completed idempotency keys, remembered in process so that a replay does not cost a
//! database round trip.
//!
//! Why this is safe: a `COMPLETED` row never changes before its `expires_at` (nothing
//! updates it, retention only deletes expired rows, and a new request may overwrite it
//! only after expiry). So the fingerprint and response seen once stay the truth until
//! then. Each entry is valid until an `Instant` computed from the database's own
//! timestamps (`expires_at - now()` of the statement that read it), measured from
//! before that statement was sent: no clock skew between hosts can stretch it past the
//! row's expiry. Entries are per process: with N replicas a retry hits the cache only
//! on the replica that saw the key before, and misses fall back to the database.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quick_cache::sync::Cache;

use crate::{Fingerprint, StoredResponse};

pub(crate) struct CachedKey {
    pub fingerprint: Fingerprint,
    pub response: StoredResponse,
    valid_until: Instant,
}

pub(crate) struct ReplayCache {
    entries: Option<Cache<(String, String), Arc<CachedKey>>>,
}

impl ReplayCache {
    /// `capacity` 0 disables the cache.
    pub fn new(capacity: usize) -> Self {
        ReplayCache {
            entries: (capacity > 0).then(|| Cache::new(capacity)),
        }
    }

    pub fn get(&self, key: &str, endpoint: &str) -> Option<Arc<CachedKey>> {
        let entries = self.entries.as_ref()?;
        let lookup = (key.to_owned(), endpoint.to_owned());
        let entry = entries.get(&lookup)?;
        if Instant::now() < entry.valid_until {
            Some(entry)
        } else {
            entries.remove(&lookup);
            None
        }
    }

    /// `observed_at` is an instant taken before the statement that established
    /// `remaining` (the row's `expires_at` minus that statement's `now()`).
    pub fn insert(
        &self,
        key: String,
        endpoint: String,
        fingerprint: Fingerprint,
        response: StoredResponse,
        observed_at: Instant,
        remaining: Duration,
    ) {
        let Some(entries) = self.entries.as_ref() else {
            return;
        };
        let Some(valid_until) = observed_at.checked_add(remaining) else {
            return;
        };
        if valid_until > Instant::now() {
            entries.insert(
                (key, endpoint),
                Arc::new(CachedKey {
                    fingerprint,
                    response,
                    valid_until,
                }),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: vec![],
            body: "{}".into(),
        }
    }

    #[test]
    fn entries_expire_and_a_disabled_cache_keeps_nothing() {
        let cache = ReplayCache::new(16);
        let fp = Fingerprint::of("op", &[]);
        cache.insert(
            "k".into(),
            "/e".into(),
            fp.clone(),
            response(),
            Instant::now(),
            Duration::from_secs(60),
        );
        assert!(cache.get("k", "/e").is_some());
        assert!(
            cache.get("k", "/other").is_none(),
            "the endpoint is part of the scope"
        );
        cache.insert(
            "old".into(),
            "/e".into(),
            fp.clone(),
            response(),
            Instant::now(),
            Duration::ZERO,
        );
        assert!(cache.get("old", "/e").is_none());
        let disabled = ReplayCache::new(0);
        disabled.insert(
            "k".into(),
            "/e".into(),
            fp,
            response(),
            Instant::now(),
            Duration::from_secs(60),
        );
        assert!(disabled.get("k", "/e").is_none());
    }
}

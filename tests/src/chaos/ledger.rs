//! What the clients of one scenario saw.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// One HTTP answer as a client saw it.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub replayed: bool,
    pub retry_after: Option<u64>,
    pub content_type: String,
    pub body: String,
}

impl Answer {
    /// An answer read off a raw connection: only its status and body are known.
    pub fn raw(status: u16, body: String) -> Answer {
        Answer {
            status,
            replayed: false,
            retry_after: None,
            content_type: String::new(),
            body,
        }
    }
}

#[derive(Default)]
pub struct LedgerState {
    pub answers: u64,
    pub statuses: BTreeMap<u16, u64>,
    pub connection_errors: u64,
    /// Charge ids named by the 201s of each key.
    pub charges_by_key: BTreeMap<String, BTreeSet<String>>,
    /// 201s without `Idempotent-Replayed`, per key.
    pub executed_by_key: BTreeMap<String, u64>,
    pub violations: Vec<String>,
}

/// Every answer the clients of one scenario received, and what was wrong with them.
#[derive(Default)]
pub struct Ledger {
    state: Mutex<LedgerState>,
    /// Set while the database is made unavailable on purpose: a request sent then may
    /// be answered 503.
    db_outage: AtomicBool,
}

/// Words that would mean the database's or the driver's text reached a client.
const INTERNALS: &[&str] = &[
    "postgres",
    "FATAL",
    "SQLSTATE",
    "charges_test_",
    "tokio",
    "deadpool",
    "refused",
    "terminat",
];

impl Ledger {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, LedgerState> {
        self.state.lock().expect("ledger lock")
    }

    pub fn violation(&self, what: String) {
        self.lock().violations.push(what);
    }

    pub fn connection_error(&self) {
        self.lock().connection_errors += 1;
    }

    /// Whether the database is unavailable on purpose right now.
    pub fn outage(&self) -> bool {
        self.db_outage.load(Ordering::SeqCst)
    }

    /// From now on (`true`) a request sent may be answered 503; from then on
    /// (`false`) one sent afterwards may not.
    pub fn set_outage(&self, outage: bool) {
        self.db_outage.store(outage, Ordering::SeqCst);
    }

    /// Records an answer to a request with `key` (if it had a valid one), sent while the
    /// database was unavailable on purpose or not, and checks the rules every answer
    /// obeys.
    pub fn record(&self, key: Option<&str>, answer: &Answer, sent_during_outage: bool) {
        let outage = sent_during_outage || self.outage();
        let mut state = self.lock();
        state.answers += 1;
        *state.statuses.entry(answer.status).or_default() += 1;
        let status = answer.status;
        if status >= 500 && !(status == 503 && outage) {
            state.violations.push(format!(
                "{status} answered to client input (database outage: {outage}): {}",
                answer.body
            ));
        }
        if matches!(status, 409 | 503) && answer.retry_after.is_none() {
            state
                .violations
                .push(format!("{status} without Retry-After: {}", answer.body));
        }
        if status == 503 {
            if answer.content_type != "application/problem+json" {
                state
                    .violations
                    .push(format!("503 with content type {:?}", answer.content_type));
            }
            let lower = answer.body.to_lowercase();
            if let Some(word) = INTERNALS.iter().find(|w| lower.contains(&w.to_lowercase())) {
                state.violations.push(format!(
                    "503 body shows internals ({word}): {}",
                    answer.body
                ));
            }
        }
        if status == 201
            && let Some(key) = key
        {
            let id = serde_json::from_str::<serde_json::Value>(&answer.body)
                .ok()
                .and_then(|v| v["id"].as_str().map(str::to_owned));
            match id {
                Some(id) => {
                    state
                        .charges_by_key
                        .entry(key.to_owned())
                        .or_default()
                        .insert(id);
                    if !answer.replayed {
                        *state.executed_by_key.entry(key.to_owned()).or_default() += 1;
                    }
                }
                None => state
                    .violations
                    .push(format!("201 without a charge id: {}", answer.body)),
            }
        }
    }

    pub fn executed(&self, key: &str) -> u64 {
        self.lock().executed_by_key.get(key).copied().unwrap_or(0)
    }

    pub fn count(&self, status: u16) -> u64 {
        self.lock().statuses.get(&status).copied().unwrap_or(0)
    }
}

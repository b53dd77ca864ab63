//! Hostile input: raw requests against one API, each with what it must get, recorded in
//! a [`Ledger`] so that the invariant checker sees every answer.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use super::client::{BaseUrl, http_client, submit};
use super::invariants::{check_invariants, scalar};
use super::ledger::{Answer, Ledger};
use crate::kafka::TestKafka;
use crate::raw_http::{Raw, body_of, header, raw_exchange, raw_request};
use crate::{DEADLINE, TestApi, TestDb, new_key};

/// A valid charge request body.
pub const VALID: &[u8] = br#"{"amountCents":4900,"currency":"EUR"}"#;
/// The problem type of a refused body.
pub const INVALID_BODY: &str = "/problems/invalid-request-body";

/// What a hostile request must get.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    /// This status, with this problem type in the body.
    Problem(u16, &'static str),
    /// Any 4xx, or the connection closed without an answer (a malformed head).
    Refused,
}

/// One hostile request: a name, the bytes, and what it must get.
pub type Case = (String, Vec<u8>, Expect);

/// `Content-Type: application/json`.
pub fn json() -> Vec<u8> {
    header("Content-Type", "application/json")
}

/// `Idempotency-Key: <key>`.
pub fn with_key(key: &str) -> Vec<u8> {
    header("Idempotency-Key", key)
}

/// An API with a 1 s client request timeout and keep-alive, its database and topic,
/// and the one key every hostile request names: refused requests must leave it free.
pub struct HostileRun {
    pub db: TestDb,
    pub kafka: TestKafka,
    pub api: TestApi,
    /// `host:port` of the API.
    pub addr: String,
    pub ledger: Ledger,
    pub key: String,
    results: BTreeMap<&'static str, u64>,
    sent: usize,
}

impl HostileRun {
    pub async fn start() -> HostileRun {
        let db = TestDb::new().await;
        let kafka = TestKafka::new(1).await;
        let api = TestApi::start(
            &db,
            &["--client-request-timeout", "1s", "--keep-alive", "1s"],
        )
        .await;
        let addr = api.base_url.trim_start_matches("http://").to_owned();
        HostileRun {
            db,
            kafka,
            api,
            addr,
            ledger: Ledger::default(),
            key: new_key(),
            results: BTreeMap::new(),
            sent: 0,
        }
    }

    /// A `POST /charges` naming the run's key, with `headers` after the JSON content
    /// type and key.
    pub fn post_with_key(&self, headers: &[Vec<u8>], body: &[u8]) -> Vec<u8> {
        let mut all = vec![json(), with_key(&self.key)];
        all.extend_from_slice(headers);
        raw_request("POST", b"/charges", &all, body)
    }

    /// Sends each case on a connection of its own and records what it got; an answer
    /// other than the case expects is a violation.
    pub async fn send(&mut self, cases: &[Case]) {
        for (name, request, expect) in cases {
            let outcome = raw_exchange(&self.addr, request, DEADLINE).await;
            self.sent += 1;
            match (&outcome, expect) {
                (Raw::Answer(status, text), _) => {
                    let body = body_of(text).to_owned();
                    self.ledger
                        .record(None, &Answer::raw(*status, body.clone()), false);
                    let ok = match expect {
                        Expect::Problem(want, kind) => *status == *want && body.contains(kind),
                        Expect::Refused => (400..500).contains(status),
                    };
                    *self
                        .results
                        .entry(if ok { "as expected" } else { "wrong" })
                        .or_default() += 1;
                    if !ok {
                        self.ledger
                            .violation(format!("{name}: expected {expect:?}, got {status} {body}"));
                    }
                }
                (Raw::Closed, Expect::Refused) => {
                    *self.results.entry("closed").or_default() += 1;
                }
                (other, _) => self
                    .ledger
                    .violation(format!("{name}: expected {expect:?}, got {other:?}")),
            }
        }
    }

    /// How many hostile requests were sent, and how they came back.
    pub fn figures(&self) -> String {
        format!("{} hostile requests ({:?})", self.sent, self.results)
    }

    /// The end of every hostile scenario: `valid` (a valid request naming the run's
    /// key) executes the key for the first time, since every refused request left it
    /// free; a request with another key works; every table is still there; and the
    /// invariants hold.
    pub async fn finish(self, scenario: &str, valid: Vec<u8>, what: &str, faults: &str) {
        match raw_exchange(&self.addr, &valid, DEADLINE).await {
            Raw::Answer(status, text) => {
                let answer = Answer {
                    replayed: text.to_lowercase().contains("idempotent-replayed"),
                    ..Answer::raw(status, body_of(&text).to_owned())
                };
                self.ledger.record(Some(&self.key), &answer, false);
                assert_eq!(status, 201, "{what}: {text}");
            }
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(
            self.ledger.executed(&self.key),
            1,
            "the refused requests left the key free"
        );
        let base: BaseUrl = Arc::new(RwLock::new(self.api.base_url.clone()));
        let valid = std::str::from_utf8(VALID).expect("utf-8");
        submit(&http_client(1), &base, &new_key(), valid, &self.ledger).await;
        let tables = scalar(
            &self.db,
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'
                AND tablename IN ('charges', 'outbox', 'idempotency_keys', 'refunds')",
        )
        .await;
        assert_eq!(tables, 4, "every table is still there");
        check_invariants(scenario, faults, &self.db, &self.kafka, &self.ledger, false).await;
    }
}

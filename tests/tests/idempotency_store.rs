//! `IdempotencyStore` on its own, against a real database: the scope of a key is
//! `(key, endpoint)`, and what an operation returns is what gets replayed.

use std::time::Duration;

use charges_domain::{Fingerprint, IdempotencyKey};
use charges_store::{
    IdempotencyStore, IdempotentOperation, IdempotentOutcome, StoreError, StoredResponse,
    Transaction,
};
use charges_tests::TestDb;
use chrono::{DateTime, Utc};

/// An operation that writes nothing but its response: enough to exercise the scope.
struct Echo(&'static str);

impl IdempotentOperation for Echo {
    type Error = StoreError;

    fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of("echo", &[("body", self.0)])
    }

    async fn execute(
        &self,
        _tx: &Transaction<'_>,
        now: DateTime<Utc>,
    ) -> Result<StoredResponse, StoreError> {
        Ok(StoredResponse {
            status: 201,
            headers: vec![(
                "location".into(),
                format!("/echo/{}", now.timestamp_micros()),
            )],
            body: self.0.to_owned(),
        })
    }
}

/// Contract line 2: uniqueness is per (key, endpoint), not global.
#[tokio::test]
async fn one_key_on_two_endpoints_is_two_operations() {
    let db = TestDb::new().await;
    let pool = charges_store::connect(&db.url, &Default::default())
        .await
        .unwrap();
    let store = IdempotencyStore::new(Duration::from_secs(60));
    let key = IdempotencyKey::parse(uuid::Uuid::new_v4().to_string().as_bytes()).unwrap();

    let a = store
        .run(&pool, &key, "/charges", &Echo("a"))
        .await
        .unwrap();
    let b = store
        .run(&pool, &key, "/charges/1/refunds", &Echo("b"))
        .await
        .unwrap();
    assert!(
        matches!(a, IdempotentOutcome::Executed(ref r) if r.body == "a"),
        "{a:?}"
    );
    assert!(
        matches!(b, IdempotentOutcome::Executed(ref r) if r.body == "b"),
        "{b:?}"
    );

    let replay_a = store
        .run(&pool, &key, "/charges", &Echo("a"))
        .await
        .unwrap();
    assert_eq!(
        replay_a,
        IdempotentOutcome::Replayed(match a {
            IdempotentOutcome::Executed(r) => r,
            _ => unreachable!(),
        })
    );
    let conflict = store
        .run(&pool, &key, "/charges/1/refunds", &Echo("a"))
        .await
        .unwrap();
    assert_eq!(conflict, IdempotentOutcome::PayloadConflict);
    assert_eq!(db.count("idempotency_keys").await, 2);
}

//! `reconciliation_result`: the latest count of broken invariants, one row shared by
//! every relay (migrations-before-split/V10 says why).

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;

use crate::StoreError;
use crate::statements::{self, Connection, Sql};

/// Taken by the process that checks, for the rest of its transaction.
const CHECK_LOCK_KEY: i64 = 0x7265_636f_6e63_0103;

/// `ReconciliationResultClaim`: whether this transaction should check now — it holds
/// the check's lock and the shared result is missing or at least `$2` ms old — and the
/// result as it stands.
const CLAIM: Sql = Sql::new(
    "
SELECT pg_try_advisory_xact_lock($1) AS locked,
       (r.checked_at IS NULL OR r.checked_at <= now() - $2::bigint * interval '1 millisecond') AS due,
       r.checked_at, r.charges_without_outbox, r.stale_started_keys
  FROM (VALUES (true)) AS one (singleton)
  LEFT JOIN reconciliation_result r USING (singleton)",
    &[Type::INT8, Type::INT8],
);

/// `ReconciliationBoundCount`: the count's own statement timeout (`SET LOCAL`, so it
/// ends with the transaction), in milliseconds as text: the pool's timeout is sized for
/// the relay's batches, and a count over millions of rows takes longer. And a check,
/// every `$2` ms while a statement runs, that the relay is still connected: a relay that
/// exits (a restart, SIGKILL, the OOM killer) while its count runs would otherwise leave
/// Postgres reading whole tables for up to `$1`, holding the check's lock so that no
/// other relay counts meanwhile (Postgres 14 or later).
const BOUND_COUNT: Sql = Sql::new(
    "
SELECT set_config('statement_timeout', $1, true),
       set_config('idle_in_transaction_session_timeout', $1, true),
       set_config('client_connection_check_interval', $2, true)",
    &[Type::TEXT, Type::TEXT],
);

/// How soon Postgres ends a count whose relay has gone.
const GONE_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// `ReconciliationResultRecord`
const RECORD: Sql = Sql::new(
    "
INSERT INTO reconciliation_result AS r (checked_at, charges_without_outbox, stale_started_keys)
VALUES (now(), $1, $2)
ON CONFLICT (singleton) DO UPDATE
   SET checked_at = EXCLUDED.checked_at,
       charges_without_outbox = EXCLUDED.charges_without_outbox,
       stale_started_keys = EXCLUDED.stale_started_keys
RETURNING checked_at, charges_without_outbox, stale_started_keys",
    &[Type::INT8, Type::INT8],
);

/// Broken invariants as one check counted them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconciliationCounts {
    pub checked_at: DateTime<Utc>,
    pub charges_without_outbox: i64,
    pub stale_started_keys: i64,
}

/// What [`ReconciliationResultStore::claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconciliationClaim {
    /// This transaction holds the check's lock and the latest result is too old (or
    /// there is none): it should check and record.
    pub due: bool,
    /// The latest result, if any relay ever recorded one.
    pub latest: Option<ReconciliationCounts>,
}

pub struct ReconciliationResultStore;

impl ReconciliationResultStore {
    /// `older_than`: how old the latest result may be before a new check is due.
    pub async fn claim(
        client: &impl Connection,
        older_than: std::time::Duration,
    ) -> Result<ReconciliationClaim, StoreError> {
        let older_than_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        let row = statements::query_one(client, &CLAIM, &[&CHECK_LOCK_KEY, &older_than_ms]).await?;
        let latest = match row.try_get::<_, Option<DateTime<Utc>>>("checked_at")? {
            Some(checked_at) => Some(ReconciliationCounts {
                checked_at,
                charges_without_outbox: row.try_get("charges_without_outbox")?,
                stale_started_keys: row.try_get("stale_started_keys")?,
            }),
            None => None,
        };
        let locked: bool = row.try_get("locked")?;
        let due: bool = row.try_get("due")?;
        Ok(ReconciliationClaim {
            due: locked && due,
            latest,
        })
    }

    /// Lets the rest of the caller's transaction's statements run up to `timeout` each,
    /// and only while the caller is still connected.
    pub async fn bound_count(
        client: &impl Connection,
        timeout: std::time::Duration,
    ) -> Result<(), StoreError> {
        statements::query_one(
            client,
            &BOUND_COUNT,
            &[
                &timeout.as_millis().to_string(),
                &GONE_CHECK_EVERY.as_millis().to_string(),
            ],
        )
        .await?;
        Ok(())
    }

    /// Records a check's counts as the latest result (it commits with the caller's
    /// transaction) and returns it.
    pub async fn record(
        client: &impl Connection,
        charges_without_outbox: i64,
        stale_started_keys: i64,
    ) -> Result<ReconciliationCounts, StoreError> {
        let row = statements::query_one(
            client,
            &RECORD,
            &[&charges_without_outbox, &stale_started_keys],
        )
        .await?;
        Ok(ReconciliationCounts {
            checked_at: row.try_get("checked_at")?,
            charges_without_outbox: row.try_get("charges_without_outbox")?,
            stale_started_keys: row.try_get("stale_started_keys")?,
        })
    }
}

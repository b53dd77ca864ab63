//! Where the standbys are: the relay's replication gate (`--wait-for-standbys`). No
//! table of ours; `pg_stat_replication`, read through `charges_standby_flush_positions()`
//! (migration V12).

use crate::StoreError;
use crate::statements::{self, Connection, Sql, Type};

/// `ReplicationStandbysConfirmed`: whether the standbys `$2` (empty: any one standby)
/// have flushed the WAL up to `$1`, and how many bytes the one furthest behind still
/// lacks (NULL: no such standby is streaming).
const STANDBYS_CONFIRMED: Sql = Sql::new(
    "
SELECT coalesce(CASE WHEN cardinality($2::text[]) = 0
                     THEN bool_or(s.flush_lsn >= $1::pg_lsn)
                     ELSE count(DISTINCT s.standby) FILTER (WHERE s.flush_lsn >= $1::pg_lsn)
                          = cardinality($2::text[])
                END, false) AS confirmed,
       pg_wal_lsn_diff($1::pg_lsn,
                       CASE WHEN cardinality($2::text[]) = 0 THEN max(s.flush_lsn)
                            ELSE min(s.flush_lsn) END)::float8 AS lag_bytes
  FROM charges_standby_flush_positions() s
 WHERE cardinality($2::text[]) = 0 OR s.standby = ANY ($2::text[])",
    &[Type::TEXT, Type::TEXT_ARRAY],
);

/// What the standbys had flushed when asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StandbyProgress {
    pub confirmed: bool,
    /// Bytes of WAL the standby furthest behind still lacks; `None` when none of the
    /// standbys asked for is streaming.
    pub lag_bytes: Option<f64>,
}

pub struct ReplicationStore;

impl ReplicationStore {
    /// Whether `standbys` (empty: any standby) have flushed up to `position`.
    pub async fn standbys_confirmed(
        client: &impl Connection,
        position: &str,
        standbys: &[String],
    ) -> Result<StandbyProgress, StoreError> {
        let row =
            statements::query_one(client, &STANDBYS_CONFIRMED, &[&position, &standbys]).await?;
        Ok(StandbyProgress {
            confirmed: row.try_get("confirmed")?,
            lag_bytes: row.try_get("lag_bytes")?,
        })
    }
}

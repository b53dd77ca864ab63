//! Where the standbys are: the relay's replication gate (`--wait-for-standbys`). No
//! table of ours; `pg_stat_replication`, read through `outbox_standbys_flushed()`
//! (migration V15).

use chrono::{DateTime, Utc};
use tokio_postgres::types::PgLsn;

use pg_plumbing::StoreError;
use pg_plumbing::statements::{self, Connection, Sql, Type};

/// `ReplicationStandbysFlushed`: how far the standbys `$1` (empty: any one) have
/// flushed the WAL, or with `$2` those `synchronous_standby_names` names right now, and
/// how many bytes of WAL they still lack; `server` as in `OutboxClaimPending`.
const STANDBYS_FLUSHED: Sql = Sql::new(
    "
SELECT flushed, everything, pg_wal_lsn_diff(wal_end, flushed)::float8 AS lag_bytes,
       pg_postmaster_start_time() AS server
  FROM outbox_standbys_flushed($1::text[], $2)",
    &[Type::TEXT_ARRAY, Type::BOOL],
);

/// A position in one server's WAL. Positions of two servers do not compare: a promoted
/// standby's WAL goes on from where it was, not from where the old primary was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalPosition {
    pub lsn: u64,
    /// The server's postmaster start time: which server, as far as positions go.
    pub server: DateTime<Utc>,
}

impl std::fmt::Display for WalPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", PgLsn::from(self.lsn))
    }
}

/// Which standbys the gate waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateStandbys {
    /// Any one streaming standby.
    Any,
    /// Every one of these (`application_name`).
    Named(Vec<String>),
    /// Those `synchronous_standby_names` names when asked, counted as the server counts
    /// them; none to wait for while it names none.
    Synchronous,
}

/// What the standbys had flushed when asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StandbyFlush {
    /// The server that answered (see [`WalPosition`]).
    pub server: DateTime<Utc>,
    /// The WAL position they have all flushed; `None` while they are not all streaming.
    pub flushed: Option<u64>,
    /// `synchronous_standby_names` names no standby: nothing to wait for.
    pub everything: bool,
    /// Bytes of WAL they still lacked (`None` with `flushed`).
    pub lag_bytes: Option<f64>,
}

impl StandbyFlush {
    /// Whether a claim whose rows' commits end at or before `position` may go out:
    /// only an answer of the claim's own server counts.
    pub fn covers(&self, position: WalPosition) -> bool {
        self.server == position.server
            && (self.everything || self.flushed.is_some_and(|flushed| flushed >= position.lsn))
    }
}

pub struct ReplicationStore;

impl ReplicationStore {
    /// How far `standbys` have flushed the WAL.
    pub async fn standbys_flushed(
        client: &impl Connection,
        standbys: &GateStandbys,
    ) -> Result<StandbyFlush, StoreError> {
        let (names, sync): (&[String], bool) = match standbys {
            GateStandbys::Any => (&[], false),
            GateStandbys::Named(names) => (names, false),
            GateStandbys::Synchronous => (&[], true),
        };
        let row = statements::query_one(client, &STANDBYS_FLUSHED, &[&names, &sync]).await?;
        Ok(StandbyFlush {
            server: row.try_get("server")?,
            flushed: row.try_get::<_, Option<PgLsn>>("flushed")?.map(u64::from),
            everything: row.try_get("everything")?,
            lag_bytes: row.try_get("lag_bytes")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_claims_own_server_confirms_it() {
        let server = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let other = DateTime::from_timestamp(1_700_000_001, 0).unwrap();
        let at = |lsn| WalPosition { lsn, server };
        let flush = StandbyFlush {
            server,
            flushed: Some(1 << 32),
            everything: false,
            lag_bytes: Some(0.0),
        };
        assert!(flush.covers(at(5)) && flush.covers(at(1 << 32)));
        assert!(!flush.covers(at((1 << 32) + 1)));
        assert_eq!(at(1 << 32).to_string(), "1/0");
        let none = StandbyFlush {
            flushed: None,
            lag_bytes: None,
            ..flush
        };
        assert!(!none.covers(at(0)));
        let everything = StandbyFlush {
            everything: true,
            ..none
        };
        assert!(everything.covers(at(u64::MAX)));
        let elsewhere = StandbyFlush {
            server: other,
            ..everything
        };
        assert!(
            !elsewhere.covers(at(0)),
            "a promoted standby answered for the old primary"
        );
    }
}

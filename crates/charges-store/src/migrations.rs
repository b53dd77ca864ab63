//! The database's schema: three sets of migrations, each with its own refinery
//! history, applied in order under one lock (`pg_plumbing::migrations`):
//!
//! 1. `pg_idempotency::schema()`: `idempotency_keys` and its functions;
//! 2. `pg_outbox::schema()`: the outbox tables and functions;
//! 3. [`CHARGES`], the workspace's top-level `migrations/`: charges, refunds, and the
//!    function that composes the first two to create a charge in one statement.
//!
//! A database created before the split has its history in `refinery_schema_history`
//! ([`BEFORE_SPLIT`], `migrations-before-split/`, frozen at V15): it is first brought
//! to V15 there, after which the three sets adopt its tables as they are.

use deadpool_postgres::Pool;
use pg_plumbing::migrations::{self as sets, SchemaSet};

pub use pg_plumbing::migrations::SchemaStatus;

use crate::StoreError;

mod charges {
    refinery::embed_migrations!("../../migrations");
}

mod before_split {
    refinery::embed_migrations!("migrations-before-split");
}

/// The charges service's own set.
pub const CHARGES: SchemaSet = SchemaSet::new(
    "charges",
    "charges_schema_history",
    charges::migrations::runner,
);

/// The single history the schema had before each mechanism owned its part; only
/// upgrades databases that have it, and stays at V15.
pub const BEFORE_SPLIT: SchemaSet = SchemaSet::new(
    "charges-before-split",
    "refinery_schema_history",
    before_split::migrations::runner,
)
.upgrade_only();

/// Every set, in the order they are applied.
pub fn sets() -> [SchemaSet; 4] {
    [
        BEFORE_SPLIT,
        pg_idempotency::schema(),
        pg_outbox::schema(),
        CHARGES,
    ]
}

/// Serializes concurrent migrators of this schema (several API replicas started with
/// `--migrate`, or a Job racing a replica).
const MIGRATION_LOCK: i64 = 0x6368_6172_6765_7301; // "charges\x01"

/// Applies every pending migration of every set; returns how many were applied.
pub async fn run(pool: &Pool) -> Result<usize, StoreError> {
    let applied = sets::apply(pool, MIGRATION_LOCK, &sets()).await?;
    Ok(applied.iter().map(|(_, count)| count).sum())
}

/// Whether every set is at the version these binaries were built with; an error means
/// the database could not be asked.
pub async fn status(pool: &Pool) -> Result<SchemaStatus, StoreError> {
    sets::status(pool, &sets()).await
}

/// deploy/sql/grants.sql, embedded: what the API's and the relay's roles may do.
const GRANTS: &str = include_str!("../../../deploy/sql/grants.sql");

/// The database roles [`grant`] gives the least privileges to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRoles {
    pub api: String,
    pub relay: String,
}

impl GrantRoles {
    /// Role names go into SQL text (GRANT takes no parameters), so only plain
    /// lower-case identifiers are accepted.
    pub fn new(api: &str, relay: &str) -> Result<GrantRoles, StoreError> {
        for role in [api, relay] {
            let plain = role
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && role.len() <= 63
                && role
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !plain {
                return Err(StoreError::InvalidRole(role.to_owned()));
            }
        }
        Ok(GrantRoles {
            api: api.to_owned(),
            relay: relay.to_owned(),
        })
    }

    /// grants.sql with its role names replaced by these.
    pub fn sql(&self) -> String {
        GRANTS
            .replace("charges_api", &self.api)
            .replace("charges_relay", &self.relay)
    }
}

/// Runs grants.sql in one transaction, as the schema's owner, right after the
/// migrations: a migration that adds a table cannot leave the binaries without the
/// rights to use it (grants.sql is where it adds them).
pub async fn grant(pool: &Pool, roles: &GrantRoles) -> Result<(), StoreError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.batch_execute(&roles.sql()).await?;
    tx.commit().await?;
    tracing::info!(api = %roles.api, relay = %roles.relay, "grants applied");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_are_plain_identifiers_only() {
        assert!(GrantRoles::new("charges_api", "charges_relay_2").is_ok());
        for bad in [
            "",
            "Api",
            "1api",
            "api;drop table charges",
            "a\"b",
            "api role",
        ] {
            assert!(GrantRoles::new(bad, "charges_relay").is_err(), "{bad:?}");
        }
        let sql = GrantRoles::new("x_api", "x_relay").unwrap().sql();
        assert!(sql.contains("TO x_api;") && sql.contains("TO x_relay;"));
        assert!(!sql.contains("charges_api") && !sql.contains("charges_relay"));
    }
}

//! The schema, embedded from the workspace's `migrations/` folder at compile time.

use deadpool_postgres::Pool;

use crate::StoreError;
use crate::statements::{self, Sql};

mod embedded {
    refinery::embed_migrations!("../../migrations");
}

/// Serializes concurrent migrators of this schema (several API replicas started with
/// `--migrate`, or a Job racing a replica).
const MIGRATION_LOCK: i64 = 0x6368_6172_6765_7301; // "charges\x01"

/// Applies every pending migration and returns the version the schema is now at.
pub async fn run(pool: &Pool) -> Result<Option<i32>, StoreError> {
    let applied = run_locked(pool, embedded::migrations::runner(), MIGRATION_LOCK).await?;
    let version = current_version(pool).await?;
    tracing::info!(applied, ?version, "migrations up to date");
    Ok(version)
}

/// Runs `runner` (divergent history aborts) while holding the session advisory lock
/// `lock`: refinery itself takes no lock, so two migrators would otherwise apply the
/// same migration twice. Returns how many migrations were applied. Every schema
/// with its own history (this crate's, the reference consumer's) migrates through here.
pub async fn run_locked(
    pool: &Pool,
    runner: refinery::Runner,
    lock: i64,
) -> Result<usize, StoreError> {
    // The lock is a session's, and refinery runs each migration in a transaction of
    // its own: through a transaction pooler, lock, migrations and unlock could each
    // land on another server session.
    if statements::through_transaction_pooler() {
        return Err(StoreError::NeedsSession("applying migrations"));
    }
    let mut client = pool.get().await?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&lock])
        .await?;
    let report = runner
        .set_abort_divergent(true)
        .run_async(&mut **client)
        .await;
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&lock])
        .await?;
    Ok(report?.applied_migrations().len())
}

/// How the database's schema compares with the one these binaries were built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaStatus {
    /// At or ahead of [`expected_version`]. Ahead is fine: migrations are additive
    /// (expand, then contract in a later release), and during a rolling deploy the
    /// migration Job runs before the new pods, so the old pods must stay ready.
    Current { version: Option<i32> },
    /// Behind [`expected_version`] (or never migrated): this code would use columns
    /// or tables that are not there yet.
    Behind {
        current: Option<i32>,
        expected: Option<i32>,
    },
}

/// Reads the applied version and compares it; an error means the database could not
/// be asked (unreachable, or the pool could not get a connection in time).
pub async fn status(pool: &Pool) -> Result<SchemaStatus, StoreError> {
    let current = current_version(pool).await?;
    let expected = expected_version();
    // `None` (empty database) orders before every `Some`.
    if current >= expected {
        Ok(SchemaStatus::Current { version: current })
    } else {
        Ok(SchemaStatus::Behind { current, expected })
    }
}

/// The highest version these binaries were built with; `/readyz` compares it.
pub fn expected_version() -> Option<i32> {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| m.version())
        .max()
}

/// The highest version applied to the database, `None` on an empty database.
pub async fn current_version(pool: &Pool) -> Result<Option<i32>, StoreError> {
    let client = pool.get().await?;
    let exists: bool = statements::query_one(&client, &HISTORY_EXISTS, &[])
        .await?
        .try_get("exists")?;
    if !exists {
        return Ok(None);
    }
    Ok(statements::query_one(&client, &HISTORY_VERSION, &[])
        .await?
        .try_get("version")?)
}

/// `RefinerySchemaHistoryExists`
const HISTORY_EXISTS: Sql = Sql::new(
    "SELECT to_regclass('refinery_schema_history') IS NOT NULL AS exists",
    &[],
);

/// `RefinerySchemaHistoryVersion`
const HISTORY_VERSION: Sql = Sql::new(
    "SELECT max(version) AS version FROM refinery_schema_history",
    &[],
);

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

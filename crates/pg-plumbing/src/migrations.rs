//! Schemas that several crates own, in one database.
//!
//! Each owner (a mechanism crate, the service itself) ships a [`SchemaSet`]: refinery
//! migrations embedded from its own folder and recorded in a history table of its own,
//! so that one owner's versions never collide with another's and each set can be
//! released on its own. A service applies its sets in order with [`apply`], under one
//! advisory lock, and asks [`status`] whether the database has caught up with the
//! sets it was built with.

use deadpool_postgres::Pool;
use tokio_postgres::types::Type;

use crate::StoreError;
use crate::statements::{self, Sql};

/// One owner's migrations and where their history is recorded.
#[derive(Clone, Copy)]
pub struct SchemaSet {
    /// Who owns the set, for logs and readiness messages (`idempotency`, `outbox`, …).
    pub name: &'static str,
    /// refinery's history table for this set alone.
    pub history_table: &'static str,
    /// A set that only brings databases created by an older layout up to the point
    /// where the other sets take over: applied only where its history table exists,
    /// never on a new database, and not part of [`status`].
    pub upgrade_only: bool,
    runner: fn() -> refinery::Runner,
}

impl std::fmt::Debug for SchemaSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaSet")
            .field("name", &self.name)
            .field("history_table", &self.history_table)
            .field("upgrade_only", &self.upgrade_only)
            .finish_non_exhaustive()
    }
}

impl SchemaSet {
    /// `runner` is what refinery's `embed_migrations!` generates (`migrations::runner`).
    pub const fn new(
        name: &'static str,
        history_table: &'static str,
        runner: fn() -> refinery::Runner,
    ) -> SchemaSet {
        SchemaSet {
            name,
            history_table,
            upgrade_only: false,
            runner,
        }
    }

    /// The same set, applied only to databases that already have its history.
    pub const fn upgrade_only(self) -> SchemaSet {
        SchemaSet {
            upgrade_only: true,
            ..self
        }
    }

    /// The migrations, recorded in this set's history table.
    pub fn runner(&self) -> refinery::Runner {
        let mut runner = (self.runner)();
        runner.set_migration_table_name(self.history_table);
        runner.set_abort_divergent(true)
    }

    /// The highest version this build carries.
    pub fn expected_version(&self) -> Option<i32> {
        (self.runner)()
            .get_migrations()
            .iter()
            .map(|m| m.version())
            .max()
    }

    /// The highest version applied to the database, `None` before the first.
    pub async fn current_version(
        &self,
        client: &deadpool_postgres::Client,
    ) -> Result<Option<i32>, StoreError> {
        if !self.history_exists(client).await? {
            return Ok(None);
        }
        // The table name is the set's own constant, never input: identifiers cannot
        // be bound as parameters.
        let sql = format!("SELECT max(version) AS version FROM {}", self.history_table);
        Ok(client.query_one(&sql, &[]).await?.try_get("version")?)
    }

    async fn history_exists(&self, client: &deadpool_postgres::Client) -> Result<bool, StoreError> {
        Ok(
            statements::query_one(client, &HISTORY_EXISTS, &[&self.history_table])
                .await?
                .try_get("exists")?,
        )
    }
}

/// `SchemaHistoryExists`
const HISTORY_EXISTS: Sql = Sql::new(
    "SELECT to_regclass($1) IS NOT NULL AS exists",
    &[Type::TEXT],
);

/// Applies every pending migration of `sets`, in order, while holding the session
/// advisory lock `lock`: refinery takes no lock itself, so two migrators (replicas
/// started with `--migrate`, a Job racing one) would otherwise apply a migration twice.
/// Returns how many migrations each set applied.
pub async fn apply(
    pool: &Pool,
    lock: i64,
    sets: &[SchemaSet],
) -> Result<Vec<(&'static str, usize)>, StoreError> {
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
    let applied = apply_locked(&mut client, sets).await;
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&lock])
        .await?;
    applied
}

async fn apply_locked(
    client: &mut deadpool_postgres::Client,
    sets: &[SchemaSet],
) -> Result<Vec<(&'static str, usize)>, StoreError> {
    let mut applied = Vec::with_capacity(sets.len());
    for set in sets {
        if set.upgrade_only && !set.history_exists(client).await? {
            continue;
        }
        let report = set.runner().run_async(&mut ***client).await?;
        let count = report.applied_migrations().len();
        tracing::info!(set = set.name, applied = count, "migrations up to date");
        applied.push((set.name, count));
    }
    Ok(applied)
}

/// How the database's schema compares with the sets these binaries were built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaStatus {
    /// Every set at or ahead of its expected version. Ahead is fine: migrations are
    /// additive (expand, then contract in a later release), and during a rolling
    /// deploy the migration Job runs before the new pods, so the old pods must stay
    /// ready.
    Current,
    /// `set` is behind (or was never applied): this code would use columns or tables
    /// that are not there yet.
    Behind {
        set: &'static str,
        current: Option<i32>,
        expected: Option<i32>,
    },
}

/// Compares every set (but upgrade-only ones) with the database; an error means the
/// database could not be asked.
pub async fn status(pool: &Pool, sets: &[SchemaSet]) -> Result<SchemaStatus, StoreError> {
    let client = pool.get().await?;
    for set in sets.iter().filter(|set| !set.upgrade_only) {
        let current = set.current_version(&client).await?;
        let expected = set.expected_version();
        // `None` (never applied) orders before every `Some`.
        if current < expected {
            return Ok(SchemaStatus::Behind {
                set: set.name,
                current,
                expected,
            });
        }
    }
    Ok(SchemaStatus::Current)
}

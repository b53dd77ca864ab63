//! The consumer's schema, embedded from this crate's `migrations/` folder. Kept apart
//! from the API's migrations (and recorded in its own history table) because the
//! consumer's database is the consumer team's: it may be the API's, or another one.

use deadpool_postgres::Pool;

use crate::ConsumerError;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// refinery's history table for this schema; the API's is `refinery_schema_history`.
pub const HISTORY_TABLE: &str = "consumer_schema_history";

/// Serializes concurrent migrators (several consumer replicas started with `--migrate`).
const MIGRATION_LOCK: i64 = 0x6368_6172_6765_7302; // "charges\x02"

/// Applies every pending consumer migration.
pub async fn run(pool: &Pool) -> Result<(), ConsumerError> {
    let mut runner = embedded::migrations::runner();
    runner.set_migration_table_name(HISTORY_TABLE);
    let applied = charges_store::migrations::run_locked(pool, runner, MIGRATION_LOCK).await?;
    tracing::info!(applied, "consumer migrations up to date");
    Ok(())
}

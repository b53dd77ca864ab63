//! The schema, embedded from the workspace's `migrations/` folder at compile time.

use deadpool_postgres::Pool;

use crate::StoreError;

mod embedded {
    refinery::embed_migrations!("../../migrations");
}

/// Serializes concurrent migrators (several API replicas started with `--migrate`, or a
/// Job racing a replica): refinery itself takes no lock.
const MIGRATION_LOCK: i64 = 0x6368_6172_6765_7301; // "charges\x01"

/// Applies every pending migration and returns the version the schema is now at.
pub async fn run(pool: &Pool) -> Result<Option<i32>, StoreError> {
    let mut client = pool.get().await?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let report = embedded::migrations::runner()
        .set_abort_divergent(true)
        .run_async(&mut **client)
        .await;
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await?;
    let applied = report?.applied_migrations().len();
    let version = current_version(pool).await?;
    tracing::info!(applied, ?version, "migrations up to date");
    Ok(version)
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
    let exists = client
        .query_one(
            "SELECT to_regclass('refinery_schema_history') IS NOT NULL",
            &[],
        )
        .await?
        .get::<_, bool>(0);
    if !exists {
        return Ok(None);
    }
    Ok(client
        .query_one("SELECT max(version) FROM refinery_schema_history", &[])
        .await?
        .get::<_, Option<i32>>(0))
}

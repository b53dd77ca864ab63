//! The consumer's schema, embedded from this crate's `migrations/` folder. Kept apart
//! from the API's migrations (and recorded in its own history table) because the
//! consumer's database is the consumer team's: it may be the API's, or another one.

use deadpool_postgres::Pool;
use pg_plumbing::SchemaSet;

use crate::ConsumerError;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// The consumer's set; refinery's history table is `consumer_schema_history`.
pub const CONSUMER: SchemaSet = SchemaSet::new(
    "consumer",
    "consumer_schema_history",
    embedded::migrations::runner,
);

/// Serializes concurrent migrators (several consumer replicas started with `--migrate`).
const MIGRATION_LOCK: i64 = 0x6368_6172_6765_7302; // "charges\x02"

/// Applies every pending consumer migration, then the inbox's (`pg_inbox`), which
/// adopts the `processed_events` table this consumer's first migration created before
/// the inbox was a crate of its own.
pub async fn run(pool: &Pool) -> Result<(), ConsumerError> {
    pg_plumbing::migrations::apply(pool, MIGRATION_LOCK, &[CONSUMER, pg_inbox::schema()]).await?;
    Ok(())
}

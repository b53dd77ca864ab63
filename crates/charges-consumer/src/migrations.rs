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

/// The consumer's sets, in order: its own, then the inbox's (`pg_inbox`), which adopts
/// the `processed_events` table this consumer's first migration created before the
/// inbox was a crate of its own. `/readyz` compares both: the consumer's database may
/// be the API's or one of its own.
pub fn sets() -> [SchemaSet; 2] {
    [CONSUMER, pg_inbox::schema()]
}

/// Applies every pending migration of [`sets`].
pub async fn run(pool: &Pool) -> Result<(), ConsumerError> {
    pg_plumbing::migrations::apply(pool, MIGRATION_LOCK, &sets()).await?;
    Ok(())
}

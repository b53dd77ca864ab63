//! The mechanism's tables and functions (`migrations/` of this crate), as a
//! [`SchemaSet`] with its own refinery history, `idempotency_schema_history`.

use pg_plumbing::SchemaSet;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// `idempotency_keys` and its functions. Apply it with `pg_plumbing::migrations::apply`,
/// before the sets of the service whose functions call it.
pub fn schema() -> SchemaSet {
    SchemaSet::new(
        "idempotency",
        "idempotency_schema_history",
        embedded::migrations::runner,
    )
}

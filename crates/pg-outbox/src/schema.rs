//! The mechanism's tables and functions (`migrations/` of this crate), as a
//! [`SchemaSet`] with its own refinery history, `outbox_schema_history`.

use pg_plumbing::SchemaSet;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// The outbox tables and functions. Apply it with `pg_plumbing::migrations::apply`,
/// before the sets of the service whose functions call it.
pub fn schema() -> SchemaSet {
    SchemaSet::new(
        "outbox",
        "outbox_schema_history",
        embedded::migrations::runner,
    )
}

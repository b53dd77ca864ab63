//! The one-shot commands: `charges-relay dead list|requeue` and `charges-relay purge`.

use std::io::Write;

use charges_maintenance::{ExpiredKeyPurger, RunOutcome};
use charges_runtime::DatabaseArgs;
use charges_store::{DeadEvent, OutboxStore, Pool};
use tokio::sync::watch;

use crate::RelayError;
use crate::config::{DeadAction, DeadArgs};

async fn connect(database: &DatabaseArgs, application_name: &str) -> Result<Pool, RelayError> {
    Ok(charges_store::connect(
        &database.database_url,
        &database.pool_settings(application_name, 1),
    )
    .await?)
}

fn out(text: std::fmt::Arguments<'_>) -> Result<(), RelayError> {
    std::io::stdout()
        .lock()
        .write_fmt(text)
        .map_err(RelayError::Output)
}

/// `charges-relay purge`: expired `COMPLETED` idempotency keys, until none is left (or
/// another process holds the job's lock), then exit.
pub async fn purge(database: &DatabaseArgs) -> Result<(), RelayError> {
    let pool = connect(database, "charges-relay-purge").await?;
    // A one-shot command is not interrupted midway: it ends by itself, batch by batch.
    let (_never, shutdown) = watch::channel(false);
    let job = ExpiredKeyPurger {
        interval: std::time::Duration::MAX,
    };
    let deleted = match charges_maintenance::run_once(&pool, &job, &shutdown).await? {
        RunOutcome::Ran { rows } => rows,
        RunOutcome::Skipped => 0,
    };
    out(format_args!("deleted {deleted} expired idempotency keys\n"))
}

/// `charges-relay dead list|requeue`.
pub async fn dead(database: &DatabaseArgs, args: DeadArgs) -> Result<(), RelayError> {
    let pool = connect(database, "charges-relay-dead").await?;
    let client = pool.get().await?;
    match args.action {
        DeadAction::List { limit } => print_dead(&OutboxStore::list_dead(&client, limit).await?),
        DeadAction::Requeue { id, all } => {
            let ids = if all { None } else { Some(id.as_slice()) };
            let requeued = OutboxStore::requeue_dead(&client, ids).await?;
            out(format_args!("requeued {requeued} dead outbox rows\n"))
        }
    }
}

fn print_dead(rows: &[DeadEvent]) -> Result<(), RelayError> {
    out(format_args!(
        "id\taggregate_id\tevent_type\tattempts\tcreated_at\tdead_at\tlast_error\n"
    ))?;
    for row in rows {
        out(format_args!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            row.id,
            row.aggregate_id,
            row.event_type,
            row.attempts,
            row.created_at.to_rfc3339(),
            row.dead_at.to_rfc3339(),
            row.last_error
                .as_deref()
                .unwrap_or_default()
                .replace(['\t', '\n'], " "),
        ))?;
    }
    Ok(())
}

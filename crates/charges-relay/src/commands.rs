//! The one-shot commands: `charges-relay dead list|show|requeue|discard` and
//! `charges-relay purge`.

use std::io::Write;

use charges_maintenance::{PurgeExpiredKeys, RunOutcome};
use charges_runtime::DatabaseArgs;
use charges_runtime::secrets::ExposeSecret;
use charges_store::{DeadEvent, GenericClient, OutboxStore, Pool};
use pg_outbox::relay::failure::{FailureKind, kind_of_stored_error};
use tokio::sync::watch;
use uuid::Uuid;

use crate::RelayError;
use crate::config::{DeadAction, DeadArgs, RequeueArgs};

async fn connect(database: &DatabaseArgs, application_name: &str) -> Result<Pool, RelayError> {
    Ok(charges_store::connect(
        database.database_url.expose_secret(),
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
    let job = PurgeExpiredKeys {
        interval: std::time::Duration::MAX,
    };
    let deleted = match charges_maintenance::run_once(&pool, &job, &shutdown).await? {
        RunOutcome::Ran { rows } => rows,
        RunOutcome::Skipped => 0,
    };
    out(format_args!("deleted {deleted} expired idempotency keys\n"))
}

/// Why a `dead` command refused to act.
#[derive(Debug, thiserror::Error)]
pub enum DeadCommandError {
    #[error("not dead (unknown, pending or published), so nothing was done: {0}")]
    NotDead(String),
    #[error("not on a terminal: pass --yes to discard without asking")]
    ConfirmationNeeded,
    #[error("not confirmed: nothing was discarded")]
    NotConfirmed,
    #[error("reading the confirmation failed")]
    Confirmation(#[source] std::io::Error),
}

/// `charges-relay dead list|show|requeue|discard`.
pub async fn dead(database: &DatabaseArgs, args: DeadArgs) -> Result<(), RelayError> {
    let pool = connect(database, "charges-relay-dead").await?;
    let mut client = pool.get().await?;
    match args.action {
        DeadAction::List { limit } => {
            print_dead(&OutboxStore::list_dead(&client, limit, None).await?)
        }
        DeadAction::Show { id } => match OutboxStore::get_dead(&client, &[id]).await?.first() {
            Some(row) => print_dead_row(row),
            None => Err(DeadCommandError::NotDead(id.to_string()).into()),
        },
        DeadAction::Discard { ids, by, yes } => {
            let by = by.unwrap_or_else(|| "unknown".to_owned());
            discard(&mut client, &ids, &by, yes).await
        }
        DeadAction::Requeue(selection) => {
            let tx = client.transaction().await?;
            let ids = select_for_requeue(&tx, &selection).await?;
            let requeued = OutboxStore::requeue_dead(&tx, &ids).await?;
            tx.commit().await?;
            for id in &requeued {
                tracing::info!(%id, "requeued dead outbox row");
            }
            out(format_args!(
                "requeued {} dead outbox rows\n",
                requeued.len()
            ))
        }
    }
}

/// `dead discard`: every id must be dead; the rows move to `outbox_discarded` in one
/// transaction, and each gets an audit line on stdout.
async fn discard(
    client: &mut deadpool_postgres::Object,
    ids: &[Uuid],
    by: &str,
    yes: bool,
) -> Result<(), RelayError> {
    let tx = client.transaction().await?;
    let rows = dead_rows(&tx, ids).await?;
    confirm(rows.len(), yes)?;
    let discarded = OutboxStore::discard_dead(&tx, ids, by).await?;
    tx.commit().await?;
    let at = chrono::Utc::now().to_rfc3339();
    for row in rows.iter().filter(|row| discarded.contains(&row.id)) {
        tracing::warn!(id = %row.id, by, "discarded a dead outbox row");
        out(format_args!(
            "discarded {} ({} of {}, sequence {}) by {by} at {at}\n",
            row.id,
            row.event_type,
            row.aggregate_id,
            row.sequence
                .map_or_else(|| "-".to_owned(), |s| s.to_string()),
        ))?;
    }
    Ok(())
}

/// The dead rows `ids` name, or an error naming the ids that are not dead.
async fn dead_rows(
    client: &impl charges_store::Connection,
    ids: &[Uuid],
) -> Result<Vec<DeadEvent>, RelayError> {
    let rows = OutboxStore::get_dead(client, ids).await?;
    let missing: Vec<String> = ids
        .iter()
        .filter(|id| !rows.iter().any(|row| row.id == **id))
        .map(ToString::to_string)
        .collect();
    if missing.is_empty() {
        Ok(rows)
    } else {
        Err(DeadCommandError::NotDead(missing.join(", ")).into())
    }
}

/// `--yes`, or a "y" typed on the terminal.
fn confirm(rows: usize, yes: bool) -> Result<(), RelayError> {
    use std::io::{BufRead, IsTerminal};
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(DeadCommandError::ConfirmationNeeded.into());
    }
    eprint!("discard {rows} dead outbox row(s)? Their events will never be published. [y/N] ");
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(DeadCommandError::Confirmation)?;
    if answer.trim().eq_ignore_ascii_case("y") {
        Ok(())
    } else {
        Err(DeadCommandError::NotConfirmed.into())
    }
}

/// The ids `dead requeue` takes. Named ids must all be dead: one that is not means a
/// typo or a stale list, and nothing is requeued.
async fn select_for_requeue(
    client: &impl charges_store::Connection,
    selection: &RequeueArgs,
) -> Result<Vec<Uuid>, RelayError> {
    if !selection.id.is_empty() {
        return Ok(dead_rows(client, &selection.id)
            .await?
            .iter()
            .map(|row| row.id)
            .collect());
    }
    let rows =
        OutboxStore::list_dead(client, i64::MAX, selection.last_error_like.as_deref()).await?;
    Ok(rows
        .iter()
        .filter(|row| {
            !selection.unavailable
                || row.last_error.as_deref().and_then(kind_of_stored_error)
                    == Some(FailureKind::Unavailable)
        })
        .map(|row| row.id)
        .collect())
}

fn print_dead(rows: &[DeadEvent]) -> Result<(), RelayError> {
    out(format_args!(
        "id\taggregate_id\tevent_type\tsequence\tattempts\trejections\tcreated_at\tdead_at\tlast_error\n"
    ))?;
    for row in rows {
        out(format_args!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
            row.id,
            row.aggregate_id,
            row.event_type,
            row.sequence
                .map_or_else(|| "-".to_owned(), |s| s.to_string()),
            row.attempts,
            row.rejections,
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

fn print_dead_row(row: &DeadEvent) -> Result<(), RelayError> {
    out(format_args!(
        "id:           {}\naggregate_id: {}\nevent_type:   {}\nsequence:     {}\nattempts:     {}\nrejections:   {}\ncreated_at:   {}\ndead_at:      {}\nlast_error:   {}\npayload:      {}\n",
        row.id,
        row.aggregate_id,
        row.event_type,
        row.sequence
            .map_or_else(|| "-".to_owned(), |s| s.to_string()),
        row.attempts,
        row.rejections,
        row.created_at.to_rfc3339(),
        row.dead_at.to_rfc3339(),
        row.last_error.as_deref().unwrap_or_default(),
        row.payload,
    ))
}

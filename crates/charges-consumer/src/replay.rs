//! `charges-consumer parked list|replay`.

use std::io::Write;

use charges_runtime::DatabaseArgs;
use charges_runtime::secrets::ExposeSecret;

use crate::apply::{Applied, apply};
use crate::config::{Ordering, ParkedAction, ParkedArgs};
use crate::event::decode;
use crate::parked::{Parked, ParkedStore};
use crate::{ConsumerError, error_chain};
use pg_inbox::Source;

fn out(text: std::fmt::Arguments<'_>) -> Result<(), ConsumerError> {
    std::io::stdout()
        .lock()
        .write_fmt(text)
        .map_err(ConsumerError::Output)
}

pub async fn parked(database: &DatabaseArgs, args: ParkedArgs) -> Result<(), ConsumerError> {
    let pool = charges_store::connect(
        database.database_url.expose_secret(),
        &database.pool_settings("charges-consumer-parked", 1),
    )
    .await?;
    match args.action {
        ParkedAction::List { limit } => {
            let client = pool.get().await?;
            out(format_args!(
                "topic\tpartition\toffset\tid\tce_type\tattempts\tparked_at\treason\n"
            ))?;
            for row in ParkedStore::list(&client, limit).await? {
                out(format_args!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                    row.topic,
                    row.partition,
                    row.offset,
                    row.message.id.as_deref().unwrap_or("-"),
                    row.message.ce_type.as_deref().unwrap_or("-"),
                    row.attempts,
                    row.parked_at.to_rfc3339(),
                    row.reason.replace(['\t', '\n'], " "),
                ))?;
            }
            Ok(())
        }
        ParkedAction::Replay { limit, ordering } => {
            let rows = ParkedStore::list(&pool.get().await?, limit).await?;
            for row in rows {
                let outcome = replay_one(&pool, &row, ordering == Ordering::PerAggregate).await?;
                out(format_args!(
                    "{}:{}:{} {outcome}\n",
                    row.topic, row.partition, row.offset
                ))?;
            }
            Ok(())
        }
    }
}

/// Decodes and applies one parked message: gone from the table if it applied (or was
/// a duplicate), parked again with the new reason otherwise.
async fn replay_one(
    pool: &deadpool_postgres::Pool,
    row: &Parked,
    check_order: bool,
) -> Result<String, ConsumerError> {
    let source = Source {
        topic: &row.topic,
        partition: row.partition,
        offset: row.offset,
    };
    let reason = match decode(&row.message) {
        Err(rejection) => rejection.to_string(),
        Ok(event) => match apply(pool, &event, source, check_order).await {
            Ok(applied) => {
                ParkedStore::delete(&pool.get().await?, row).await?;
                return Ok(match applied {
                    Applied::Duplicate => "duplicate: removed".to_owned(),
                    Applied::Applied | Applied::AppliedOutOfOrder { .. } => {
                        "applied: removed".to_owned()
                    }
                });
            }
            Err(error) => error_chain(&error),
        },
    };
    ParkedStore::park(&pool.get().await?, source, &row.message, &reason).await?;
    Ok(format!("still parked: {reason}"))
}

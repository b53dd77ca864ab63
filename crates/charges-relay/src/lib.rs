//! The outbox relay: publishes committed `outbox` rows to Kafka, at least once.
//!
//! # The loop
//!
//! In one transaction the relay claims a batch of pending rows (`SELECT … ORDER BY
//! created_at LIMIT n FOR UPDATE SKIP LOCKED`, only rows neither published nor dead
//! whose `next_attempt_at` has come), publishes the whole batch concurrently, waits for
//! the broker's acknowledgements, marks the acknowledged rows published (one `UPDATE …
//! WHERE id = ANY($1)`), records the failures (one `UPDATE … FROM unnest(…)`: attempts,
//! last error, next attempt with jittered exponential backoff, dead after
//! `--max-attempts`), and commits. A full batch is followed by the next claim at once;
//! otherwise the relay sleeps until a `NOTIFY outbox_pending` (sent by an insert
//! trigger on commit) or `--poll-interval`, whichever comes first. `--concurrency`
//! such loops run at once, so that one claims and marks while another waits for
//! acknowledgements; `SKIP LOCKED` keeps their batches disjoint.
//!
//! # Design note: the claim is a row lock, not a state
//!
//! A claimed row is held by the row lock of the batch transaction, for the life of that
//! transaction, not by a "claimed by X until T" column plus a rescuer that frees the
//! claims of dead relays (River's and crates.io's workers do the latter, because their
//! jobs run for minutes). Why: when a relay crashes or is partitioned away, its
//! connection goes and its locks go with it, so no rescuer, lease length or clock is
//! needed, and other relays simply `SKIP LOCKED` past live claims. The cost is a
//! transaction open while the batch is in flight; it is bounded by the publish timeout
//! plus a small margin (`message.timeout.ms`, a `tokio::time::timeout` around the
//! wait, and server-side `SET LOCAL idle_in_transaction_session_timeout` and
//! `statement_timeout` just above it; see [`relay::Relay::run_batch`]), a few seconds
//! during which vacuum cannot remove rows newer than the transaction.
//!
//! # Guarantees
//!
//! A row is marked published only after the broker acknowledged it (`acks=all`,
//! idempotent producer). If the relay dies between the acknowledgement and the commit,
//! the row is published again by the next relay: consumers deduplicate on header `id`
//! (= the outbox id = `eventId` in the payload).

pub mod backoff;
pub mod cleanup;
pub mod config;
mod error;
pub mod listener;
pub mod metrics;
mod ops;
pub mod publish;
pub mod reconcile;
pub mod relay;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use charges_store::{OutboxStore, PoolSettings};
use rdkafka::producer::Producer;
use tokio::sync::{Notify, watch};

pub use error::{RelayError, error_chain};

use crate::backoff::Backoff;
use crate::cleanup::Retention;
use crate::config::{Cli, Command, DeadAction, DeadArgs, PurgeArgs, RunArgs};
use crate::publish::MessageSettings;
use crate::relay::{Relay, RelaySettings};

/// Every secret on the command line, for the log redactor: the database password and
/// the values of secret `--kafka-config` settings (`sasl.password`, …).
pub fn secrets(cli: &Cli) -> Vec<String> {
    let database_url = match &cli.command {
        None => &cli.run.database.database_url,
        Some(Command::Dead(args)) => &args.database.database_url,
        Some(Command::Purge(args)) => &args.database.database_url,
    };
    let mut secrets = charges_runtime::secrets::database_password(database_url);
    secrets.extend(charges_runtime::secrets::kafka_config_secrets(
        &cli.run.kafka_config,
    ));
    secrets
}

/// Runs what the command line asks for.
pub async fn main(cli: Cli) -> Result<(), RelayError> {
    match cli.command {
        None => run(cli.run).await,
        Some(Command::Dead(args)) => dead(args).await,
        Some(Command::Purge(args)) => purge(args).await,
    }
}

/// Resolves on the first SIGTERM or SIGINT.
async fn shutdown_signal() -> Result<impl Future<Output = &'static str>, RelayError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(RelayError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(RelayError::Signal)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// The relay loop, until SIGTERM/SIGINT.
pub async fn run(args: RunArgs) -> Result<(), RelayError> {
    let settings = RelaySettings {
        message: MessageSettings {
            topic: args.topic.clone(),
            key: args.message_key,
            event_source: args.event_source.clone(),
        },
        batch_size: args.batch_size,
        publish_timeout: args.publish_timeout,
        max_attempts: args.max_attempts,
        backoff: Backoff {
            base: args.backoff_base,
            max: args.backoff_max,
        },
    };
    let pool = charges_store::connect(
        &args.database.database_url,
        &PoolSettings {
            // The batch loops, retention, reconciliation and /readyz (LISTEN has its own).
            max_size: args.concurrency as usize + 4,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: settings.transaction_timeout(),
            application_name: "charges-relay".to_owned(),
            tls: args.database.tls(),
        },
    )
    .await?;
    if args.migrate {
        charges_store::migrations::run(&pool).await?;
    }
    let producer = publish::producer(
        &args.kafka_brokers,
        args.publish_timeout,
        &args.kafka_config,
    )?;

    let metrics_handle = metrics::install()?;
    let upkeep = tokio::spawn(metrics::upkeep(metrics_handle.clone()));
    let (ops, ops_addrs) = ops::start(args.metrics_listen, pool.clone(), metrics_handle)?;
    let metrics_addr = ops_addrs
        .first()
        .map_or_else(String::new, ToString::to_string);

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let signal = shutdown_signal().await?;
    let wake = Arc::new(Notify::new());
    let listener = listener::start(
        &args.database.database_url,
        &args.database.tls(),
        wake.clone(),
        shutdown_rx.clone(),
    )
    .await?;
    let cleanup = tokio::spawn(cleanup::run(
        pool.clone(),
        vec![
            Retention::PublishedOutbox(args.published_retention),
            Retention::ExpiredIdempotencyKeys,
        ],
        args.cleanup_interval,
        shutdown_rx.clone(),
    ));
    let reconcile = tokio::spawn(reconcile::run(
        pool.clone(),
        reconcile::ReconcileSettings {
            stats_interval: args.stats_interval,
            reconcile_interval: args.reconcile_interval,
            outbox_window: args.published_retention,
            stale_started_after: args.stale_started_after,
        },
        shutdown_rx.clone(),
    ));
    tracing::info!(
        %metrics_addr,
        topic = %args.topic,
        brokers = %args.kafka_brokers,
        batch_size = args.batch_size,
        concurrency = args.concurrency,
        publish_timeout = ?args.publish_timeout,
        "relay started"
    );

    tokio::spawn(async move {
        let name = signal.await;
        tracing::info!(
            signal = name,
            "shutting down: finishing the in-flight batches"
        );
        let _ = shutdown_tx.send(true);
    });

    let relay = Arc::new(Relay::new(pool, producer, settings));
    let loops: Vec<_> = (0..args.concurrency)
        .map(|_| {
            tokio::spawn(batch_loop(
                relay.clone(),
                wake.clone(),
                shutdown_rx.clone(),
                args.poll_interval,
            ))
        })
        .collect();
    for batch_loop in loops {
        if let Err(e) = batch_loop.await {
            tracing::error!(error = %e, "a batch loop ended abnormally");
        }
    }

    let flushed = relay.producer().flush(args.publish_timeout);
    if let Err(e) = flushed {
        tracing::warn!(error = %e, "producer flush incomplete");
    }
    listener.abort();
    cleanup.abort();
    reconcile.abort();
    ops.stop(true).await;
    upkeep.abort();
    tracing::info!("relay stopped");
    Ok(())
}

/// One of the `--concurrency` loops: batch after batch while batches come back full,
/// otherwise wait for a notification, the poll interval or shutdown. Loops share the
/// producer and the pool; `SKIP LOCKED` gives each batch disjoint rows, so while one
/// loop waits for the broker's acknowledgements another claims and marks.
async fn batch_loop(
    relay: Arc<Relay>,
    wake: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
    poll_interval: Duration,
) {
    let mut consecutive_errors: u32 = 0;
    while !*shutdown.borrow() {
        // Never cancelled midway: a batch ends by itself within the publish timeout
        // plus margin, and whatever it did not see acknowledged stays unmarked.
        let wait = match relay.run_batch().await {
            Ok(outcome) => {
                consecutive_errors = 0;
                if outcome.claimed == relay.settings().batch_size as usize {
                    continue;
                }
                poll_interval
            }
            Err(e) => {
                consecutive_errors = consecutive_errors.saturating_add(1);
                tracing::error!(error = %error_chain(&e), "relay batch failed");
                // Back off on a database outage, up to ten poll intervals.
                poll_interval * consecutive_errors.min(10)
            }
        };
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// `charges-relay purge`: expired `COMPLETED` idempotency keys, until none is left
/// (or another runner holds the lock), then exit.
pub async fn purge(args: PurgeArgs) -> Result<(), RelayError> {
    let pool = charges_store::connect(
        &args.database.database_url,
        &PoolSettings {
            max_size: 1,
            application_name: "charges-relay-purge".to_owned(),
            tls: args.database.tls(),
            ..PoolSettings::default()
        },
    )
    .await?;
    // A one-shot command is not interrupted midway: it ends by itself, batch by batch.
    let (_never, shutdown) = watch::channel(false);
    let deleted =
        cleanup::cleanup_once(&pool, Retention::ExpiredIdempotencyKeys, &shutdown).await?;
    writeln!(
        std::io::stdout().lock(),
        "deleted {deleted} expired idempotency keys"
    )
    .map_err(RelayError::Output)?;
    Ok(())
}

/// `charges-relay dead list|requeue`.
pub async fn dead(args: DeadArgs) -> Result<(), RelayError> {
    let pool = charges_store::connect(
        &args.database.database_url,
        &PoolSettings {
            max_size: 1,
            application_name: "charges-relay-dead".to_owned(),
            tls: args.database.tls(),
            ..PoolSettings::default()
        },
    )
    .await?;
    let client = pool.get().await?;
    let mut out = std::io::stdout().lock();
    match args.action {
        DeadAction::List { limit } => {
            let rows = OutboxStore::list_dead(&client, limit).await?;
            writeln!(
                out,
                "id\taggregate_id\tevent_type\tattempts\tcreated_at\tdead_at\tlast_error"
            )
            .map_err(RelayError::Output)?;
            for row in rows {
                writeln!(
                    out,
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    row.id,
                    row.aggregate_id,
                    row.event_type,
                    row.attempts,
                    row.created_at.to_rfc3339(),
                    row.dead_at.to_rfc3339(),
                    row.last_error
                        .unwrap_or_default()
                        .replace(['\t', '\n'], " "),
                )
                .map_err(RelayError::Output)?;
            }
        }
        DeadAction::Requeue { id, all } => {
            let ids = if all { None } else { Some(id.as_slice()) };
            let requeued = OutboxStore::requeue_dead(&client, ids).await?;
            writeln!(out, "requeued {requeued} dead outbox rows").map_err(RelayError::Output)?;
        }
    }
    Ok(())
}

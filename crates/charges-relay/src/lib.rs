//! `charges-relay`: publishes committed `outbox` rows to Kafka, at least once, and runs
//! the database's maintenance jobs (`charges_maintenance`).
//!
//! The relay itself is `pg_outbox`'s engine (`pg_outbox::relay`); this crate is the
//! process around it: flags, the operations port, readiness, signals, the maintenance
//! jobs, and what the engine cannot know of charges (the event catalog and the trace
//! context, in `publish`). How a batch works, why the claim is a row lock held by the
//! batch's transaction and not a claimed state, and what is guaranteed:
//! docs/design.md, "The relay".

mod commands;
pub mod config;
mod error;
pub mod metrics;
pub mod publish;

use std::sync::Arc;
use std::time::Duration;

use charges_maintenance::JobRunner;
use charges_runtime::ops::OpsServer;
use charges_runtime::readiness::Health;
use charges_runtime::secrets::ExposeSecret;
use charges_store::{Pool, PoolSettings};
use pg_outbox::relay::{
    Backoff, BatchHealth, EngineSettings, MessageKey, MessageSettings, Pacing, ProducerSettings,
    Producers, RelaySettings, RunningEngine, TRANSACTION_MARGIN, Wakeups,
};
use tokio::sync::watch;

pub use error::{RelayError, error_chain};

use crate::config::{Cli, Command, Ordering, RunArgs};
use crate::publish::{ChargesEvents, ChargesTracing};

/// Names the relay's pool and its LISTEN session in `pg_stat_activity`, and its
/// producer to the brokers (`client.id`).
const APPLICATION_NAME: &str = "charges-relay";
/// The LISTEN session's `application_name`, apart from the pool's.
const LISTENER_APPLICATION_NAME: &str = "charges-relay-listener";
/// Why there is no LISTEN session, in this binary's flags (`listener::poll_only`).
const POLL_ONLY: &str = "--db-pooler transaction without --listen-database-url; \
     new rows are found by polling only. Give --listen-database-url Postgres's own \
     URL to publish within milliseconds of each commit";

/// Every secret on the command line, for the log redactor: the database passwords (of
/// --database-url and --listen-database-url) and the values of secret `--kafka-config`
/// settings (`sasl.password`, …).
pub fn secrets(cli: &Cli) -> Vec<String> {
    let database = &cli.database.database_url;
    let listen = cli.run.listen_database_url.as_ref();
    let mut secrets: Vec<String> = std::iter::once(database)
        .chain(listen)
        .flat_map(|url| charges_runtime::secrets::database_password(url.expose_secret()))
        .collect();
    secrets.extend(charges_runtime::secrets::kafka_config_secrets(
        &cli.run.kafka.resolved,
    ));
    secrets
}

/// Runs what the command line asks for.
pub async fn main(cli: Cli) -> Result<(), RelayError> {
    match cli.command {
        None => run(&cli.database, cli.run).await,
        Some(Command::Dead(args)) => commands::dead(&cli.database, args).await,
        Some(Command::Purge) => commands::purge(&cli.database).await,
    }
}

impl RunArgs {
    /// Batch loops in this process: `--concurrency`, twice over with the replication
    /// gate on. A gated batch spends part of its time waiting for the standbys while it
    /// holds its claim; a second loop per `--concurrency` claims and publishes meanwhile,
    /// so that the wait costs time per event, not throughput.
    pub fn batch_loops(&self) -> usize {
        let loops = self.concurrency as usize;
        if self.wait_for_standbys.is_some() {
            loops * 2
        } else {
            loops
        }
    }

    fn relay_settings(&self) -> RelaySettings {
        let ordered = self.ordering == Ordering::PerAggregate;
        RelaySettings {
            message: MessageSettings {
                topic: self.topic.clone(),
                routes: self.topic_for.clone(),
                // Kafka orders within a partition only (validated in `config`).
                key: if ordered {
                    MessageKey::AggregateId
                } else {
                    self.message_key
                        .map_or(MessageKey::OutboxId, MessageKey::from)
                },
                event_source: self.event_source.clone(),
                catalog: Arc::new(ChargesEvents),
                tracing: Arc::new(ChargesTracing),
            },
            ordered,
            batch_size: self.batch_size,
            publish_timeout: self.publish_timeout,
            standbys: self.wait_for_standbys.clone(),
            max_attempts: self.max_attempts,
            backoff: Backoff {
                base: self.backoff_base,
                max: self.backoff_max,
            },
        }
    }
}

/// The relay and its maintenance jobs, until SIGTERM/SIGINT, or until a job or batch
/// loop dies (then the process exits non-zero rather than run half-alive).
pub async fn run(
    database: &charges_runtime::DatabaseArgs,
    args: RunArgs,
) -> Result<(), RelayError> {
    let settings = args.relay_settings();
    let pool = connect(database, &args, &settings).await?;
    if args.migrate {
        charges_store::migrations::run(&pool).await?;
    }
    let producers = Arc::new(Producers::new(ProducerSettings {
        brokers: args.kafka_brokers.clone(),
        client_id: APPLICATION_NAME.to_owned(),
        publish_timeout: args.publish_timeout,
        extra: args.kafka.resolved.clone(),
    })?);
    let ops = Operations::start(&args, &pool)?;
    let mut signal = Box::pin(charges_runtime::shutdown_signal().map_err(RelayError::Signal)?);
    // A relay deployed before its migration ran would fail every batch: it waits,
    // unready (/readyz says why), until the schema is there.
    if !charges_runtime::readiness::wait_for_schema(
        &pool,
        &charges_store::migrations::sets(),
        &mut signal,
    )
    .await
    {
        ops.stop().await;
        return Ok(());
    }
    let (shutdown_tx, shutdown) = watch::channel(false);
    let mut workers =
        Workers::start(database, &args, pool, producers, &ops.health, shutdown).await?;
    tracing::info!(
        metrics_addr = %ops.server.addr_text(),
        topic = %args.topic,
        brokers = %args.kafka_brokers,
        batch_size = args.batch_size,
        concurrency = args.concurrency,
        batch_loops = args.batch_loops(),
        ordering = ?args.ordering,
        publish_timeout = ?args.publish_timeout,
        "relay started"
    );
    let failure = tokio::select! {
        name = &mut signal => {
            tracing::info!(signal = name, "shutting down: finishing the in-flight batches");
            None
        }
        failure = workers.failure() => Some(failure),
    };
    let _ = shutdown_tx.send(true);
    workers.drain(args.publish_timeout).await;
    ops.stop().await;
    match failure {
        None => {
            tracing::info!("relay stopped");
            Ok(())
        }
        Some(error) => Err(error),
    }
}

/// The batch loops' name in `/readyz`.
const BATCHES: &str = "relay batches";

/// The engine's batch loops reporting to the process's readiness as [`BATCHES`].
struct BatchReadiness(Arc<Health>);

impl BatchHealth for BatchReadiness {
    fn batch_succeeded(&self) {
        self.0.ok(BATCHES);
    }

    fn batch_failed(&self, consecutive: u32, reason: String) {
        self.0.failed(BATCHES, consecutive, reason);
    }
}

/// The metrics recorder, the operations port and what it reports as readiness.
struct Operations {
    server: OpsServer,
    upkeep: tokio::task::JoinHandle<()>,
    health: Arc<Health>,
}

impl Operations {
    fn start(args: &RunArgs, pool: &Pool) -> Result<Operations, RelayError> {
        let metrics_handle = metrics::install()?;
        let upkeep = tokio::spawn(charges_runtime::metrics::upkeep(metrics_handle.clone()));
        let health = Arc::new(Health::default());
        let server = OpsServer::start(
            args.metrics_listen,
            pool.clone(),
            charges_store::migrations::sets().to_vec(),
            metrics_handle,
            health.clone(),
        )?;
        tracing::info!(metrics_addr = %server.addr_text(), "operations port listening");
        Ok(Operations {
            server,
            upkeep,
            health,
        })
    }

    async fn stop(self) {
        self.server.stop().await;
        self.upkeep.abort();
    }
}

/// Everything that works until shutdown: the batch loops, the LISTEN session, the
/// broker probe and the maintenance jobs.
struct Workers {
    engine: RunningEngine,
    jobs: JobRunner,
}

impl Workers {
    async fn start(
        database: &charges_runtime::DatabaseArgs,
        args: &RunArgs,
        pool: Pool,
        producers: Arc<Producers>,
        health: &Arc<Health>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Workers, RelayError> {
        let tls = database.tls();
        let wakeups = match listen_url(database, args) {
            Some(database_url) => Wakeups::Listen {
                database_url,
                application_name: LISTENER_APPLICATION_NAME,
                tls: &tls,
            },
            None => Wakeups::PollOnly { why: POLL_ONLY },
        };
        let jobs = start_jobs(&pool, args, health.clone(), shutdown.clone());
        let settings = EngineSettings {
            relay: args.relay_settings(),
            loops: args.batch_loops(),
            pacing: Pacing {
                poll_interval: args.poll_interval,
                busy_poll_interval: args.busy_poll_interval,
            },
            probe_base: args.backoff_base,
            probe_max: args.broker_probe_max,
        };
        let readiness = Arc::new(BatchReadiness(health.clone()));
        let engine =
            RunningEngine::start(pool, producers, settings, wakeups, readiness, shutdown).await?;
        Ok(Workers { engine, jobs })
    }

    /// Resolves when a job or a batch loop stops before shutdown.
    async fn failure(&mut self) -> RelayError {
        tokio::select! {
            failed = self.jobs.failed() => RelayError::from(failed),
            ended = self.engine.loop_ended() => RelayError::BatchLoop(ended),
        }
    }

    /// After shutdown was signalled: lets the batches in flight finish and flushes,
    /// then gives the maintenance jobs their bound.
    async fn drain(self, flush_timeout: Duration) {
        self.engine.drain(flush_timeout).await;
        // Steps are not cut short, but none may hold up the exit: a reconciliation count
        // may run for its whole interval on large tables. Whatever is still running after
        // a batch's bound is dropped, and its transaction rolls back: a delete batch or a
        // count, both done again after the restart. Postgres stops a count within a second
        // of the exit (`ReconciliationResultStore::bound_count`).
        if tokio::time::timeout(flush_timeout + TRANSACTION_MARGIN, self.jobs.join())
            .await
            .is_err()
        {
            tracing::warn!(
                "a maintenance job still running at shutdown was stopped; it runs again after the restart"
            );
        }
    }
}

/// Where the relay LISTENs: `--listen-database-url`, else the pool's URL unless that is
/// a transaction pooler's, whose sessions last a transaction (a LISTEN there would
/// subscribe some server session that then serves other clients).
fn listen_url<'a>(
    database: &'a charges_runtime::DatabaseArgs,
    args: &'a RunArgs,
) -> Option<&'a str> {
    match &args.listen_database_url {
        Some(url) => Some(url.expose_secret()),
        None if charges_store::Pooler::from(database.db_pooler).pools_transactions() => None,
        None => Some(database.database_url.expose_secret()),
    }
}

async fn connect(
    database: &charges_runtime::DatabaseArgs,
    args: &RunArgs,
    settings: &RelaySettings,
) -> Result<Pool, RelayError> {
    Ok(charges_store::connect(
        database.database_url.expose_secret(),
        &PoolSettings {
            // The batch loops, the maintenance jobs and /readyz (LISTEN has its own).
            max_size: args.batch_loops() + 4,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: settings.transaction_timeout(),
            application_name: APPLICATION_NAME.to_owned(),
            tls: database.tls(),
            pooler: database.db_pooler.into(),
        },
    )
    .await?)
}

/// The maintenance jobs this process runs next to the relay.
fn start_jobs(
    pool: &Pool,
    args: &RunArgs,
    health: Arc<Health>,
    shutdown: watch::Receiver<bool>,
) -> JobRunner {
    let mut jobs = JobRunner::new(pool.clone(), health, shutdown);
    args.maintenance
        .spawn_all(&mut jobs, args.relay_settings().transaction_timeout());
    jobs
}

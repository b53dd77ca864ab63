//! Everything a relay process runs, started and stopped together: the batch loops, the
//! LISTEN session that wakes them (or polling alone), and the probe that ends a broker
//! outage. A relay binary adds its own process around it (flags, signals, the
//! operations port, jobs of its own).

use std::sync::Arc;
use std::time::Duration;

use pg_plumbing::{DatabaseTls, Pool};
use rdkafka::producer::Producer as _;
use tokio::sync::{Notify, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::relay::batch::{Pacing, Relay, RelaySettings, batch_loop};
use crate::relay::broker::{BrokerHealth, probe_outages};
use crate::relay::error::EngineError;
use crate::relay::hooks::BatchHealth;
use crate::relay::listener;
use crate::relay::publish::Producers;
use crate::relay::wakeup::WakeupRequest;

/// What wakes idle batch loops when a row is committed.
#[derive(Debug, Clone, Copy)]
pub enum Wakeups<'a> {
    /// A LISTEN session on Postgres's own URL (never a transaction pooler's, whose
    /// sessions last one transaction), named `application_name`.
    Listen {
        database_url: &'a str,
        application_name: &'a str,
        tls: &'a DatabaseTls,
    },
    /// Polling only; `why` is logged once, in the binary's terms.
    PollOnly { why: &'a str },
}

/// How the engine runs, besides each batch's [`RelaySettings`].
#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub relay: RelaySettings,
    /// Batch loops in this process: more than one keeps claiming and marking while
    /// another batch waits for the broker (or the standbys).
    pub loops: usize,
    pub pacing: Pacing,
    /// The broker probe's first delay during an outage, doubling up to `probe_max`.
    pub probe_base: Duration,
    pub probe_max: Duration,
}

impl EngineSettings {
    /// `relay` in two batch loops, polling every second when idle and 10 ms after a
    /// partial batch, probing a down broker from 1 s doubling to 30 s.
    pub fn new(relay: RelaySettings) -> EngineSettings {
        EngineSettings {
            relay,
            loops: 2,
            pacing: Pacing {
                poll_interval: Duration::from_secs(1),
                busy_poll_interval: Duration::from_millis(10),
            },
            probe_base: Duration::from_secs(1),
            probe_max: Duration::from_secs(30),
        }
    }
}

/// The running engine.
pub struct RunningEngine {
    relay: Arc<Relay>,
    loops: JoinSet<()>,
    listener: JoinHandle<()>,
    prober: JoinHandle<()>,
}

impl RunningEngine {
    /// Starts everything; fails only if a LISTEN session was asked for and cannot be
    /// opened. Runs until `shutdown` turns true, then [`RunningEngine::drain`].
    pub async fn start(
        pool: Pool,
        producers: Arc<Producers>,
        settings: EngineSettings,
        wakeups: Wakeups<'_>,
        health: Arc<dyn BatchHealth>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<RunningEngine, EngineError> {
        let wake = Arc::new(Notify::new());
        let (listener, listening) = match wakeups {
            Wakeups::Listen {
                database_url,
                application_name,
                tls,
            } => {
                let session = listener::start(
                    database_url,
                    application_name,
                    tls,
                    wake.clone(),
                    shutdown.clone(),
                )
                .await?;
                (session, true)
            }
            Wakeups::PollOnly { why } => (
                listener::poll_only(settings.pacing.poll_interval, why),
                false,
            ),
        };
        let broker = Arc::new(BrokerHealth::new(settings.probe_base, settings.probe_max));
        let prober = tokio::spawn(probe_outages(
            broker.clone(),
            producers.clone(),
            settings.relay.message.topic.clone(),
            settings.relay.publish_timeout,
            shutdown.clone(),
        ));
        let wakeup = Arc::new(WakeupRequest::new(
            pool.clone(),
            settings.pacing.poll_interval,
            listening,
        ));
        let relay = Arc::new(Relay::new(pool, producers, settings.relay, broker, health));
        let mut loops = JoinSet::new();
        for _ in 0..settings.loops.max(1) {
            loops.spawn(batch_loop(
                relay.clone(),
                wake.clone(),
                wakeup.clone(),
                shutdown.clone(),
                settings.pacing,
            ));
        }
        Ok(RunningEngine {
            relay,
            loops,
            listener,
            prober,
        })
    }

    /// Resolves when a batch loop ends before shutdown (a panic, say), with why: the
    /// process should then exit rather than run half-alive.
    pub async fn loop_ended(&mut self) -> String {
        match self.loops.join_next().await {
            Some(Err(e)) => e.to_string(),
            _ => "it returned before shutdown".to_owned(),
        }
    }

    /// After shutdown was signalled: lets the batches in flight finish (each ends
    /// within its publish timeout plus margin), flushes the producer, stops the rest.
    pub async fn drain(mut self, flush_timeout: Duration) {
        while self.loops.join_next().await.is_some() {}
        if let Err(e) = self.relay.producers().current().flush(flush_timeout) {
            tracing::warn!(error = %e, "producer flush incomplete");
        }
        self.listener.abort();
        self.prober.abort();
    }
}

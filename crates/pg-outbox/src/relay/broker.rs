//! Whether the broker can take messages, as this relay sees it, and the probe that
//! ends an outage.
//!
//! A batch in which every message failed with an availability error (and none was
//! acknowledged) declares an outage. From then on the relay backs off as a whole: its
//! batch loops stop claiming (no row locks held, no UPDATE per row per retry), batches
//! still waiting for acknowledgements stop waiting and release their rows, and one
//! probe asks the broker for the topic's metadata with capped exponential backoff. When
//! every partition of the topic has a leader again, the loops resume. If the next batch
//! fails the same way, the next outage's probes start where the last ones left off
//! (the delay keeps growing) until a message is acknowledged again, so a broker that
//! answers metadata but takes no messages costs one batch per probe, not a busy loop.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::producer::{FutureProducer, Producer};
use tokio::sync::watch;

use crate::relay::metrics;
use crate::relay::publish::Producers;

/// The shared view of the broker.
pub struct BrokerHealth {
    available: watch::Sender<bool>,
    backoff: Mutex<ProbeBackoff>,
}

#[derive(Debug, Clone, Copy)]
struct ProbeBackoff {
    base: Duration,
    max: Duration,
    /// The next probe's delay.
    next: Duration,
    /// When the current outage began.
    since: Option<Instant>,
}

impl BrokerHealth {
    /// `base` is the first probe's delay; it doubles up to `max`.
    pub fn new(base: Duration, max: Duration) -> BrokerHealth {
        metrics::broker_available(true);
        BrokerHealth {
            available: watch::Sender::new(true),
            backoff: Mutex::new(ProbeBackoff {
                base,
                max,
                next: base,
                since: None,
            }),
        }
    }

    pub fn is_available(&self) -> bool {
        *self.available.borrow()
    }

    /// A batch saw only availability errors. Returns whether this call began the
    /// outage (the caller logs it once).
    pub fn outage(&self) -> bool {
        let began = self
            .available
            .send_if_modified(|available| std::mem::replace(available, false));
        if began {
            if let Ok(mut backoff) = self.backoff.lock() {
                backoff.since = Some(Instant::now());
            }
            metrics::broker_outage_began();
        }
        began
    }

    /// A message was acknowledged: the next outage's probes start from the base delay.
    pub fn delivered(&self) {
        if let Ok(mut backoff) = self.backoff.lock() {
            backoff.next = backoff.base;
        }
    }

    /// Resolves once the broker is (again) available, at once if it is.
    pub async fn wait_available(&self) {
        let mut receiver = self.available.subscribe();
        // Err only if the sender is gone, which it cannot be while `self` lives.
        let _ = receiver.wait_for(|available| *available).await;
    }

    /// Resolves once an outage is declared, at once if one is under way.
    pub async fn wait_unavailable(&self) {
        let mut receiver = self.available.subscribe();
        let _ = receiver.wait_for(|available| !*available).await;
    }

    /// The delay before the next probe, doubling the one after it.
    fn next_probe_delay(&self) -> Duration {
        let Ok(mut backoff) = self.backoff.lock() else {
            return Duration::from_secs(1);
        };
        let delay = backoff.next;
        backoff.next = (backoff.next * 2).min(backoff.max);
        delay
    }

    fn recovered(&self) -> Option<Duration> {
        self.available.send_replace(true);
        metrics::broker_available(true);
        self.backoff
            .lock()
            .ok()
            .and_then(|mut backoff| backoff.since.take())
            .map(|since| since.elapsed())
    }
}

/// Waits for outages and probes the broker until each one ends; runs until shutdown.
pub async fn probe_outages(
    health: std::sync::Arc<BrokerHealth>,
    producers: std::sync::Arc<Producers>,
    topic: String,
    timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            () = health.wait_unavailable() => {}
            _ = shutdown.changed() => return,
        }
        loop {
            let delay = health.next_probe_delay();
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = shutdown.changed() => return,
            }
            match probe(&producers.current(), &topic, timeout).await {
                Ok(()) => {
                    let lasted = health.recovered();
                    tracing::info!(outage = ?lasted, "broker available again: claiming resumes");
                    break;
                }
                Err(reason) => {
                    tracing::info!(%reason, waited = ?delay, "broker still unavailable");
                }
            }
        }
    }
}

/// Asks for `topic`'s metadata: the broker answers, knows the topic, and every
/// partition has a leader.
async fn probe(producer: &FutureProducer, topic: &str, timeout: Duration) -> Result<(), String> {
    let producer = producer.clone();
    let topic = topic.to_owned();
    // fetch_metadata blocks its thread for up to `timeout`.
    tokio::task::spawn_blocking(move || {
        let metadata = producer
            .client()
            .fetch_metadata(Some(&topic), timeout)
            .map_err(|e| e.to_string())?;
        let found = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .ok_or_else(|| format!("topic {topic} is not in the metadata"))?;
        if let Some(error) = found.error() {
            return Err(format!("topic {topic}: {error:?}"));
        }
        if found.partitions().is_empty() {
            return Err(format!("topic {topic} has no partitions"));
        }
        match found
            .partitions()
            .iter()
            .find(|p| p.leader() < 0 || p.error().is_some())
        {
            Some(p) => Err(format!("partition {} of {topic} has no leader", p.id())),
            None => Ok(()),
        }
    })
    .await
    .map_err(|e| e.to_string())?
}

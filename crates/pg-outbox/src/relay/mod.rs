//! The relay engine (feature `kafka`): publishes committed outbox rows to Kafka, at
//! least once, for any relay binary that embeds it.
//!
//! A batch claims pending rows (`FOR UPDATE SKIP LOCKED`, in one transaction that is the
//! claim), publishes them, and marks the acknowledged ones published before it commits
//! ([`Relay::run_batch`]); [`batch_loop`] runs batches one after another, woken by a
//! LISTEN session ([`listener`]) or by polling. Around it: the outage handling that
//! stops claiming while the broker is down ([`broker`]), the failure classification
//! that keeps outages from making rows dead ([`failure`]), optional per-aggregate
//! ordering, and the optional replication gate that publishes nothing a failover could
//! lose ([`gate`]). The design, and why the claim is a row lock: docs/design.md, "The
//! relay".
//!
//! What the engine cannot know is the embedding service's: it plugs in through
//! [`hooks`] (the CloudEvents names of its event types, its readiness, its trace
//! context) and through settings (topics, message key, `client.id`, the listener's
//! `application_name`). The process around it — flags, the operations port, signals,
//! the Prometheus recorder — is the binary's. Metrics are named under
//! `pg_plumbing`'s namespace ([`metrics`]), which the binary sets first.

pub mod backoff;
mod batch;
pub mod broker;
pub mod cursor;
mod engine;
mod error;
pub mod failure;
pub mod gate;
pub mod hooks;
pub mod listener;
pub mod metrics;
pub mod publish;
pub mod wakeup;

pub use backoff::Backoff;
pub use batch::{BatchOutcome, Pacing, Relay, RelaySettings, TRANSACTION_MARGIN, batch_loop};
pub use broker::{BrokerHealth, probe_outages};
pub use engine::{EngineSettings, RunningEngine, Wakeups};
pub use error::EngineError;
pub use hooks::{
    BatchHealth, CloudEventType, EventCatalog, ForwardTraceParent, NoCatalog, PublishTrace,
    PublishTracing,
};
pub use publish::{MessageKey, MessageSettings, ProducerSettings, Producers, publish_batch};
pub use wakeup::WakeupRequest;

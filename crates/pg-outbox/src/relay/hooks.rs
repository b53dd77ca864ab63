//! What the embedding service plugs into the engine: what it knows and the engine
//! cannot. Each hook is a trait object held by the settings or the [`Relay`], so that
//! a service implements them on its own types; the defaults here suit a service that
//! has nothing to add.
//!
//! [`Relay`]: crate::relay::Relay

use std::borrow::Cow;

use crate::PendingEvent;

/// The CloudEvents attributes of one event type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEventType {
    /// `ce_type`: usually reverse-DNS namespaced (`com.example.order.placed`).
    pub ce_type: Cow<'static, str>,
    /// `ce_dataschema`: the payload's JSON Schema `$id`; `None` sends no header.
    pub data_schema: Option<Cow<'static, str>>,
}

/// The service's event types, as CloudEvents names them. An event whose stored
/// `event_type` the catalog does not know goes out as stored, without
/// `ce_dataschema`: its writer chose the name, and a relay older than the writer must
/// still publish it.
pub trait EventCatalog: Send + Sync {
    fn cloud_event(&self, event_type: &str) -> Option<CloudEventType>;
}

/// Knows no event type: every event goes out with its stored type.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCatalog;

impl EventCatalog for NoCatalog {
    fn cloud_event(&self, _event_type: &str) -> Option<CloudEventType> {
        None
    }
}

/// The trace context one message carries.
#[derive(Debug, Default)]
pub struct PublishTrace {
    /// The message's `traceparent` header (and, with it, the event's stored
    /// `tracestate`); `None` sends neither.
    pub traceparent: Option<String>,
    /// A span the engine keeps open while the message is in flight, and drops once the
    /// broker answered.
    pub span: Option<tracing::Span>,
}

/// Decides the trace context of each message: the service knows whether it exports
/// spans and how it makes trace ids; the engine does not.
pub trait PublishTracing: Send + Sync {
    /// The trace context of `event`'s message to `topic`.
    fn publish(&self, event: &PendingEvent, topic: &str) -> PublishTrace;
}

/// No span of the relay's own: the `traceparent` the writer stored goes on unchanged,
/// so that the consumer's work becomes a child of the writer's.
#[derive(Debug, Clone, Copy, Default)]
pub struct ForwardTraceParent;

impl PublishTracing for ForwardTraceParent {
    fn publish(&self, event: &PendingEvent, _topic: &str) -> PublishTrace {
        PublishTrace {
            traceparent: event.origin.trace_parent.clone(),
            span: None,
        }
    }
}

/// The service's readiness, told how the batch loops fare. A batch that failed
/// because something outside the relay is down or behind (the database, the
/// standbys; [`EngineError::is_outage`]) is reported to neither method: it is not
/// the relay's own failure, and the service's own probes see the database.
///
/// [`EngineError::is_outage`]: crate::relay::EngineError::is_outage
pub trait BatchHealth: Send + Sync {
    /// A batch ran (whether or not it claimed anything).
    fn batch_succeeded(&self);
    /// A batch failed, the `consecutive`-th time in a row, for `reason` (the error
    /// with its causes).
    fn batch_failed(&self, consecutive: u32, reason: String);
}

/// No readiness to tell: batch failures are only logged.
impl BatchHealth for () {
    fn batch_succeeded(&self) {}
    fn batch_failed(&self, _consecutive: u32, _reason: String) {}
}

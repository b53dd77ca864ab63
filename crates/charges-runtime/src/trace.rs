//! W3C Trace Context: `traceparent` read and written by opentelemetry_sdk's
//! `TraceContextPropagator` (which also accepts later versions of the header, as W3C
//! asks), so that a trace is carried from a request through its outbox row and Kafka
//! message to the consumer whether or not spans are exported (`crate::telemetry`).

use std::collections::HashMap;

use opentelemetry::Context;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

const TRACEPARENT: &str = "traceparent";

/// One position in a trace: the trace, the span that is the parent of whatever comes
/// next, and the sampled flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent`. Anything the propagator refuses (or an all-zero id) is
    /// `None`: the caller starts a new trace (W3C: a receiver must not propagate what
    /// it cannot parse).
    pub fn parse(text: &str) -> Option<TraceParent> {
        let carrier = HashMap::from([(TRACEPARENT.to_owned(), text.to_owned())]);
        let context = TraceContextPropagator::new().extract(&carrier);
        TraceParent::of(context.span().span_context())
    }

    /// The position of a valid span context.
    pub fn of(context: &SpanContext) -> Option<TraceParent> {
        context.is_valid().then(|| TraceParent {
            trace_id: context.trace_id().to_bytes(),
            span_id: context.span_id().to_bytes(),
            sampled: context.is_sampled(),
        })
    }

    /// This position as another process's span: the parent of a span started here.
    pub fn remote_context(&self) -> SpanContext {
        let flags = if self.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            flags,
            true,
            TraceState::default(),
        )
    }

    /// A new trace: random trace and span ids, sampled.
    pub fn new_root() -> TraceParent {
        let ids = RandomIdGenerator::default();
        TraceParent {
            trace_id: ids.new_trace_id().to_bytes(),
            span_id: ids.new_span_id().to_bytes(),
            sampled: true,
        }
    }

    /// The same trace, with a new span id: the position of a child span.
    pub fn child(&self) -> TraceParent {
        TraceParent {
            span_id: RandomIdGenerator::default().new_span_id().to_bytes(),
            ..*self
        }
    }

    /// The trace id as 32 lower-case hex digits (what logs and tracing UIs show).
    pub fn trace_id_hex(&self) -> String {
        TraceId::from_bytes(self.trace_id).to_string()
    }

    pub fn span_id_hex(&self) -> String {
        SpanId::from_bytes(self.span_id).to_string()
    }
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let context = Context::new().with_remote_span_context(self.remote_context());
        let mut carrier: HashMap<String, String> = HashMap::new();
        TraceContextPropagator::new().inject_context(&context, &mut carrier);
        f.write_str(carrier.get(TRACEPARENT).map_or("", String::as_str))
    }
}

/// A `tracestate` worth passing on: at most 512 characters of printable ASCII (W3C
/// bounds it; a longer or odd one is dropped, not truncated).
pub fn trace_state(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty() && text.len() <= 512 && text.bytes().all(|b| (0x20..0x7f).contains(&b)))
        .then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_writes_and_refuses() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parent = TraceParent::parse(text).unwrap();
        assert_eq!(parent.to_string(), text);
        assert_eq!(parent.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parent.span_id_hex(), "00f067aa0ba902b7");
        assert!(parent.sampled);
        let child = parent.child();
        assert_eq!(child.trace_id, parent.trace_id);
        assert_ne!(child.span_id, parent.span_id);
        // A later version is read by its first four fields, and written as version 00.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert_eq!(TraceParent::parse(later), Some(parent));
        for bad in [
            "",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        // The propagator does not check id lengths: a short id reads as if left-padded.
        let short = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01");
        assert_eq!(
            short.unwrap().trace_id_hex(),
            "04bf92f3577b34da6a3ce929d0e0e473"
        );
        let root = TraceParent::new_root();
        assert_eq!(TraceParent::parse(&root.to_string()), Some(root));
        assert_eq!(
            trace_state("congo=t61rcWkgMzE"),
            Some("congo=t61rcWkgMzE".into())
        );
        assert_eq!(trace_state("bad\nvalue"), None);
    }
}

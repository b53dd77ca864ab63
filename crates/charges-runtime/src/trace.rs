//! W3C Trace Context (`traceparent`, `tracestate`): parsed, checked and written by hand,
//! so that a trace is carried from a request through its outbox row and Kafka message
//! to the consumer whether or not spans are exported (`crate::telemetry`).

use rand::RngCore;

/// One position in a trace: the trace, the span that is the parent of whatever comes
/// next, and the sampled flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a version-00 `traceparent`: `00-<32 hex>-<16 hex>-<2 hex>`, lower case, no
    /// all-zero ids. Anything else is `None`: the caller starts a new trace (W3C: a
    /// receiver must not propagate what it cannot parse).
    pub fn parse(text: &str) -> Option<TraceParent> {
        let mut parts = text.trim().split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || version != "00" {
            return None;
        }
        let trace_id: [u8; 16] = lower_hex(trace)?;
        let span_id: [u8; 8] = lower_hex(span)?;
        let flags: [u8; 1] = lower_hex(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            span_id,
            sampled: flags[0] & 1 == 1,
        })
    }

    /// A new trace: random trace and span ids, sampled.
    pub fn new_root() -> TraceParent {
        let mut rng = rand::rng();
        let mut trace_id = [0; 16];
        let mut span_id = [0; 8];
        rng.fill_bytes(&mut trace_id);
        rng.fill_bytes(&mut span_id);
        trace_id[0] |= 1;
        span_id[0] |= 1;
        TraceParent {
            trace_id,
            span_id,
            sampled: true,
        }
    }

    /// The same trace, with a new span id: the position of a child span.
    pub fn child(&self) -> TraceParent {
        let mut span_id = [0; 8];
        rand::rng().fill_bytes(&mut span_id);
        span_id[0] |= 1;
        TraceParent { span_id, ..*self }
    }

    /// The trace id as 32 lower-case hex digits (what logs and tracing UIs show).
    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }

    pub fn span_id_hex(&self) -> String {
        hex::encode(self.span_id)
    }
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            u8::from(self.sampled)
        )
    }
}

/// A `tracestate` worth passing on: at most 512 characters of printable ASCII (W3C
/// bounds it; a longer or odd one is dropped, not truncated).
pub fn trace_state(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty() && text.len() <= 512 && text.bytes().all(|b| (0x20..0x7f).contains(&b)))
        .then(|| text.to_owned())
}

/// Exactly `N` bytes of hex digits, lower case only (W3C; `hex` also takes upper case).
fn lower_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let mut bytes = [0; N];
    hex::decode_to_slice(text, &mut bytes).ok()?;
    Some(bytes)
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
        assert!(parent.sampled);
        let child = parent.child();
        assert_eq!(child.trace_id, parent.trace_id);
        assert_ne!(child.span_id, parent.span_id);
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        let root = TraceParent::new_root();
        assert_eq!(TraceParent::parse(&root.to_string()), Some(root));
        assert_eq!(
            trace_state("congo=t61rcWkgMzE"),
            Some("congo=t61rcWkgMzE".into())
        );
        assert_eq!(trace_state("bad\nvalue"), None);
    }
}

//! Per-request observability, in one middleware: a request id (the caller's
//! `X-Request-Id` when it is sane, else a fresh UUID) echoed on the response; the
//! request's place in a W3C trace (a child of the caller's `traceparent`, or a new
//! trace); a tracing span holding both around everything the request logs; one access
//! log line; and the duration histogram. The request id and the trace context are what
//! the request's outbox rows carry on to the relay and the consumers.

use std::time::Instant;

use actix_web::HttpMessage;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use charges_runtime::trace::{TraceParent, trace_state};
use charges_store::Origin;
use tracing::Instrument;
use uuid::Uuid;

use crate::metrics;

pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Who a request is, for the events it writes (a request extension).
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub request_id: String,
    /// The request's own position in its trace: the parent of the events it writes.
    pub trace: TraceParent,
    pub trace_state: Option<String>,
}

impl RequestContext {
    pub fn origin(&self) -> Origin {
        Origin {
            trace_parent: Some(self.trace.to_string()),
            trace_state: self.trace_state.clone(),
            request_id: Some(self.request_id.clone()),
        }
    }
}

/// The request's [`Origin`] (empty if the middleware did not run).
pub fn origin(request: &actix_web::HttpRequest) -> Origin {
    request
        .extensions()
        .get::<RequestContext>()
        .map(RequestContext::origin)
        .unwrap_or_default()
}

fn header_text<'a>(request: &'a ServiceRequest, name: &HeaderName) -> Option<&'a str> {
    request.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Longer ids are replaced: they would only bloat every log line.
const MAX_LEN: usize = 128;

/// The label for requests no route matched: never the concrete path, which any
/// client can vary without bound.
const UNMATCHED: &str = "unmatched";

/// The caller's id if it is 1..=128 visible ASCII characters (no spaces or control
/// characters that could forge log lines), else a new UUID.
pub fn request_id(incoming: Option<&HeaderValue>) -> String {
    match incoming.map(HeaderValue::as_bytes) {
        Some(bytes)
            if !bytes.is_empty()
                && bytes.len() <= MAX_LEN
                && bytes.iter().all(|b| b.is_ascii_graphic()) =>
        {
            String::from_utf8_lossy(bytes).into_owned()
        }
        _ => Uuid::new_v4().to_string(),
    }
}

pub async fn middleware(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let id = request_id(request.headers().get(&X_REQUEST_ID));
    let route = request
        .match_pattern()
        .unwrap_or_else(|| UNMATCHED.to_owned());
    let incoming = header_text(&request, &TRACEPARENT).and_then(TraceParent::parse);
    // A tracestate only travels with the traceparent it belongs to.
    let state = incoming.and(header_text(&request, &TRACESTATE).and_then(trace_state));
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        route = %route,
        trace_id = tracing::field::Empty,
    );
    let trace = charges_runtime::telemetry::start_span(&span, incoming);
    span.record("trace_id", trace.trace_id_hex());
    request.extensions_mut().insert(RequestContext {
        request_id: id.clone(),
        trace,
        trace_state: state,
    });
    let result = next.call(request).instrument(span.clone()).await;
    let status = match &result {
        Ok(response) => response.status(),
        Err(error) => error.as_response_error().status_code(),
    };
    let elapsed = started.elapsed();
    span.in_scope(|| {
        tracing::info!(
            status = status.as_u16(),
            elapsed_ms = elapsed.as_secs_f64() * 1000.0,
            "request finished"
        );
    });
    metrics::request_finished(route, status.as_u16(), elapsed);
    let mut response = result?;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(X_REQUEST_ID, value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sane_incoming_id_is_kept() {
        let value = HeaderValue::from_static("abc-123_XYZ.~");
        assert_eq!(request_id(Some(&value)), "abc-123_XYZ.~");
    }

    #[test]
    fn missing_empty_long_or_odd_ids_are_replaced() {
        let long = "a".repeat(MAX_LEN + 1);
        for bad in [
            None,
            Some(HeaderValue::from_static("")),
            Some(HeaderValue::from_static("has space")),
            Some(HeaderValue::from_str(&long).unwrap()),
            Some(HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap()),
        ] {
            let id = request_id(bad.as_ref());
            assert!(Uuid::try_parse(&id).is_ok(), "{bad:?} gave {id}");
        }
        let longest = "a".repeat(MAX_LEN);
        assert_eq!(
            request_id(Some(&HeaderValue::from_str(&longest).unwrap())),
            longest
        );
    }
}

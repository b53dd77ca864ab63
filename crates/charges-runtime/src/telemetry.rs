//! Spans exported with OpenTelemetry, when and only when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! is set (the standard variables: `OTEL_EXPORTER_OTLP_PROTOCOL` = `http/protobuf`
//! (default) or `http/json`, `OTEL_SERVICE_NAME`, `OTEL_BSP_SCHEDULE_DELAY`, …).
//! Without it no OpenTelemetry layer is installed at all, so tracing costs what it did.
//!
//! Trace context is carried either way (`crate::trace`): with export on, a span's place
//! in the trace is the one its exported span has; with it off, a fresh span id under the
//! caller's trace. The exporter speaks plain HTTP to a collector nearby (a sidecar or a
//! node agent): the one TLS stack of these binaries is OpenSSL, which this HTTP client
//! does not use.

use std::sync::OnceLock;

use opentelemetry::trace::{SpanContext, TraceContextExt, TraceFlags, TraceState, TracerProvider};
use opentelemetry::{Context, SpanId, TraceId};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::trace::TraceParent;

/// The provider while export is on (set once, at start-up).
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Whether spans are exported in this process.
pub fn exporting() -> bool {
    PROVIDER.get().is_some()
}

#[derive(Debug, thiserror::Error)]
#[error("OpenTelemetry export could not be set up: {0}")]
pub struct TelemetryError(String);

/// The tracing layer that exports spans as `service`, or `None` when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is not set.
pub fn layer<S>(
    service: &'static str,
) -> Result<Option<impl tracing_subscriber::Layer<S>>, TelemetryError>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_none() {
        return Ok(None);
    }
    let protocol = match std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").as_deref() {
        Ok("http/json") => Protocol::HttpJson,
        Ok("http/protobuf") | Err(_) => Protocol::HttpBinary,
        Ok(other) => {
            return Err(TelemetryError(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={other}: only http/protobuf and http/json are built in"
            )));
        }
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .with_http_client(BlockingHttp::default())
        .build()
        .map_err(|e| TelemetryError(e.to_string()))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service)
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer(service);
    PROVIDER
        .set(provider)
        .map_err(|_| TelemetryError("set up twice".to_owned()))?;
    Ok(Some(tracing_opentelemetry::layer().with_tracer(tracer)))
}

/// Exports what is left; call once before the process exits.
pub fn shutdown() {
    if let Some(provider) = PROVIDER.get()
        && let Err(error) = provider.shutdown()
    {
        tracing::warn!(%error, "exporting the last spans failed");
    }
}

/// Makes `span` a child of `parent` (a remote position: another process's span), or of
/// nothing (a new trace), and returns `span`'s own position: what goes into the
/// `traceparent` of whatever `span` causes next.
pub fn start_span(span: &tracing::Span, parent: Option<TraceParent>) -> TraceParent {
    if !exporting() {
        return parent.map_or_else(TraceParent::new_root, |p| p.child());
    }
    if let Some(parent) = parent {
        let _ = span.set_parent(remote_context(parent));
    }
    let context = span.context();
    let own = context.span().span_context().clone();
    if !own.is_valid() {
        return parent.map_or_else(TraceParent::new_root, |p| p.child());
    }
    TraceParent {
        trace_id: own.trace_id().to_bytes(),
        span_id: own.span_id().to_bytes(),
        sampled: own.is_sampled(),
    }
}

fn remote_context(parent: TraceParent) -> Context {
    let flags = if parent.sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_bytes(parent.trace_id),
        SpanId::from_bytes(parent.span_id),
        flags,
        true,
        TraceState::default(),
    ))
}

/// The exporter's HTTP client: blocking reqwest, on the batch processor's own thread
/// (which is not inside any async runtime), made on first use there.
#[derive(Debug, Default)]
struct BlockingHttp {
    client: OnceLock<reqwest::blocking::Client>,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for BlockingHttp {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.get_or_init(reqwest::blocking::Client::new);
        let (parts, body) = request.into_parts();
        let mut outgoing = client
            .request(parts.method, parts.uri.to_string())
            .body(body.to_vec());
        for (name, value) in &parts.headers {
            outgoing = outgoing.header(name, value);
        }
        let response = outgoing.send()?;
        let mut answer = http::Response::builder().status(response.status().as_u16());
        for (name, value) in response.headers() {
            answer = answer.header(name.as_str(), value.as_bytes());
        }
        Ok(answer.body(bytes::Bytes::from(response.bytes()?.to_vec()))?)
    }
}

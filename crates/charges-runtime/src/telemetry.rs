//! Spans exported with OpenTelemetry, when and only when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! is set (the standard variables: `OTEL_EXPORTER_OTLP_PROTOCOL` = `http/protobuf`
//! (default) or `http/json`, `OTEL_SERVICE_NAME`, `OTEL_BSP_SCHEDULE_DELAY`, …).
//! Without it no OpenTelemetry layer is installed at all, so tracing costs what it did.
//!
//! Trace context is carried either way (`crate::trace`): with export on, a span's place
//! in the trace is the one its exported span has; with it off, a fresh span id under the
//! caller's trace. The exporter (opentelemetry-otlp's blocking reqwest client, on the
//! batch processor's own thread) speaks plain HTTP to a collector nearby (a sidecar or a
//! node agent): the one TLS stack of these binaries is OpenSSL, and reqwest is built
//! without TLS.

use std::sync::OnceLock;

use opentelemetry::Context;
use opentelemetry::trace::{TraceContextExt, TracerProvider};
use opentelemetry_otlp::{Protocol, WithExportConfig};
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
        let _ = span.set_parent(Context::new().with_remote_span_context(parent.remote_context()));
    }
    TraceParent::of(span.context().span().span_context())
        .unwrap_or_else(|| parent.map_or_else(TraceParent::new_root, |p| p.child()))
}

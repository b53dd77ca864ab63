//! An OTLP/HTTP collector for tests (wiremock, JSON encoding): it answers
//! `POST /v1/traces` from the binaries' exporters and keeps every span it got.

use serde_json::Value;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// One exported span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedSpan {
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
}

pub struct OtlpReceiver {
    server: MockServer,
}

impl OtlpReceiver {
    pub async fn start() -> OtlpReceiver {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/traces"))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({})))
            .mount(&server)
            .await;
        OtlpReceiver { server }
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT` and the other variables a binary needs to export
    /// here, quickly.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.server.uri()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json".to_owned()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ]
    }

    /// Every span of every export request received so far.
    pub async fn spans(&self) -> Vec<ReceivedSpan> {
        let requests = self.server.received_requests().await.unwrap_or_default();
        requests
            .iter()
            .filter_map(|request| serde_json::from_slice::<Value>(&request.body).ok())
            .flat_map(|json| spans_of(&json))
            .collect()
    }
}

fn spans_of(request: &Value) -> Vec<ReceivedSpan> {
    let mut found = Vec::new();
    for resource in request["resourceSpans"].as_array().into_iter().flatten() {
        let service = resource["resource"]["attributes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["key"] == "service.name")
            .and_then(|a| a["value"]["stringValue"].as_str())
            .unwrap_or_default()
            .to_owned();
        for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
            for span in scope["spans"].as_array().into_iter().flatten() {
                let text = |key: &str| span[key].as_str().unwrap_or_default().to_lowercase();
                found.push(ReceivedSpan {
                    service: service.clone(),
                    name: text("name"),
                    trace_id: text("traceId"),
                    span_id: text("spanId"),
                    parent_span_id: text("parentSpanId"),
                });
            }
        }
    }
    found
}

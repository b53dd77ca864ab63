//! A small OTLP/HTTP receiver (JSON encoding) for tests: it accepts
//! `POST /v1/traces` from the binaries' exporters and keeps every span it got.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

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
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    task: JoinHandle<()>,
}

impl OtlpReceiver {
    pub async fn start() -> OtlpReceiver {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the receiver");
        let addr = listener.local_addr().expect("receiver address");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let sink = spans.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, sink.clone()));
            }
        });
        OtlpReceiver { addr, spans, task }
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT` and the other variables a binary needs to export
    /// here, quickly.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://{}", self.addr),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json".to_owned()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()),
        ]
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().expect("spans lock").clone()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// HTTP/1.1, keep-alive: one JSON body per request, answered `200 {}`.
async fn serve(stream: TcpStream, sink: Arc<Mutex<Vec<ReceivedSpan>>>) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        if let Ok(json) = serde_json::from_slice::<Value>(&body) {
            sink.lock().expect("spans lock").extend(spans_of(&json));
        }
        let answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        if reader.get_mut().write_all(answer).await.is_err() {
            return;
        }
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

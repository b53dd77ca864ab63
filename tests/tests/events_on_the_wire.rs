//! What is on the wire is what asyncapi.yaml and docs/consumers.md say, exactly: the
//! headers of a captured ChargeCreated and ChargeRefunded are the documented ones, no
//! more and no fewer, with the documented values; and one request's trace (its
//! `traceparent`) and request id travel from the API through the outbox and the relay to
//! the consumer, which names the trace id in its log line for the event.

use std::collections::BTreeSet;
use std::path::PathBuf;

use charges_tests::kafka::{Received, TestKafka};
use charges_tests::{DEADLINE, Process, TestDb, log_field, new_key, start_consumer, start_relay};
use serde::Deserialize;
use serde_json::Value;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_SPAN: &str = "00f067aa0ba902b7";
const TRACESTATE: &str = "congo=t61rcWkgMzE";
const REQUEST_ID: &str = "wire-contract-request-1";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The header names asyncapi.yaml's `Headers` schema lists, and the required ones.
fn asyncapi_headers() -> (BTreeSet<String>, BTreeSet<String>) {
    let text = std::fs::read_to_string(repo().join("asyncapi.yaml")).expect("asyncapi.yaml");
    let spec = Value::deserialize(serde_norway::Deserializer::from_str(&text)).expect("YAML");
    let headers = &spec["components"]["schemas"]["Headers"];
    let names = headers["properties"]
        .as_object()
        .expect("Headers.properties")
        .keys()
        .cloned()
        .collect();
    let required = headers["required"]
        .as_array()
        .expect("Headers.required")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    (names, required)
}

/// The header names in docs/consumers.md's "Headers" table.
fn documented_headers() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo().join("docs/consumers.md")).expect("consumers.md");
    text.lines()
        .skip_while(|l| !l.starts_with("### Headers"))
        .skip(1)
        .take_while(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

fn header_names(message: &Received) -> BTreeSet<String> {
    message.headers.keys().cloned().collect()
}

#[tokio::test]
async fn headers_on_the_wire_are_exactly_the_documented_ones_and_carry_the_trace() {
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let (api, line) = Process::start(
        "charges-api",
        &["--listen", "127.0.0.1:0", "--database-url", db.url.as_str()],
        &[],
        "listening",
    )
    .await;
    let base = format!("http://{}", log_field(&line, "addr").expect("addr"));
    let http = reqwest::Client::new();
    let traceparent = format!("00-{TRACE_ID}-{PARENT_SPAN}-01");
    let post = |path: String, body: &'static str| {
        http.post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .header("idempotency-key", new_key())
            .header("traceparent", &traceparent)
            .header("tracestate", TRACESTATE)
            .header("x-request-id", REQUEST_ID)
            .body(body)
            .send()
    };
    let created: Value = post(
        "/charges".into(),
        r#"{"amountCents":4900,"currency":"EUR"}"#,
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let charge = created["id"].as_str().expect("charge id").to_owned();
    let refund = post(
        format!("/charges/{charge}/refunds"),
        r#"{"amountCents":900}"#,
    )
    .await
    .unwrap();
    assert_eq!(refund.status(), 201);
    let (_relay, _) = start_relay(&db, &kafka, &[]).await;
    let mut reader = kafka.reader();
    let messages = reader
        .read_until(DEADLINE, "both events", |m| m.len() >= 2)
        .await
        .to_vec();

    let (documented, required) = asyncapi_headers();
    assert_eq!(
        documented_headers(),
        documented,
        "docs/consumers.md and asyncapi.yaml list different headers"
    );
    for message in &messages {
        let on_wire = header_names(message);
        assert_eq!(on_wire, documented, "the headers of {message:?}");
        assert!(required.is_subset(&on_wire));
        let trace = message.header("traceparent").expect("traceparent");
        assert!(trace.starts_with(&format!("00-{TRACE_ID}-")), "{trace}");
        assert!(
            !trace.contains(PARENT_SPAN),
            "the API's own span is the parent: {trace}"
        );
        assert_eq!(message.header("tracestate"), Some(TRACESTATE));
        assert_eq!(message.header("request_id"), Some(REQUEST_ID));
        assert_eq!(message.header("ce_subject"), Some(charge.as_str()));
        assert_eq!(message.header("aggregate_id"), Some(charge.as_str()));
    }
    let types: BTreeSet<&str> = messages
        .iter()
        .filter_map(|m| m.header("ce_type"))
        .collect();
    assert_eq!(
        types,
        BTreeSet::from(["io.charges.charge.created", "io.charges.charge.refunded"])
    );
    assert!(
        charges_tests::schemas::validated() >= 2,
        "the payloads were validated"
    );

    // The consumer continues the trace: its log line for the event names the trace id.
    let consumer = start_consumer(&db, &kafka, &new_key(), &[]).await;
    consumer.wait_for_log("event applied", 2).await;
    let applied: Vec<String> = consumer
        .output_text()
        .lines()
        .filter(|l| l.contains("event applied"))
        .map(str::to_owned)
        .collect();
    for line in &applied {
        assert_eq!(
            log_field(line, "trace_id").as_deref(),
            Some(TRACE_ID),
            "{line}"
        );
        assert_eq!(
            log_field(line, "request_id").as_deref(),
            Some(REQUEST_ID),
            "{line}"
        );
    }
    drop(api);
}

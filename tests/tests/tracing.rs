//! With `OTEL_EXPORTER_OTLP_ENDPOINT` set, one request's spans reach the collector from
//! all three binaries in one trace, each the child of the one before: the API's request
//! span (under the caller's `traceparent`), the relay's publish span, the consumer's
//! apply span. (Without it, the trace id still travels: `events_on_the_wire.rs`.)

use charges_tests::kafka::TestKafka;
use charges_tests::otlp::{OtlpReceiver, ReceivedSpan};
use charges_tests::{Process, TestDb, log_field, new_key, poll_until};

const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const CALLER_SPAN: &str = "b7ad6b7169203331";

fn the_span<'a>(spans: &'a [ReceivedSpan], service: &str, name: &str) -> Option<&'a ReceivedSpan> {
    spans
        .iter()
        .find(|s| s.service == service && s.name == name && s.trace_id == TRACE_ID)
}

#[tokio::test]
async fn api_relay_and_consumer_spans_form_one_trace() {
    let receiver = OtlpReceiver::start().await;
    let env = receiver.env();
    let envs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let db = TestDb::new().await;
    let kafka = TestKafka::new(1).await;
    let url = db.url.as_str();
    let (_api, line) = Process::start(
        "charges-api",
        &["--listen", "127.0.0.1:0", "--database-url", url],
        &envs,
        "listening",
    )
    .await;
    let addr = log_field(&line, "addr").expect("addr");
    let (_relay, _) = Process::start(
        "charges-relay",
        &[
            "--database-url",
            url,
            "--kafka-brokers",
            &kafka.bootstrap,
            "--topic",
            &kafka.topic,
            "--metrics-listen",
            "127.0.0.1:0",
            "--poll-interval",
            "100ms",
        ],
        &envs,
        "relay started",
    )
    .await;
    let group = new_key();
    let (consumer, _) = Process::start(
        "charges-consumer",
        &[
            "--database-url",
            url,
            "--kafka-brokers",
            &kafka.bootstrap,
            "--topic",
            &kafka.topic,
            "--group-id",
            &group,
            "--migrate",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &envs,
        "consumer started",
    )
    .await;

    let response = reqwest::Client::new()
        .post(format!("http://{addr}/charges"))
        .header("content-type", "application/json")
        .header("idempotency-key", new_key())
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .body(r#"{"amountCents":4900}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    consumer.wait_for_log("event applied", 1).await;

    let (request, publish, apply) = poll_until("the three spans are exported", async || {
        let spans = receiver.spans().await;
        Some((
            the_span(&spans, "charges-api", "request")?.clone(),
            the_span(&spans, "charges-relay", "publish")?.clone(),
            the_span(&spans, "charges-consumer", "apply")?.clone(),
        ))
    })
    .await;
    assert_eq!(request.parent_span_id, CALLER_SPAN, "{request:?}");
    assert_eq!(publish.parent_span_id, request.span_id, "{publish:?}");
    assert_eq!(apply.parent_span_id, publish.span_id, "{apply:?}");
    let line = consumer
        .output_text()
        .lines()
        .find(|l| l.contains("event applied"))
        .map(str::to_owned)
        .expect("the applied line");
    assert_eq!(log_field(&line, "trace_id").as_deref(), Some(TRACE_ID));
}

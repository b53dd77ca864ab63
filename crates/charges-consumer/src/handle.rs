//! One message, from the topic to the database: read its headers, decide what it is,
//! apply it with the retry policy, or park it — and say what happened.
//!
//! The retry policy: a database that cannot be reached is waited for, however long it
//! takes (the offset is not committed meanwhile); any other failure is retried
//! `--max-apply-attempts` times with backoff, then the message is parked, so that one
//! event whose effect can never be applied does not stop its partition.

use std::time::Duration;

use charges_runtime::telemetry;
use charges_runtime::trace::TraceParent;
use deadpool_postgres::Pool;
use rdkafka::message::{BorrowedMessage, Headers, Message as _};
use tracing::Instrument;

use crate::apply::{Applied, apply};
use crate::event::{Event, Message, decode};
use crate::parked::ParkedStore;
use crate::{ConsumerError, error_chain, metrics};
use pg_inbox::Source;

/// How messages are handled (from the command line).
#[derive(Debug, Clone, Copy)]
pub struct Handling {
    pub check_order: bool,
    pub max_apply_attempts: u32,
}

const FIRST_RETRY: Duration = Duration::from_millis(100);
const LONGEST_RETRY: Duration = Duration::from_secs(10);

/// The headers this consumer reads, and the payload.
pub fn read(message: &BorrowedMessage<'_>) -> Message {
    let header = |name: &str| {
        message
            .headers()
            .and_then(|headers| headers.iter().find(|h| h.key == name))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    Message {
        id: header("id"),
        ce_type: header("ce_type"),
        ce_dataschema: header("ce_dataschema"),
        traceparent: header("traceparent"),
        tracestate: header("tracestate"),
        request_id: header("request_id"),
        payload: message.payload().unwrap_or_default().to_vec(),
    }
}

/// Applies or parks one message. `None`: a shutdown signal came first and nothing was
/// written (the message will be read again).
pub async fn process(
    pool: &Pool,
    message: &BorrowedMessage<'_>,
    topic: &str,
    handling: &Handling,
    signal: &mut (impl Future<Output = &'static str> + Unpin),
) -> Option<()> {
    let incoming = read(message);
    let source = Source {
        topic,
        partition: message.partition(),
        offset: message.offset(),
    };
    let (span, trace_id) = event_span(&incoming);
    async {
        let event = match decode(&incoming) {
            Ok(event) => event,
            Err(rejection) => {
                return park(pool, source, &incoming, &rejection.to_string(), signal).await;
            }
        };
        match apply_with_retries(pool, &event, source, handling, signal).await? {
            Ok(applied) => {
                report(&event, applied, source, &incoming, trace_id.as_deref());
                Some(())
            }
            Err(error) => park(pool, source, &incoming, &error, signal).await,
        }
    }
    .instrument(span)
    .await
}

/// The span the event's handling runs in (exported, as a child of the relay's publish
/// span, when spans are exported) and the trace id the log lines name.
fn event_span(incoming: &Message) -> (tracing::Span, Option<String>) {
    let parent = incoming.traceparent.as_deref().and_then(TraceParent::parse);
    if !telemetry::exporting() {
        return (tracing::Span::none(), parent.map(|p| p.trace_id_hex()));
    }
    let span = tracing::info_span!("apply", event_id = incoming.id.as_deref().unwrap_or("-"));
    let position = telemetry::start_span(&span, parent);
    (span, Some(position.trace_id_hex()))
}

/// `Some(Ok)`: applied or a duplicate. `Some(Err(reason))`: it kept failing for a reason
/// other than an unreachable database. `None`: shutdown.
async fn apply_with_retries(
    pool: &Pool,
    event: &Event,
    source: Source<'_>,
    handling: &Handling,
    signal: &mut (impl Future<Output = &'static str> + Unpin),
) -> Option<Result<Applied, String>> {
    let mut delay = FIRST_RETRY;
    let mut failures = 0;
    loop {
        let error = match apply(pool, event, source, handling.check_order).await {
            Ok(applied) => return Some(Ok(applied)),
            Err(error) => error,
        };
        metrics::event("failed");
        let reason = error_chain(&error);
        if !unavailable(&error) {
            failures += 1;
            if failures >= handling.max_apply_attempts {
                return Some(Err(format!("applying failed {failures} times: {reason}")));
            }
        }
        tracing::error!(id = %event.id, error = %reason, ?delay, "applying the event failed; retrying");
        tokio::select! {
            _ = &mut *signal => return None,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(LONGEST_RETRY);
    }
}

fn unavailable(error: &ConsumerError) -> bool {
    matches!(error, ConsumerError::Store(e) if e.is_unavailable())
}

/// Parks `incoming`, retrying while the database cannot be reached.
async fn park(
    pool: &Pool,
    source: Source<'_>,
    incoming: &Message,
    reason: &str,
    signal: &mut (impl Future<Output = &'static str> + Unpin),
) -> Option<()> {
    let mut delay = FIRST_RETRY;
    loop {
        let parked = match pool.get().await {
            Ok(client) => ParkedStore::park(&client, source, incoming, reason).await,
            Err(e) => Err(e.into()),
        };
        match parked {
            Ok(()) => {
                metrics::event("parked");
                tracing::error!(
                    id = incoming.id.as_deref().unwrap_or("-"),
                    event_type = incoming.ce_type.as_deref().unwrap_or("-"),
                    partition = source.partition,
                    offset = source.offset,
                    reason,
                    "event parked: not applied (`charges-consumer parked list`)"
                );
                return Some(());
            }
            Err(e) => {
                tracing::error!(error = %error_chain(&e), ?delay, "parking the event failed; retrying");
                tokio::select! {
                    _ = &mut *signal => return None,
                    () = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(LONGEST_RETRY);
            }
        }
    }
}

fn report(
    event: &Event,
    applied: Applied,
    source: Source<'_>,
    incoming: &Message,
    trace_id: Option<&str>,
) {
    let (id, event_type) = (event.id, event.event_type.as_str());
    let (partition, offset) = (source.partition, source.offset);
    let trace_id = trace_id.unwrap_or("-");
    let request_id = incoming.request_id.as_deref().unwrap_or("-");
    match applied {
        Applied::Applied => {
            metrics::event("applied");
            tracing::info!(%id, event_type, partition, offset, trace_id, request_id, "event applied");
        }
        Applied::AppliedOutOfOrder { previous } => {
            metrics::event("applied");
            metrics::out_of_order();
            let (charge, sequence) = event.position.unwrap_or_default();
            tracing::warn!(%id, event_type, %charge, sequence, ?previous, partition, offset, trace_id, "event applied before its predecessor");
        }
        Applied::Duplicate => {
            metrics::event("duplicate");
            tracing::info!(%id, event_type, partition, offset, trace_id, "duplicate event skipped");
        }
    }
}

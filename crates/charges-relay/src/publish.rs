//! What the charges relay puts on every message besides the engine's headers: the
//! CloudEvents names of the charges event types, and the trace context.

use std::borrow::Cow;

use charges_domain::EventType;
use charges_runtime::telemetry;
use charges_runtime::trace::TraceParent;
use pg_outbox::PendingEvent;
use pg_outbox::relay::{CloudEventType, EventCatalog, PublishTrace, PublishTracing};

/// The charges event types (`charges_domain::EventType`): `ce_type` namespaced
/// (`io.charges.charge.created`), `ce_dataschema` the `$id` of the payload's schema.
/// A stored name that is already namespaced is recognised too.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChargesEvents;

impl EventCatalog for ChargesEvents {
    fn cloud_event(&self, event_type: &str) -> Option<CloudEventType> {
        EventType::parse(event_type).map(|known| CloudEventType {
            ce_type: Cow::Borrowed(known.cloud_event_type()),
            data_schema: Some(Cow::Borrowed(known.data_schema())),
        })
    }
}

/// The `traceparent` a message carries, and the span (when spans are exported) that
/// lives while the message is in flight: a child of the span that wrote the event.
/// Without export the stored `traceparent` goes on as it is (if it parses: W3C forbids
/// propagating what a receiver cannot parse), so the consumer's work becomes a child
/// of the writer's.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChargesTracing;

impl PublishTracing for ChargesTracing {
    fn publish(&self, event: &PendingEvent, topic: &str) -> PublishTrace {
        let parent = event
            .origin
            .trace_parent
            .as_deref()
            .and_then(TraceParent::parse);
        if !telemetry::exporting() {
            return PublishTrace {
                traceparent: parent.map(|p| p.to_string()),
                span: None,
            };
        }
        let span = tracing::info_span!("publish", event_id = %event.id, topic, event_type = %event.event_type);
        let position = telemetry::start_span(&span, parent);
        PublishTrace {
            traceparent: Some(position.to_string()),
            span: Some(span),
        }
    }
}

#[cfg(test)]
mod tests {
    use pg_outbox::Origin;
    use pg_outbox::relay::publish::headers;
    use rdkafka::message::Headers;
    use uuid::Uuid;

    use super::*;

    /// The headers of a charges event, exactly as the relay sent them before its engine
    /// became `pg_outbox`'s: consumers read them.
    #[test]
    fn charges_events_keep_their_headers() {
        let id = Uuid::from_u128(1);
        let charge = Uuid::from_u128(2);
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        for stored in ["ChargeCreated", "io.charges.charge.created"] {
            let event = PendingEvent {
                id,
                aggregate_type: "charge".to_owned(),
                aggregate_id: charge,
                event_type: stored.to_owned(),
                sequence: Some(1),
                payload: "{}".to_owned(),
                created_at: chrono::DateTime::from_timestamp(1_700_000_000, 123_456_000)
                    .unwrap_or_default(),
                attempts: 0,
                rejections: 0,
                origin: Origin {
                    trace_parent: Some(traceparent.to_owned()),
                    trace_state: Some("k=v".to_owned()),
                    request_id: Some("req-1".to_owned()),
                },
            };
            let sent = headers(&event, &ChargesEvents, "urn:charges", Some(traceparent));
            let sent: Vec<(&str, &[u8])> = sent
                .iter()
                .map(|h| (h.key, h.value.unwrap_or_default()))
                .collect();
            let id = id.to_string();
            let charge = charge.to_string();
            let expected: Vec<(&str, &[u8])> = vec![
                ("id", id.as_bytes()),
                ("ce_specversion", b"1.0"),
                ("ce_id", id.as_bytes()),
                ("ce_type", b"io.charges.charge.created"),
                ("ce_source", b"urn:charges"),
                ("ce_subject", charge.as_bytes()),
                ("ce_time", b"2023-11-14T22:13:20.123456Z"),
                (
                    "ce_dataschema",
                    b"urn:charges:schemas:events:charge-created:v1",
                ),
                ("ce_sequence", b"1"),
                ("content-type", b"application/json"),
                ("aggregate_type", b"charge"),
                ("aggregate_id", charge.as_bytes()),
                ("traceparent", traceparent.as_bytes()),
                ("tracestate", b"k=v"),
                ("request_id", b"req-1"),
            ];
            assert_eq!(sent, expected, "stored as {stored}");
        }
    }

    #[test]
    fn without_export_the_stored_traceparent_goes_on() {
        let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut event = PendingEvent {
            id: Uuid::from_u128(1),
            aggregate_type: "charge".to_owned(),
            aggregate_id: Uuid::from_u128(2),
            event_type: "ChargeCreated".to_owned(),
            sequence: Some(1),
            payload: "{}".to_owned(),
            created_at: chrono::Utc::now(),
            attempts: 0,
            rejections: 0,
            origin: Origin {
                trace_parent: Some(traceparent.to_owned()),
                ..Origin::default()
            },
        };
        let trace = ChargesTracing.publish(&event, "charges.events");
        assert_eq!(trace.traceparent.as_deref(), Some(traceparent));
        assert!(trace.span.is_none());
        // What cannot be parsed is not propagated (W3C).
        event.origin.trace_parent = Some("garbage".to_owned());
        assert_eq!(
            ChargesTracing.publish(&event, "charges.events").traceparent,
            None
        );
    }
}

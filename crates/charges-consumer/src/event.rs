//! Deciding what a message is: the dedupe key from header `id`, the type from `ce_type`
//! (CloudEvents binary binding), the payload's version from `ce_dataschema`, the
//! payload by type; and where it came from (`traceparent`, `request_id`).
//!
//! The rules a consumer follows (docs/consumers.md, "Writing a consumer"):
//! - an event type this consumer does not handle is recorded in the inbox and has no
//!   effect, so new event types never break it;
//! - an event type it handles in a payload version (`ce_dataschema`) it does not know is
//!   not applied: it is parked, to be replayed once the consumer knows that version;
//! - a message without a usable `id`, or whose payload does not decode, can never be
//!   applied: it is parked too, rather than stopping its partition.
//!
//! Events published before payload versions existed carry no `ce_dataschema` and are
//! read as version 1; their `ce_type` is the bare `ChargeCreated` / `ChargeRefunded`.

use charges_domain::{ChargeCreated, ChargeRefunded, EventType};
use uuid::Uuid;

use crate::ledger::Entry;

/// A message as read from the topic: the headers this consumer looks at, and the bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    pub id: Option<String>,
    pub ce_type: Option<String>,
    pub ce_dataschema: Option<String>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub request_id: Option<String>,
    pub payload: Vec<u8>,
}

/// One decoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: Uuid,
    pub event_type: String,
    /// The charge and the event's place among its events, when the payload carries
    /// them (events written before sequences existed do not).
    pub position: Option<(Uuid, i64)>,
    /// `None` for an event type this consumer does not handle: it is still recorded in
    /// the inbox (so it is looked at once) but has no effect.
    pub entry: Option<Entry>,
}

/// Why a message is not applied: parked for an operator (and `parked replay`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("no header `id` (the deduplication key)")]
    NoId,
    #[error("header `id` is not a UUID")]
    BadId,
    #[error("{event_type} in a payload version this consumer does not know: {schema}")]
    UnknownSchema { event_type: String, schema: String },
    #[error("the payload is not a valid {event_type}: {reason}")]
    BadPayload { event_type: String, reason: String },
}

/// Decodes `message`; see the module documentation for what is rejected.
pub fn decode(message: &Message) -> Result<Event, Rejection> {
    let id = message.id.as_deref().ok_or(Rejection::NoId)?;
    let id = Uuid::try_parse(id).map_err(|_| Rejection::BadId)?;
    let event_type = message.ce_type.clone().unwrap_or_default();
    let Some(handled) = EventType::parse(&event_type) else {
        return Ok(Event {
            id,
            event_type,
            position: None,
            entry: None,
        });
    };
    if let Some(schema) = &message.ce_dataschema
        && schema != handled.data_schema()
    {
        return Err(Rejection::UnknownSchema {
            event_type,
            schema: schema.clone(),
        });
    }
    let bad = |e: serde_json::Error| Rejection::BadPayload {
        event_type: event_type.clone(),
        reason: e.to_string(),
    };
    let (entry, position) = match handled {
        EventType::ChargeCreated => {
            let event: ChargeCreated = serde_json::from_slice(&message.payload).map_err(bad)?;
            let entry = Entry {
                currency: event.currency,
                charged_cents: event.amount_cents.into(),
                refunded_cents: 0,
            };
            (entry, event.sequence.map(|s| (event.charge_id, s)))
        }
        EventType::ChargeRefunded => {
            let event: ChargeRefunded = serde_json::from_slice(&message.payload).map_err(bad)?;
            let entry = Entry {
                currency: event.currency,
                charged_cents: 0,
                refunded_cents: event.amount_cents.into(),
            };
            (entry, event.sequence.map(|s| (event.charge_id, s)))
        }
    };
    Ok(Event {
        id,
        event_type,
        position,
        entry: Some(entry),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0190d5b0-0000-7000-8000-000000000001";
    const CREATED: &str = r#"{"eventId":"0190d5b0-0000-7000-8000-000000000001","chargeId":"0190d5b0-0000-7000-8000-000000000002","sequence":1,"amountCents":4900,"currency":"EUR","occurredAt":"2025-01-01T00:00:00Z"}"#;

    fn message(ce_type: &str, schema: Option<&str>, payload: &str) -> Message {
        Message {
            id: Some(ID.to_owned()),
            ce_type: Some(ce_type.to_owned()),
            ce_dataschema: schema.map(str::to_owned),
            payload: payload.as_bytes().to_vec(),
            ..Message::default()
        }
    }

    #[test]
    fn decodes_both_event_types_old_and_new_names() {
        let schema = EventType::ChargeCreated.data_schema();
        for (ce_type, schema) in [
            ("io.charges.charge.created", Some(schema)),
            ("ChargeCreated", None),
        ] {
            let event = decode(&message(ce_type, schema, CREATED)).unwrap();
            assert_eq!(event.entry.unwrap().charged_cents, 4900);
            assert_eq!(event.position.unwrap().1, 1);
        }
        let refunded = r#"{"eventId":"0190d5b0-0000-7000-8000-000000000003","chargeId":"0190d5b0-0000-7000-8000-000000000002","refundId":"0190d5b0-0000-7000-8000-000000000004","amountCents":900,"currency":"EUR","refundedCents":900,"occurredAt":"2025-01-01T00:00:00Z"}"#;
        let event = decode(&message("ChargeRefunded", None, refunded)).unwrap();
        assert_eq!(event.entry.unwrap().refunded_cents, 900);
        assert_eq!(event.position, None, "no sequence before sequences existed");
    }

    #[test]
    fn unhandled_types_pass_unknown_versions_and_poison_do_not() {
        let other = decode(&message("io.charges.charge.disputed", Some("urn:x"), "{}")).unwrap();
        assert_eq!(other.entry, None);
        assert!(matches!(
            decode(&message(
                "io.charges.charge.created",
                Some("urn:charges:schemas:events:charge-created:v2"),
                CREATED
            )),
            Err(Rejection::UnknownSchema { .. })
        ));
        assert_eq!(
            decode(&Message {
                id: None,
                ..message("ChargeCreated", None, CREATED)
            }),
            Err(Rejection::NoId)
        );
        assert_eq!(
            decode(&Message {
                id: Some("42".into()),
                ..message("ChargeCreated", None, CREATED)
            }),
            Err(Rejection::BadId)
        );
        assert!(matches!(
            decode(&message("ChargeCreated", None, "{}")),
            Err(Rejection::BadPayload { .. })
        ));
    }
}

//! Decoding a message into an event: the dedupe key from header `id`, the type from
//! `ce_type` (CloudEvents binary binding), the payload by type.

use charges_domain::{ChargeCreated, ChargeRefunded, EventType};
use uuid::Uuid;

use crate::ledger::Entry;

/// One decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: Uuid,
    pub event_type: String,
    /// The charge and the event's place among its events, when the payload carries
    /// them (events written before sequences existed do not).
    pub position: Option<(Uuid, i64)>,
    /// `None` for an event type this consumer does not know: it is still recorded in
    /// the inbox (so it is looked at once) but has no effect.
    pub entry: Option<Entry>,
}

/// Why a message cannot be processed at all.
#[derive(Debug, thiserror::Error)]
pub enum Poison {
    #[error("no header `id` (the deduplication key)")]
    NoId,
    #[error("header `id` is not a UUID")]
    BadId,
    #[error("the payload is not a valid {event_type}: {reason}")]
    BadPayload { event_type: String, reason: String },
}

/// Decodes a message from its headers and payload. The event type comes from
/// `ce_type` (CloudEvents binary binding), the dedupe key from `id`.
pub fn decode(id: Option<&[u8]>, ce_type: Option<&[u8]>, payload: &[u8]) -> Result<Event, Poison> {
    let id = id.ok_or(Poison::NoId)?;
    let id = std::str::from_utf8(id)
        .ok()
        .and_then(|id| Uuid::try_parse(id).ok())
        .ok_or(Poison::BadId)?;
    let event_type = String::from_utf8_lossy(ce_type.unwrap_or_default()).into_owned();
    let bad = |e: serde_json::Error| Poison::BadPayload {
        event_type: event_type.clone(),
        reason: e.to_string(),
    };
    let (entry, position) = if event_type == EventType::ChargeCreated.as_str() {
        let event: ChargeCreated = serde_json::from_slice(payload).map_err(bad)?;
        let entry = Entry {
            currency: event.currency,
            charged_cents: event.amount_cents.into(),
            refunded_cents: 0,
        };
        (Some(entry), event.sequence.map(|s| (event.charge_id, s)))
    } else if event_type == EventType::ChargeRefunded.as_str() {
        let event: ChargeRefunded = serde_json::from_slice(payload).map_err(bad)?;
        let entry = Entry {
            currency: event.currency,
            charged_cents: 0,
            refunded_cents: event.amount_cents.into(),
        };
        (Some(entry), event.sequence.map(|s| (event.charge_id, s)))
    } else {
        (None, None)
    };
    Ok(Event {
        id,
        event_type,
        position,
        entry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_both_event_types_and_refuses_what_cannot_be_deduplicated() {
        let id = "0190d5b0-0000-7000-8000-000000000001";
        let created = br#"{"eventId":"0190d5b0-0000-7000-8000-000000000001","chargeId":"0190d5b0-0000-7000-8000-000000000002","amountCents":4900,"currency":"EUR","occurredAt":"2025-01-01T00:00:00Z"}"#;
        let event = decode(Some(id.as_bytes()), Some(b"ChargeCreated"), created).unwrap();
        assert_eq!(event.entry.unwrap().charged_cents, 4900);
        let refunded = br#"{"eventId":"0190d5b0-0000-7000-8000-000000000003","chargeId":"0190d5b0-0000-7000-8000-000000000002","refundId":"0190d5b0-0000-7000-8000-000000000004","amountCents":900,"currency":"EUR","refundedCents":900,"occurredAt":"2025-01-01T00:00:00Z"}"#;
        let event = decode(Some(id.as_bytes()), Some(b"ChargeRefunded"), refunded).unwrap();
        assert_eq!(event.entry.unwrap().refunded_cents, 900);
        let unknown = decode(Some(id.as_bytes()), Some(b"ChargeDisputed"), b"{}").unwrap();
        assert_eq!(unknown.entry, None);
        assert!(matches!(
            decode(None, Some(b"ChargeCreated"), created),
            Err(Poison::NoId)
        ));
        assert!(matches!(
            decode(Some(b"42"), Some(b"ChargeCreated"), created),
            Err(Poison::BadId)
        ));
        assert!(matches!(
            decode(Some(id.as_bytes()), Some(b"ChargeCreated"), b"{}"),
            Err(Poison::BadPayload { .. })
        ));
    }
}

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{Charge, Refund};

/// The events this service publishes: the catalog the API writes into the outbox, the
/// relay turns into CloudEvents headers, and consumers read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    ChargeCreated,
    ChargeRefunded,
}

impl EventType {
    pub const ALL: [EventType; 2] = [EventType::ChargeCreated, EventType::ChargeRefunded];

    /// The outbox's `event_type` column, and the `ce_type` relays sent before event
    /// types were namespaced (consumers still accept it).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::ChargeCreated => "ChargeCreated",
            EventType::ChargeRefunded => "ChargeRefunded",
        }
    }

    /// The outbox's `aggregate_type`: which kind of aggregate the event belongs to (it
    /// routes the event to its topic).
    pub fn aggregate_type(self) -> &'static str {
        match self {
            EventType::ChargeCreated | EventType::ChargeRefunded => "charge",
        }
    }

    /// The CloudEvents `type` (header `ce_type`), reverse-DNS prefixed.
    pub fn cloud_event_type(self) -> &'static str {
        match self {
            EventType::ChargeCreated => "io.charges.charge.created",
            EventType::ChargeRefunded => "io.charges.charge.refunded",
        }
    }

    /// The CloudEvents `dataschema` (header `ce_dataschema`): the `$id` of the JSON Schema
    /// of the payload this code writes, `schemas/events/<name>/v<version>.json`.
    pub fn data_schema(self) -> &'static str {
        match self {
            EventType::ChargeCreated => "urn:charges:schemas:events:charge-created:v1",
            EventType::ChargeRefunded => "urn:charges:schemas:events:charge-refunded:v1",
        }
    }

    /// The event type an outbox `event_type` or a `ce_type` (namespaced or not) names.
    pub fn parse(name: &str) -> Option<EventType> {
        EventType::ALL
            .into_iter()
            .find(|t| t.as_str() == name || t.cloud_event_type() == name)
    }
}

/// The `sequence` of a charge's `ChargeCreated`: its first event.
pub const FIRST_SEQUENCE: i64 = 1;

/// The payload of a `ChargeCreated` outbox row and Kafka message. `eventId` equals the
/// outbox id, which is what consumers deduplicate on; `sequence` is the event's place
/// among its charge's events (1, 2, 3 … in commit order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChargeCreated {
    pub event_id: Uuid,
    pub charge_id: Uuid,
    /// Always set by this code; absent only from events written before it (decoded
    /// as `None`).
    #[serde(default)]
    pub sequence: Option<i64>,
    pub amount_cents: i32,
    pub currency: String,
    pub occurred_at: DateTime<Utc>,
}

impl ChargeCreated {
    pub fn new(event_id: Uuid, charge: &Charge) -> Self {
        ChargeCreated {
            event_id,
            charge_id: charge.id,
            sequence: Some(FIRST_SEQUENCE),
            amount_cents: charge.amount_cents,
            currency: charge.currency.clone(),
            occurred_at: charge.created_at,
        }
    }
}

/// The payload of a `ChargeRefunded` outbox row and Kafka message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChargeRefunded {
    pub event_id: Uuid,
    pub charge_id: Uuid,
    /// The event's place among its charge's events (ChargeCreated is 1); absent only
    /// from events written before sequences existed.
    #[serde(default)]
    pub sequence: Option<i64>,
    pub refund_id: Uuid,
    pub amount_cents: i32,
    pub currency: String,
    /// The charge's refunded total including this refund.
    pub refunded_cents: i32,
    pub occurred_at: DateTime<Utc>,
}

impl ChargeRefunded {
    pub fn new(event_id: Uuid, refund: &Refund, refunded_cents: i32, sequence: i64) -> Self {
        ChargeRefunded {
            event_id,
            charge_id: refund.charge_id,
            sequence: Some(sequence),
            refund_id: refund.id,
            amount_cents: refund.amount_cents,
            currency: refund.currency.clone(),
            refunded_cents,
            occurred_at: refund.created_at,
        }
    }
}

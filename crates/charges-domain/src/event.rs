use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{Charge, Refund};

/// The `event_type` column and the CloudEvents `ce_type` of an outbox row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    ChargeCreated,
    ChargeRefunded,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::ChargeCreated => "ChargeCreated",
            EventType::ChargeRefunded => "ChargeRefunded",
        }
    }
}

/// The payload of a `ChargeCreated` outbox row and Kafka message. `eventId` equals the
/// outbox id, which is what consumers deduplicate on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChargeCreated {
    pub event_id: Uuid,
    pub charge_id: Uuid,
    pub amount_cents: i32,
    pub currency: String,
    pub occurred_at: DateTime<Utc>,
}

impl ChargeCreated {
    pub fn new(event_id: Uuid, charge: &Charge) -> Self {
        ChargeCreated {
            event_id,
            charge_id: charge.id,
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
    pub refund_id: Uuid,
    pub amount_cents: i32,
    pub currency: String,
    /// The charge's refunded total including this refund.
    pub refunded_cents: i32,
    pub occurred_at: DateTime<Utc>,
}

impl ChargeRefunded {
    pub fn new(event_id: Uuid, refund: &Refund, refunded_cents: i32) -> Self {
        ChargeRefunded {
            event_id,
            charge_id: refund.charge_id,
            refund_id: refund.id,
            amount_cents: refund.amount_cents,
            currency: refund.currency.clone(),
            refunded_cents,
            occurred_at: refund.created_at,
        }
    }
}

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{Fingerprint, MAX_AMOUNT_CENTS};

/// A validated `POST /charges/{id}/refunds` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRefund {
    charge_id: Uuid,
    /// `None`: refund whatever remains of the charge.
    amount_cents: Option<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefundRequestError {
    #[error("the body is not valid JSON for a refund: {0}")]
    Malformed(String),
    #[error("amountCents must be an integer")]
    AmountNotInteger,
    #[error("amountCents must be between 1 and {MAX_AMOUNT_CENTS}")]
    AmountOutOfRange,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateRefundBody {
    #[serde(default)]
    amount_cents: Option<serde_json::Number>,
}

/// Why a refund cannot be made, decided against the charge's current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RefundRefused {
    #[error("the charge is already fully refunded")]
    FullyRefunded,
    #[error("only {remaining} cents of this charge can still be refunded")]
    ExceedsRemaining { remaining: i32 },
}

impl CreateRefund {
    pub fn from_json(charge_id: Uuid, body: &[u8]) -> Result<Self, RefundRequestError> {
        let body: CreateRefundBody =
            crate::json::from_object(body).map_err(RefundRequestError::Malformed)?;
        let amount_cents = match body.amount_cents {
            None => None,
            Some(number) if number.is_f64() => return Err(RefundRequestError::AmountNotInteger),
            Some(number) => {
                let amount = number
                    .as_i64()
                    .ok_or(RefundRequestError::AmountOutOfRange)?;
                if !(1..=MAX_AMOUNT_CENTS).contains(&amount) {
                    return Err(RefundRequestError::AmountOutOfRange);
                }
                Some(i32::try_from(amount).map_err(|_| RefundRequestError::AmountOutOfRange)?)
            }
        };
        Ok(CreateRefund {
            charge_id,
            amount_cents,
        })
    }

    pub fn charge_id(&self) -> Uuid {
        self.charge_id
    }

    /// The amount to refund given what the charge still has, or why it cannot be done.
    pub fn amount_given(&self, charged: i32, refunded: i32) -> Result<i32, RefundRefused> {
        let remaining = charged - refunded;
        if remaining <= 0 {
            return Err(RefundRefused::FullyRefunded);
        }
        match self.amount_cents {
            None => Ok(remaining),
            Some(amount) if amount <= remaining => Ok(amount),
            Some(_) => Err(RefundRefused::ExceedsRemaining { remaining }),
        }
    }

    /// "Refund the rest" and "refund 4900" are different requests, even when the rest
    /// happens to be 4900.
    pub fn fingerprint(&self) -> Fingerprint {
        let amount = self
            .amount_cents
            .map_or_else(|| "remaining".to_owned(), |a| a.to_string());
        Fingerprint::of(
            "POST /charges/{id}/refunds v1",
            &[
                ("chargeId", &self.charge_id.to_string()),
                ("amountCents", &amount),
            ],
        )
    }
}

/// A refund, as the API returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Refund {
    pub id: Uuid,
    pub charge_id: Uuid,
    pub amount_cents: i32,
    pub currency: String,
    pub created_at: DateTime<Utc>,
}

impl Refund {
    pub fn location(&self) -> String {
        format!("/charges/{}", self.charge_id)
    }
}

/// A charge with its refunds, as `GET /charges/{id}` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChargeWithRefunds {
    #[serde(flatten)]
    pub charge: crate::Charge,
    pub refunded_cents: i32,
    pub refunds: Vec<Refund>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amount_defaults_to_the_remaining_amount_and_never_exceeds_it() {
        let id = Uuid::nil();
        let rest = CreateRefund::from_json(id, b"{}").unwrap();
        assert_eq!(rest.amount_given(1000, 300), Ok(700));
        assert_eq!(
            rest.amount_given(1000, 1000),
            Err(RefundRefused::FullyRefunded)
        );
        let part = CreateRefund::from_json(id, br#"{"amountCents":500}"#).unwrap();
        assert_eq!(part.amount_given(1000, 500), Ok(500));
        assert_eq!(
            part.amount_given(1000, 501),
            Err(RefundRefused::ExceedsRemaining { remaining: 499 })
        );
        assert_ne!(rest.fingerprint(), part.fingerprint());
        let other_charge = CreateRefund::from_json(Uuid::max(), b"{}").unwrap();
        assert_ne!(rest.fingerprint(), other_charge.fingerprint());
    }

    #[test]
    fn refuses_bad_bodies() {
        let id = Uuid::nil();
        for body in [
            &b""[..],
            b"[]",
            br#"{"amountCents":0}"#,
            br#"{"amountCents":-1}"#,
            br#"{"amountCents":1.0}"#,
            br#"{"amountCents":"1"}"#,
            br#"{"amountCents":1,"reason":"x"}"#,
            br#"{"amountCents":2147483648}"#,
        ] {
            assert!(
                CreateRefund::from_json(id, body).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}

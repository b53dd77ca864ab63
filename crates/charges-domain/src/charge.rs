use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::Fingerprint;

/// The largest amount a charge can carry: the `INTEGER` column's maximum.
pub const MAX_AMOUNT_CENTS: i64 = i32::MAX as i64;

const DEFAULT_CURRENCY: &str = "USD";

/// A validated `POST /charges` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateCharge {
    amount_cents: i32,
    currency: String,
}

/// Why a charge request body was refused. Each message is safe to show the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChargeRequestError {
    #[error("the body is not valid JSON for a charge: {0}")]
    Malformed(String),
    #[error("amountCents must be an integer")]
    AmountNotInteger,
    #[error("amountCents must be between 1 and {MAX_AMOUNT_CENTS}")]
    AmountOutOfRange,
    #[error("currency must be an ISO 4217 three-letter code, such as \"EUR\"")]
    UnknownCurrency,
}

/// The wire shape, kept apart from [`CreateCharge`] so that a value can only exist once
/// it has been validated.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateChargeBody {
    amount_cents: serde_json::Number,
    #[serde(default)]
    currency: Option<String>,
}

impl CreateCharge {
    pub fn new(amount_cents: i64, currency: Option<&str>) -> Result<Self, ChargeRequestError> {
        if !(1..=MAX_AMOUNT_CENTS).contains(&amount_cents) {
            return Err(ChargeRequestError::AmountOutOfRange);
        }
        let currency = match currency {
            None => DEFAULT_CURRENCY.to_owned(),
            Some(code) => normalize_currency(code)?,
        };
        Ok(CreateCharge {
            amount_cents: i32::try_from(amount_cents)
                .map_err(|_| ChargeRequestError::AmountOutOfRange)?,
            currency,
        })
    }

    /// Parses and validates a JSON body. Duplicate and unknown fields are refused, and
    /// so is any number that is not written as an integer (`4900.0`, `1e3`).
    pub fn from_json(body: &[u8]) -> Result<Self, ChargeRequestError> {
        let body: CreateChargeBody =
            crate::json::from_object(body).map_err(ChargeRequestError::Malformed)?;
        if body.amount_cents.is_f64() {
            return Err(ChargeRequestError::AmountNotInteger);
        }
        let amount = body
            .amount_cents
            .as_i64()
            .ok_or(ChargeRequestError::AmountOutOfRange)?;
        Self::new(amount, body.currency.as_deref())
    }

    pub fn amount_cents(&self) -> i32 {
        self.amount_cents
    }

    pub fn currency(&self) -> &str {
        &self.currency
    }

    /// What makes two requests "the same charge": only the normalized fields.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(
            "POST /charges v1",
            &[
                ("amountCents", &self.amount_cents.to_string()),
                ("currency", &self.currency),
            ],
        )
    }
}

fn normalize_currency(code: &str) -> Result<String, ChargeRequestError> {
    let upper = code.to_ascii_uppercase();
    if upper.len() != 3 || !upper.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(ChargeRequestError::UnknownCurrency);
    }
    iso_currency::Currency::from_code(&upper)
        .map(|_| upper)
        .ok_or(ChargeRequestError::UnknownCurrency)
}

/// A created charge, as the API returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Charge {
    pub id: Uuid,
    pub amount_cents: i32,
    pub currency: String,
    pub created_at: DateTime<Utc>,
}

impl Charge {
    /// The resource path, for `Location`.
    pub fn location(&self) -> String {
        format!("/charges/{}", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn defaults_and_normalizes_currency() {
        let a = CreateCharge::from_json(br#"{"amountCents":4900}"#).unwrap();
        let b =
            CreateCharge::from_json(br#" { "currency" : "usd",  "amountCents" : 4900 } "#).unwrap();
        let c = CreateCharge::from_json(br#"{"amountCents":4900,"currency":"USD"}"#).unwrap();
        assert_eq!(a.currency(), "USD");
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint(), c.fingerprint());
        let eur = CreateCharge::from_json(br#"{"amountCents":4900,"currency":"eur"}"#).unwrap();
        assert_eq!(eur.currency(), "EUR");
        assert_ne!(eur.fingerprint(), a.fingerprint());
        let other_amount = CreateCharge::from_json(br#"{"amountCents":4901}"#).unwrap();
        assert_ne!(other_amount.fingerprint(), a.fingerprint());
    }

    #[test]
    fn refuses_bad_bodies() {
        use ChargeRequestError::*;
        type Expectation = fn(&ChargeRequestError) -> bool;
        let cases: &[(&[u8], Expectation)] = &[
            (b"", |e| matches!(e, Malformed(_))),
            (b"{", |e| matches!(e, Malformed(_))),
            (b"[]", |e| matches!(e, Malformed(_))),
            (b"[4900]", |e| matches!(e, Malformed(_))),
            (br#" [4900, "EUR"]"#, |e| matches!(e, Malformed(_))),
            (b"{}", |e| matches!(e, Malformed(_))),
            (br#"{"amountCents":"4900"}"#, |e| matches!(e, Malformed(_))),
            (br#"{"amountCents":4900,"extra":1}"#, |e| {
                matches!(e, Malformed(_))
            }),
            (br#"{"amountCents":1,"amountCents":2}"#, |e| {
                matches!(e, Malformed(_))
            }),
            (br#"{"amountCents":4900.0}"#, |e| *e == AmountNotInteger),
            (br#"{"amountCents":1e3}"#, |e| *e == AmountNotInteger),
            (br#"{"amountCents":-0}"#, |e| {
                matches!(e, AmountOutOfRange | AmountNotInteger)
            }),
            (br#"{"amountCents":0}"#, |e| *e == AmountOutOfRange),
            (br#"{"amountCents":-5}"#, |e| *e == AmountOutOfRange),
            (br#"{"amountCents":2147483648}"#, |e| *e == AmountOutOfRange),
            (br#"{"amountCents":18446744073709551616}"#, |e| {
                matches!(e, AmountNotInteger | AmountOutOfRange | Malformed(_))
            }),
            (br#"{"amountCents":5,"currency":"EURO"}"#, |e| {
                *e == UnknownCurrency
            }),
            (br#"{"amountCents":5,"currency":"XYZ"}"#, |e| {
                *e == UnknownCurrency
            }),
            (br#"{"amountCents":5,"currency":"E1R"}"#, |e| {
                *e == UnknownCurrency
            }),
            (br#"{"amountCents":5,"currency":7}"#, |e| {
                matches!(e, Malformed(_))
            }),
        ];
        for (body, expected) in cases {
            let err = CreateCharge::from_json(body).expect_err(&String::from_utf8_lossy(body));
            assert!(expected(&err), "{}: {err:?}", String::from_utf8_lossy(body));
        }
        assert!(CreateCharge::from_json(br#"{"amountCents":2147483647}"#).is_ok());
    }

    proptest! {
        #[test]
        fn fingerprint_ignores_field_order_whitespace_and_case(amount in 1i64..=MAX_AMOUNT_CENTS, ws in "[ \t\n\r]{0,3}", upper in any::<bool>()) {
            let code = if upper { "EUR" } else { "eur" };
            let a = format!("{{{ws}\"amountCents\"{ws}:{ws}{amount},\"currency\":\"{code}\"{ws}}}");
            let b = format!("{{\"currency\":{ws}\"EUR\",{ws}\"amountCents\":{amount}}}");
            let fa = CreateCharge::from_json(a.as_bytes()).unwrap().fingerprint();
            let fb = CreateCharge::from_json(b.as_bytes()).unwrap().fingerprint();
            prop_assert_eq!(fa, fb);
        }

        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = CreateCharge::from_json(&body);
        }
    }
}

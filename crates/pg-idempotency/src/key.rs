use std::fmt;

use uuid::Uuid;

/// The `Idempotency-Key` header, normalized to a lowercase hyphenated UUID.
///
/// Exactly two spellings are accepted, and nothing else:
/// - a bare hyphenated UUID (`8e03978e-40d5-43e8-bc93-6894a57f9324`, any letter case);
/// - the same UUID inside one pair of double quotes, which is how an RFC 8941 sf-string
///   holding a UUID looks on the wire (`"8e03978e-…"`).
///
/// This is not a Structured Fields parser: escapes, parameters and other sf types are
/// rejected, as are the other UUID spellings (`urn:uuid:`, braces, no hyphens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(Uuid);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidIdempotencyKey {
    #[error("the Idempotency-Key header is required")]
    Missing,
    #[error("only one Idempotency-Key header may be sent")]
    Repeated,
    #[error("the Idempotency-Key header is empty")]
    Empty,
    #[error("the Idempotency-Key header must be a UUID, bare or in double quotes")]
    NotAUuid,
}

const HYPHENATED_LEN: usize = 36;

impl IdempotencyKey {
    /// Parses the raw header bytes. Leading and trailing optional white space (RFC 9110
    /// OWS) is ignored, as HTTP itself would ignore it.
    pub fn parse(raw: &[u8]) -> Result<Self, InvalidIdempotencyKey> {
        let text = std::str::from_utf8(raw).map_err(|_| InvalidIdempotencyKey::NotAUuid)?;
        let text = text.trim_matches([' ', '\t']);
        if text.is_empty() {
            return Err(InvalidIdempotencyKey::Empty);
        }
        let unquoted = match text.strip_prefix('"') {
            Some(rest) => rest
                .strip_suffix('"')
                .ok_or(InvalidIdempotencyKey::NotAUuid)?,
            None => text,
        };
        if unquoted.len() != HYPHENATED_LEN {
            return Err(InvalidIdempotencyKey::NotAUuid);
        }
        Uuid::try_parse(unquoted)
            .map(IdempotencyKey)
            .map_err(|_| InvalidIdempotencyKey::NotAUuid)
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Uuid's Display is the lowercase hyphenated form: the normalized key.
        fmt::Display::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: &str = "8e03978e-40d5-43e8-bc93-6894a57f9324";

    #[test]
    fn bare_quoted_and_uppercase_forms_normalize_to_one_key() {
        let bare = IdempotencyKey::parse(KEY.as_bytes()).unwrap();
        let quoted = IdempotencyKey::parse(format!("\"{KEY}\"").as_bytes()).unwrap();
        let upper = IdempotencyKey::parse(KEY.to_uppercase().as_bytes()).unwrap();
        let padded = IdempotencyKey::parse(format!(" \t{KEY} ").as_bytes()).unwrap();
        assert_eq!(bare, quoted);
        assert_eq!(bare, upper);
        assert_eq!(bare, padded);
        assert_eq!(upper.to_string(), KEY);
    }

    #[test]
    fn rejects_everything_else() {
        for raw in [
            "",
            "   ",
            "\"\"",
            "not-a-uuid",
            "\"8e03978e-40d5-43e8-bc93-6894a57f9324",
            "8e03978e-40d5-43e8-bc93-6894a57f9324\"",
            "8e03978e40d543e8bc936894a57f9324",
            "{8e03978e-40d5-43e8-bc93-6894a57f9324}",
            "urn:uuid:8e03978e-40d5-43e8-bc93-6894a57f9324",
            "'8e03978e-40d5-43e8-bc93-6894a57f9324'",
            "\"8e03978e-40d5-43e8-bc93-6894a57f9324\";a=1",
            "8e03978e-40d5-43e8-bc93-6894a57f932g",
        ] {
            assert!(
                IdempotencyKey::parse(raw.as_bytes()).is_err(),
                "{raw:?} was accepted"
            );
        }
        assert_eq!(
            IdempotencyKey::parse(b""),
            Err(InvalidIdempotencyKey::Empty)
        );
        assert_eq!(
            IdempotencyKey::parse(b"\xff\xfe"),
            Err(InvalidIdempotencyKey::NotAUuid)
        );
    }

    proptest! {
        #[test]
        fn any_uuid_round_trips_in_both_forms(bytes in any::<[u8; 16]>(), upper in any::<bool>(), quoted in any::<bool>()) {
            let uuid = Uuid::from_bytes(bytes);
            let mut text = uuid.hyphenated().to_string();
            if upper { text = text.to_uppercase(); }
            if quoted { text = format!("\"{text}\""); }
            let key = IdempotencyKey::parse(text.as_bytes()).unwrap();
            prop_assert_eq!(key.as_uuid(), uuid);
            prop_assert_eq!(key.to_string(), uuid.hyphenated().to_string());
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_accepted_ones_are_canonical(raw in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(key) = IdempotencyKey::parse(&raw) {
                prop_assert_eq!(key.to_string().len(), HYPHENATED_LEN);
            }
        }
    }
}

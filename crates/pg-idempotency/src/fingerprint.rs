use std::fmt;

use sha2::{Digest, Sha256};

/// SHA-256 over a canonical form of the fields that change an operation's effect.
///
/// The canonical form is built from typed, already-normalized values, never from the
/// request bytes, so JSON white space, field order, letter case that the domain
/// normalizes and omitted defaults cannot change it. Every part is length-prefixed so
/// that no two different field lists can produce the same byte string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// `operation` names the operation and its canonical-form version, so that two
    /// operations with equal fields never share a fingerprint.
    pub fn of(operation: &str, fields: &[(&str, &str)]) -> Self {
        let mut hasher = Sha256::new();
        let mut part = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_be_bytes());
            hasher.update(bytes);
        };
        part(operation.as_bytes());
        for (name, value) in fields {
            part(name.as_bytes());
            part(value.as_bytes());
        }
        Fingerprint(hex::encode(hasher.finalize()))
    }

    /// A fingerprint as stored earlier (`request_hash`).
    pub fn from_stored(hex: String) -> Self {
        Fingerprint(hex)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_sha256_hex_and_separates_fields() {
        let a = Fingerprint::of("op", &[("a", "bc")]);
        let b = Fingerprint::of("op", &[("ab", "c")]);
        assert_ne!(a, b);
        // Stored fingerprints (`request_hash`) must keep comparing equal across releases.
        assert_eq!(
            a.as_str(),
            "76a02cc1a0815746c6a5878a79629dabe37a182a9209e01ae587ae23c502fee8"
        );
        assert_eq!(a.as_str().len(), 64);
        assert!(
            a.as_str()
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(
            Fingerprint::of("op1", &[("a", "b")]),
            Fingerprint::of("op2", &[("a", "b")])
        );
    }
}

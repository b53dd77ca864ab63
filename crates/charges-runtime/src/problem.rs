//! RFC 9457 `application/problem+json` bodies: the API's errors and every binary's
//! `/readyz` answer with the same shape.

use serde::Serialize;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// A problem document. `type` is a URI reference relative to the service's base URL;
/// docs/api.md lists every type.
#[derive(Debug, Clone, Serialize)]
pub struct Problem<'a> {
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub title: &'a str,
    pub status: u16,
    pub detail: String,
}

impl Problem<'_> {
    /// The JSON text. Serializing four plain fields cannot fail; should it ever, the
    /// body is a bare object rather than a panic.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }
}

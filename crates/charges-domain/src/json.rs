use serde::de::DeserializeOwned;

/// Deserializes a request body that must be a JSON object.
///
/// serde's derived `Deserialize` also accepts a struct written as an array
/// (`[4900, "EUR"]`), which no client of this API should be able to send; and a map
/// (unlike `serde_json::Value`) still reports duplicated fields.
pub(crate) fn from_object<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let first = body
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if first != Some(&b'{') {
        return Err("expected a JSON object".to_owned());
    }
    serde_json::from_slice(body).map_err(|e| e.to_string())
}

//! Optional API-key authentication: `Authorization: Bearer <secret>`.
//!
//! Off unless keys are configured (`--api-keys` / `API_KEYS`, or `--api-keys-file` /
//! `API_KEYS_FILE`): every entry is `client_id:secret`. With keys, every request except
//! the probes and the scrape ([`OPEN_PATHS`]) must carry one of the secrets, and the
//! client it belongs to scopes the request: its Idempotency-Keys are its own
//! ([`idempotency_scope`]) and it only sees and refunds its own charges.
//!
//! Only SHA-256 digests of the secrets are kept. A presented secret is hashed once and
//! compared with **every** configured digest in constant time (`subtle`), and the
//! matching client is picked without a branch, so neither the time taken nor an early
//! exit says which key matched or how much of one did. Hashing first also makes every
//! comparison the same length, whatever the lengths of the secrets.

use std::fmt;
use std::path::{Path, PathBuf};

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{AUTHORIZATION, HeaderMap};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpRequest, web};
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::AppState;
use crate::problem::ApiError;

/// Answer without credentials even when authentication is on: Kubernetes probes and
/// Prometheus do not carry API keys, and none of them reveals a charge. Everything
/// else (unknown paths included) needs a key, so routes are not discoverable.
pub const OPEN_PATHS: &[&str] = &["/healthz", "/readyz", "/metrics"];

/// Shorter secrets are refused at start-up: a bearer secret is the whole credential.
pub const MIN_SECRET_LEN: usize = 16;

/// Client ids end up in idempotency scopes, charge rows and logs: a small, safe alphabet.
const MAX_CLIENT_ID_LEN: usize = 64;

/// A configuration problem. Entries are named by position, never by content: the
/// message is logged, and an entry may hold a secret.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApiKeysError {
    #[error("API key entry {0} is not `client_id:secret`")]
    NotAPair(usize),
    #[error("API key entry {0}: the client id must be 1 to 64 characters of A-Z a-z 0-9 . _ -")]
    InvalidClientId(usize),
    #[error("API key entry {0}: the secret must be at least {MIN_SECRET_LEN} characters")]
    SecretTooShort(usize),
    #[error("API key entries {0} and {1} have the same secret")]
    DuplicateSecret(usize, usize),
    #[error(
        "API keys are configured but empty; unset API_KEYS/API_KEYS_FILE to turn authentication off"
    )]
    Empty,
    #[error("reading the API keys file {} failed: {}", .path.display(), .reason)]
    File { path: PathBuf, reason: String },
}

/// The authenticated client, put in the request's extensions by [`middleware`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientId(String);

impl ClientId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

struct ApiKey {
    client_id: ClientId,
    digest: [u8; 32],
}

/// The configured keys. `Debug` shows client ids only.
pub struct ApiKeys {
    keys: Vec<ApiKey>,
}

impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|k| k.client_id.as_str()))
            .finish()
    }
}

/// Entries of a key list: separated by commas or newlines, blank ones and `#` comment
/// lines skipped.
fn entries(text: &str) -> impl Iterator<Item = &str> {
    text.split(['\n', ','])
        .map(str::trim)
        .filter(|e| !e.is_empty() && !e.starts_with('#'))
}

/// Everything in a key list that may be a secret, valid or not, for the log
/// redactor: the part after the first `:`, or a whole entry without one.
pub fn secret_candidates(text: &str) -> Vec<String> {
    entries(text)
        .map(|entry| entry.split_once(':').map_or(entry, |(_, s)| s).to_owned())
        .collect()
}

/// The configured key list, from the flag or the file (clap makes them exclusive);
/// `None` when neither is given.
pub fn read_config(
    inline: Option<&str>,
    file: Option<&Path>,
) -> Result<Option<String>, ApiKeysError> {
    match (inline, file) {
        (Some(text), _) => Ok(Some(text.to_owned())),
        (None, Some(path)) => {
            std::fs::read_to_string(path)
                .map(Some)
                .map_err(|e| ApiKeysError::File {
                    path: path.to_owned(),
                    // The io::Error's kind only: its text never holds the contents anyway.
                    reason: e.kind().to_string(),
                })
        }
        (None, None) => Ok(None),
    }
}

impl ApiKeys {
    /// Several entries may share a client id (key rotation: old and new secret both
    /// valid); secrets must be unique, or a secret would not name one client.
    pub fn parse(text: &str) -> Result<ApiKeys, ApiKeysError> {
        let mut keys: Vec<ApiKey> = Vec::new();
        for (index, entry) in entries(text).enumerate() {
            let position = index + 1;
            let (client_id, secret) = entry
                .split_once(':')
                .ok_or(ApiKeysError::NotAPair(position))?;
            let valid_id = !client_id.is_empty()
                && client_id.len() <= MAX_CLIENT_ID_LEN
                && client_id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !valid_id {
                return Err(ApiKeysError::InvalidClientId(position));
            }
            if secret.len() < MIN_SECRET_LEN {
                return Err(ApiKeysError::SecretTooShort(position));
            }
            let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
            if let Some(first) = keys.iter().position(|k| k.digest == digest) {
                return Err(ApiKeysError::DuplicateSecret(first + 1, position));
            }
            keys.push(ApiKey {
                client_id: ClientId(client_id.to_owned()),
                digest,
            });
        }
        if keys.is_empty() {
            return Err(ApiKeysError::Empty);
        }
        Ok(ApiKeys { keys })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The client whose secret `presented` is. Always compares against every key.
    pub fn authenticate(&self, presented: &[u8]) -> Option<&ClientId> {
        let digest: [u8; 32] = Sha256::digest(presented).into();
        // 1 + the index of the matching key, 0 for none; selected without branching.
        let mut found: u64 = 0;
        for (index, key) in self.keys.iter().enumerate() {
            let candidate = index as u64 + 1;
            found.conditional_assign(&candidate, key.digest.ct_eq(&digest));
        }
        let index = usize::try_from(found).ok()?.checked_sub(1)?;
        self.keys.get(index).map(|k| &k.client_id)
    }
}

/// The secret of `Authorization: Bearer <secret>`: exactly one header, scheme
/// case-insensitive (RFC 9110), one or more spaces, a non-empty token.
fn bearer_token(headers: &HeaderMap) -> Result<&[u8], ApiError> {
    let mut values = headers.get_all(AUTHORIZATION);
    let value = values.next().ok_or(ApiError::MissingCredentials)?;
    if values.next().is_some() {
        return Err(ApiError::InvalidCredentials);
    }
    let value = value.as_bytes();
    let scheme = b"bearer ";
    if value.len() <= scheme.len() || !value[..scheme.len()].eq_ignore_ascii_case(scheme) {
        return Err(ApiError::InvalidCredentials);
    }
    let token = value[scheme.len()..].trim_ascii();
    if token.is_empty() || token.iter().any(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::InvalidCredentials);
    }
    Ok(token)
}

/// Authenticates every request but [`OPEN_PATHS`] when keys are configured, and
/// records the client in the request's extensions. A refusal is answered here, as a
/// response (so the request-id middleware around it still tags it), and the request
/// goes no further.
pub async fn middleware(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let state = request.app_data::<web::Data<AppState>>().cloned();
    if let Some(keys) = state.as_ref().and_then(|s| s.api_keys.as_ref())
        && !OPEN_PATHS.contains(&request.path())
    {
        let client = bearer_token(request.headers()).and_then(|token| {
            keys.authenticate(token)
                .cloned()
                .ok_or(ApiError::InvalidCredentials)
        });
        match client {
            Ok(client) => {
                request.extensions_mut().insert(client);
            }
            Err(refused) => return Ok(request.error_response(refused).map_into_right_body()),
        }
    }
    Ok(next.call(request).await?.map_into_left_body())
}

/// The authenticated client of this request; `None` when authentication is off.
pub fn client(request: &HttpRequest) -> Option<ClientId> {
    request.extensions().get::<ClientId>().cloned()
}

/// What `IdempotencyStore` scopes a key by: the endpoint alone without
/// authentication (so rows stay as they were), `client:<id> <endpoint>` with it. Both
/// parts are from a restricted alphabet and endpoints start with `/`, so two clients,
/// or a client and the unauthenticated mode, can never share a scope.
pub fn idempotency_scope(client: Option<&ClientId>, endpoint: &str) -> String {
    match client {
        Some(client) => format!("client:{client} {endpoint}"),
        None => endpoint.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::HeaderValue;

    const A: &str = "client-a-secret-0123456789";
    const B: &str = "client-b-secret-9876543210";

    fn keys() -> ApiKeys {
        ApiKeys::parse(&format!(
            "client-a:{A}, client-b:{B}\n# rotation\nclient-a:{A}-new"
        ))
        .unwrap()
    }

    #[test]
    fn each_secret_authenticates_its_client_only() {
        let keys = keys();
        assert_eq!(keys.len(), 3);
        assert_eq!(
            keys.authenticate(A.as_bytes()).unwrap().as_str(),
            "client-a"
        );
        assert_eq!(
            keys.authenticate(B.as_bytes()).unwrap().as_str(),
            "client-b"
        );
        assert_eq!(
            keys.authenticate(format!("{A}-new").as_bytes())
                .unwrap()
                .as_str(),
            "client-a"
        );
    }

    #[test]
    fn near_misses_are_refused() {
        let keys = keys();
        let mut flipped = A.as_bytes().to_vec();
        flipped[3] ^= 1;
        for wrong in [
            &A.as_bytes()[..A.len() - 1],
            format!("{A}x").as_bytes(),
            flipped.as_slice(),
            b"",
            A.to_uppercase().as_bytes(),
            format!("client-a:{A}").as_bytes(),
        ] {
            assert!(
                keys.authenticate(wrong).is_none(),
                "{:?}",
                String::from_utf8_lossy(wrong)
            );
        }
    }

    #[test]
    fn configuration_errors_never_quote_the_entry() {
        let cases = [
            ("no-colon-but-a-long-secret", ApiKeysError::NotAPair(1)),
            ("bad id:0123456789abcdef", ApiKeysError::InvalidClientId(1)),
            (":0123456789abcdef", ApiKeysError::InvalidClientId(1)),
            ("a:short-secret", ApiKeysError::SecretTooShort(1)),
            (
                "a:0123456789abcdef,b:0123456789abcdef",
                ApiKeysError::DuplicateSecret(1, 2),
            ),
            (" , \n# only a comment\n", ApiKeysError::Empty),
        ];
        for (text, expected) in cases {
            let error = ApiKeys::parse(text).unwrap_err();
            assert_eq!(error, expected, "{text:?}");
            let message = error.to_string();
            for secret in secret_candidates(text) {
                assert!(!message.contains(&secret), "{message:?} quotes {secret:?}");
            }
        }
        assert!(!format!("{:?}", keys()).contains(A));
    }

    #[test]
    fn bearer_header_forms() {
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(AUTHORIZATION, HeaderValue::from_static(value));
            headers
        };
        assert_eq!(bearer_token(&with("Bearer abc")).unwrap(), b"abc");
        assert_eq!(bearer_token(&with("bearer   abc ")).unwrap(), b"abc");
        assert!(matches!(
            bearer_token(&HeaderMap::new()),
            Err(ApiError::MissingCredentials)
        ));
        for bad in ["Basic abc", "Bearer", "Bearer ", "Bearerabc", "Bearer a b"] {
            assert!(
                matches!(bearer_token(&with(bad)), Err(ApiError::InvalidCredentials)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn scopes_never_collide() {
        let a = ClientId("a".into());
        assert_eq!(idempotency_scope(None, "/charges"), "/charges");
        assert_eq!(idempotency_scope(Some(&a), "/charges"), "client:a /charges");
    }
}

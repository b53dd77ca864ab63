//! What must never reach a log line: the database password and every other secret a
//! binary was configured with (API keys, Kafka passwords).
//!
//! Two layers. First, nothing logs configuration: connection strings are only ever
//! parsed, and errors are logged by their `Display` chain, which for tokio-postgres
//! never quotes the connection string. Second, every log line of every binary goes
//! through a [`Redactor`] that replaces each secret known at start-up with
//! [`REDACTED`], so that a driver or library error that quotes its input (today, or
//! after an upgrade) cannot leak one either. The second layer is a net, not a licence:
//! code still must not log secrets.

use std::borrow::Cow;
use std::io::{self, Write};
use std::sync::Arc;

/// Configuration values that must never be printed hold them: `Debug` shows
/// `[REDACTED]`, and reading one takes an explicit `expose_secret()`.
pub use secrecy::{ExposeSecret, SecretString};

/// What a secret is replaced with in a log line.
pub const REDACTED: &str = "[REDACTED]";

/// The password in a Postgres connection string (URL or `key=value` form): as the
/// server receives it (percent-decoded) and, for a URL, as it is spelled there. Also
/// finds the spelled form in a URL that does not parse, since a parse error could
/// quote it.
pub fn database_password(database_url: &str) -> Vec<String> {
    let mut found = Vec::new();
    if let Ok(config) = database_url.parse::<tokio_postgres::Config>()
        && let Some(password) = config.get_password()
    {
        found.push(String::from_utf8_lossy(password).into_owned());
    }
    if let Some(raw) = raw_url_password(database_url) {
        found.push(raw.to_owned());
    }
    found
}

/// `secret` in `postgres://user:secret@host/db?…`. The user info ends at the last `@`
/// before the query, so an unescaped `@` or `/` inside the password is still caught.
fn raw_url_password(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let rest = rest.split_once('?').map_or(rest, |(before, _)| before);
    let userinfo = &rest[..rest.rfind('@')?];
    let (_, password) = userinfo.split_once(':')?;
    Some(password).filter(|p| !p.is_empty())
}

/// Whether a `--kafka-config` key names a secret (`sasl.password`,
/// `ssl.key.password`, `sasl.oauthbearer.client.secret`, …): its value is redacted.
pub fn is_secret_setting(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "secret",
        "sasl.jaas.config",
        "ssl.key.pem",
        "credentials",
    ]
    .iter()
    .any(|word| key.contains(word))
}

/// The values of the secret settings among `--kafka-config` pairs.
pub fn kafka_config_secrets(
    config: &[(String, SecretString)],
) -> impl Iterator<Item = String> + '_ {
    config
        .iter()
        .filter(|(key, _)| is_secret_setting(key))
        .map(|(_, value)| value.expose_secret().to_owned())
}

/// Replaces known secrets in text. Cheap to clone (shared list).
#[derive(Clone, Default)]
pub struct Redactor {
    /// Longest first, so that a secret containing another is replaced whole.
    secrets: Arc<[String]>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

impl Redactor {
    /// Redacts each non-empty secret, also in the escaped spellings a JSON log line
    /// (`"` and `\` escaped) or a `{:?}` field would give it.
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Redactor {
        let mut all: Vec<String> = Vec::new();
        for secret in secrets.into_iter().filter(|s| !s.is_empty()) {
            if let Ok(json) = serde_json::to_string(&secret) {
                all.push(json.trim_matches('"').to_owned());
            }
            all.push(format!("{secret:?}").trim_matches('"').to_owned());
            all.push(secret);
        }
        all.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        all.dedup();
        Redactor {
            secrets: all.into(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// `text` with every secret replaced by [`REDACTED`].
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(text);
        for secret in self.secrets.iter() {
            if text.contains(secret.as_str()) {
                text = Cow::Owned(text.replace(secret.as_str(), REDACTED));
            }
        }
        text
    }

    /// `inner`, redacting whatever is written through it. For `tracing_subscriber`'s
    /// `with_writer(move || redactor.writer(std::io::stdout()))`: the fmt layer writes
    /// each formatted event with one `write_all`, so a secret is never split between
    /// two writes.
    pub fn writer<W: Write>(&self, inner: W) -> RedactingWriter<W> {
        RedactingWriter {
            redactor: self.clone(),
            inner,
        }
    }
}

/// See [`Redactor::writer`].
pub struct RedactingWriter<W> {
    redactor: Redactor,
    inner: W,
}

impl<W: Write> Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.redactor.is_empty() {
            return self.inner.write(buf);
        }
        let text = String::from_utf8_lossy(buf);
        self.inner
            .write_all(self.redactor.redact(&text).as_bytes())?;
        // The whole of `buf` was consumed, redacted or not.
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_password_of_urls_and_key_value_strings() {
        assert_eq!(
            database_password("postgres://app:s3cr%40t@db:5432/charges?sslmode=disable"),
            vec!["s3cr@t".to_owned(), "s3cr%40t".to_owned()]
        );
        assert_eq!(
            database_password("host=db user=app password=hunter22 dbname=x"),
            vec!["hunter22".to_owned()]
        );
        assert!(database_password("postgres://app@db/charges").is_empty());
        // Unparsable (bad port), still found.
        assert_eq!(
            database_password("postgres://app:pw-in-bad-url@db:port/charges"),
            vec!["pw-in-bad-url".to_owned()]
        );
    }

    #[test]
    fn redacts_every_spelling_longest_first() {
        let redactor = Redactor::new(["ab\"c".to_owned(), "ab".to_owned(), String::new()]);
        assert_eq!(redactor.redact("x ab\"c y"), "x [REDACTED] y");
        assert_eq!(redactor.redact(r#"{"e":"ab\"c"}"#), r#"{"e":"[REDACTED]"}"#);
        assert_eq!(redactor.redact("ab-ab"), "[REDACTED]-[REDACTED]");
        assert_eq!(redactor.redact("nothing"), "nothing");
    }

    #[test]
    fn the_writer_redacts_what_passes_through() {
        let redactor = Redactor::new(["topsecret".to_owned()]);
        let mut out = Vec::new();
        redactor
            .writer(&mut out)
            .write_all(b"connect with topsecret failed\n")
            .unwrap();
        assert_eq!(out, b"connect with [REDACTED] failed\n");
    }

    #[test]
    fn secret_kafka_settings() {
        assert!(is_secret_setting("sasl.password"));
        assert!(is_secret_setting("SSL.KEY.PASSWORD"));
        assert!(is_secret_setting("sasl.oauthbearer.client.secret"));
        assert!(!is_secret_setting("security.protocol"));
        assert!(!is_secret_setting("sasl.username"));
    }
}

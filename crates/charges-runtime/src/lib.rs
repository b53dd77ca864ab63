//! What every charges binary (`charges-api`, `charges-relay`, `charges-consumer`) does
//! the same way: structured logs with every known secret redacted, errors logged as
//! one line with their causes, repeatable `KEY=VALUE` flags, the database flags,
//! shutdown signals, the metrics recorder, readiness and the operations port. One
//! copy, so that the processes behave alike and a fix reaches all of them.

pub mod cli;
pub mod database;
mod logging;
pub mod metrics;
pub mod ops;
pub mod problem;
pub mod readiness;
pub mod secrets;
mod signals;
pub mod telemetry;
pub mod trace;

pub use database::{DatabaseArgs, DbPooler};
pub use logging::{LogFormat, LogTarget, LoggingError, init_logging};
pub use signals::shutdown_signal;

pub use pg_plumbing::error_chain;

/// A `KEY=VALUE` flag (`--kafka-config`), as a clap value parser. The key is trimmed;
/// the value is kept as given (it may contain `=`).
pub fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.to_owned()))
        }
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn error_chain_joins_every_cause() {
        let error = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&error), "outer: inner");
    }

    #[test]
    fn key_value_flags() {
        assert_eq!(
            parse_key_value(" sasl.jaas.config=a=b "),
            Ok(("sasl.jaas.config".to_owned(), "a=b ".to_owned()))
        );
        assert!(parse_key_value("novalue").is_err());
        assert!(parse_key_value("=x").is_err());
    }
}

//! Structured logs through `tracing`.

use std::io::IsTerminal;

use charges_store::secrets::Redactor;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber: RUST_LOG filter (default `info`), text or JSON lines,
/// every line passed through `redactor` (see `charges_store::secrets`).
pub fn init(format: LogFormat, redactor: Redactor) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(move || redactor.writer(std::io::stdout()))
        .with_ansi(std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none());
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    // A subscriber already installed (tests calling init twice) is fine.
    drop(result);
}

/// An error and all its sources on one line, for the log; never for a client.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

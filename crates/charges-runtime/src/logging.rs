//! The `tracing` subscriber every binary installs.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::secrets::Redactor;

/// `--log-format`: human-readable lines, or one JSON object per line (event fields at
/// the top level) for log collectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Where log lines go. The API logs to stdout; the relay and the consumer to stderr,
/// because their subcommands (`dead list`, `tail`) print results on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTarget {
    Stdout,
    Stderr,
}

#[derive(Debug, thiserror::Error)]
#[error("logging could not be initialised: {0}")]
pub struct LoggingError(String);

/// Installs the global subscriber: `RUST_LOG` filter (default `info`), text or JSON
/// lines on `target`, every line passed through `redactor` (see [`crate::secrets`]), and
/// span export as `service` when OpenTelemetry is configured ([`crate::telemetry`]).
/// Colours only on a terminal and without `NO_COLOR`, so that files and collectors
/// never receive escape codes. Fails if a subscriber is already installed.
pub fn init_logging(
    format: LogFormat,
    redactor: Redactor,
    target: LogTarget,
    service: &'static str,
) -> Result<(), LoggingError> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let terminal = match target {
        LogTarget::Stdout => std::io::stdout().is_terminal(),
        LogTarget::Stderr => std::io::stderr().is_terminal(),
    };
    let writer = move || -> Box<dyn std::io::Write> {
        match target {
            LogTarget::Stdout => Box::new(redactor.writer(std::io::stdout())),
            LogTarget::Stderr => Box::new(redactor.writer(std::io::stderr())),
        }
    };
    let ansi = terminal && std::env::var_os("NO_COLOR").is_none();
    let lines = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(ansi)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(writer)
            .with_ansi(ansi)
            .boxed(),
    };
    let export = crate::telemetry::layer(service).map_err(|e| LoggingError(e.to_string()))?;
    tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(export)
        .try_init()
        .map_err(|e| LoggingError(e.to_string()))
}

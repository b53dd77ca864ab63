use std::process::ExitCode;

use charges_relay::config::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse_checked(std::env::args_os()).unwrap_or_else(|error| error.exit());
    let redactor = charges_runtime::secrets::Redactor::new(charges_relay::secrets(&cli));
    if let Err(e) = charges_runtime::init_logging(
        cli.log_format,
        redactor,
        charges_runtime::LogTarget::Stderr,
        "charges-relay",
    ) {
        eprintln!("charges-relay: {e}");
        return ExitCode::FAILURE;
    }
    let result = charges_relay::main(cli).await;
    // The last spans, when they are exported.
    charges_runtime::telemetry::shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %charges_relay::error_chain(&e), "charges-relay failed");
            ExitCode::FAILURE
        }
    }
}

use std::process::ExitCode;

use charges_consumer::config::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse_checked(std::env::args_os()).unwrap_or_else(|error| error.exit());
    let redactor = charges_runtime::secrets::Redactor::new(charges_consumer::secrets(&cli));
    if let Err(e) = charges_runtime::init_logging(
        cli.log_format,
        redactor,
        charges_runtime::LogTarget::Stderr,
        "charges-consumer",
    ) {
        eprintln!("charges-consumer: {e}");
        return ExitCode::FAILURE;
    }
    let result = charges_consumer::main(cli).await;
    // The last spans, when they are exported.
    charges_runtime::telemetry::shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %charges_consumer::error_chain(&e), "charges-consumer failed");
            ExitCode::FAILURE
        }
    }
}

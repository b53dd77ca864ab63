//! `charges-api`: parse the command line, then hand over to the library.

fn main() -> std::process::ExitCode {
    charges_api::cli::main()
}

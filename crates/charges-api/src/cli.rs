//! Command line and environment configuration. Every flag has an environment fallback.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use charges_runtime::cli::{duration_at_least, duration_within};
use clap::{Args, Parser, Subcommand};

use crate::auth::{self, ApiKeys, ApiKeysError};
use charges_runtime::secrets::{self, ExposeSecret, Redactor, SecretString};
use charges_runtime::{DatabaseArgs, LogFormat, LogTarget};

#[derive(Debug, Parser)]
#[command(
    name = "charges-api",
    version,
    about = "The idempotent charges HTTP API (writes to Postgres only; charges-relay publishes the events)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Log line format; the filter comes from RUST_LOG (default "info").
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// `serve`'s flags, for `charges-api` without a subcommand (`serve` is the default).
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// The shortest `--idempotency-ttl`: a key is the client's protection for as long as it
/// may retry, and no client retry plan is shorter. (A TTL of 0 s made every request new.)
pub const MIN_IDEMPOTENCY_TTL: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Serve HTTP (the default when no subcommand is given).
    Serve(ServeArgs),
    /// Apply pending database migrations and exit (what the Kubernetes Job runs).
    Migrate(MigrateArgs),
}

#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    /// After migrating, grant the API's database role exactly what it needs
    /// (deploy/sql/grants.sql, embedded). Needs --grant-relay-role too; run as the schema owner.
    #[arg(long, env = "GRANT_API_ROLE", requires = "grant_relay_role")]
    pub grant_api_role: Option<String>,
    /// After migrating, grant the relay's database role exactly what it needs. Needs --grant-api-role too.
    #[arg(long, env = "GRANT_RELAY_ROLE", requires = "grant_api_role")]
    pub grant_relay_role: Option<String>,
}

/// The pool's bounds (the URL and TLS are [`DatabaseArgs`]).
#[derive(Debug, Clone, Args)]
pub struct PoolArgs {
    /// Maximum connections in the pool; one request holds one connection for its transaction.
    #[arg(long, env = "DB_POOL_SIZE", default_value_t = 16, global = true, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub db_pool_size: u32,
    /// How long a request waits for a pooled connection (or a new one) before answering 503.
    #[arg(long, env = "DB_ACQUIRE_TIMEOUT", default_value = "2s", value_parser = duration_within(Duration::from_millis(10), Duration::from_secs(60)), global = true)]
    pub db_acquire_timeout: Duration,
    /// Postgres statement_timeout for every statement; a slower statement is cancelled and answered 503.
    #[arg(long, env = "DB_STATEMENT_TIMEOUT", default_value = "5s", value_parser = duration_within(Duration::from_millis(100), Duration::from_secs(600)), global = true)]
    pub db_statement_timeout: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on; port 0 picks a free port (the chosen address is logged).
    #[arg(long, env = "LISTEN_ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// How long a completed Idempotency-Key is remembered; after that the same key is a new request.
    #[arg(long, env = "IDEMPOTENCY_TTL", default_value = "24h", value_parser = duration_at_least(MIN_IDEMPOTENCY_TTL))]
    pub idempotency_ttl: Duration,
    /// Completed keys remembered in this process, so that replays skip the database
    /// (each entry dies no later than its row's expiry; 0 turns the cache off).
    #[arg(long, env = "REPLAY_CACHE_ENTRIES", default_value_t = charges_store::idempotency_keys::DEFAULT_REPLAY_CACHE_ENTRIES as u32, value_parser = clap::value_parser!(u32).range(0..=10_000_000))]
    pub replay_cache_entries: u32,
    /// Apply pending migrations before serving (convenient locally; production runs `migrate` as a Job).
    #[arg(long, env = "MIGRATE", default_value_t = false)]
    pub migrate: bool,
    /// Largest accepted request body in bytes; larger bodies are answered 413.
    #[arg(long, env = "MAX_BODY_BYTES", default_value_t = 16 * 1024, value_parser = clap::value_parser!(u32).range(64..=1024 * 1024))]
    pub max_body_bytes: u32,
    /// HTTP worker threads (default: one per CPU core).
    #[arg(long, env = "HTTP_WORKERS", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub workers: Option<u32>,
    /// After SIGTERM, how long in-flight requests may take before the server stops anyway.
    #[arg(long, env = "SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = duration_within(Duration::from_secs(1), Duration::from_secs(600)))]
    pub shutdown_timeout: Duration,
    /// A client must send its request headers within this time, and then its body within
    /// this time again (slow-client protection; a late body is answered 400).
    #[arg(long, env = "CLIENT_REQUEST_TIMEOUT", default_value = "5s", value_parser = duration_within(Duration::from_millis(100), Duration::from_secs(600)))]
    pub client_request_timeout: Duration,
    /// Idle keep-alive connections are closed after this time.
    #[arg(long, env = "KEEP_ALIVE", default_value = "30s", value_parser = duration_within(Duration::from_secs(1), Duration::from_secs(3600)))]
    pub keep_alive: Duration,
    /// Turns on API-key authentication: `client_id:secret` entries, comma separated
    /// (secrets of 16+ characters; a client may have several for rotation). Clients send
    /// `Authorization: Bearer <secret>`; /healthz, /readyz and /metrics stay open.
    /// Without keys (the default) the API is unauthenticated. Prefer the environment
    /// variable or --api-keys-file: a command line is visible to `ps`. Never logged.
    #[arg(
        long,
        env = "API_KEYS",
        hide_env_values = true,
        value_name = "ID:SECRET,...",
        conflicts_with = "api_keys_file"
    )]
    pub api_keys: Option<SecretString>,
    /// The same as --api-keys, read from a file: one `client_id:secret` per line, `#`
    /// comments (e.g. a mounted Kubernetes Secret).
    #[arg(long, env = "API_KEYS_FILE", value_name = "PATH")]
    pub api_keys_file: Option<PathBuf>,
}

impl ServeArgs {
    /// The configured key list as text (the file is read here), `None` if none.
    pub fn api_keys_text(&self) -> Result<Option<String>, ApiKeysError> {
        auth::read_config(
            self.api_keys.as_ref().map(ExposeSecret::expose_secret),
            self.api_keys_file.as_deref(),
        )
    }
}

impl Default for ServeArgs {
    fn default() -> Self {
        // The defaults clap documents, in one place.
        match Cli::try_parse_from(["charges-api", "serve"]) {
            Ok(Cli {
                command: Some(Command::Serve(args)),
                ..
            }) => args,
            _ => unreachable!("`charges-api serve` parses with defaults"),
        }
    }
}

impl Cli {
    pub fn pool_settings(&self) -> charges_store::PoolSettings {
        charges_store::PoolSettings {
            max_size: self.pool.db_pool_size as usize,
            acquire_timeout: self.pool.db_acquire_timeout,
            statement_timeout: self.pool.db_statement_timeout,
            ..self
                .database
                .pool_settings("charges-api", self.pool.db_pool_size as usize)
        }
    }
}

impl Cli {
    /// Parses the command line (or `args`), then checks what clap cannot check flag by
    /// flag. A failure is a usage error: exit code 2 with the flags named.
    pub fn parse_checked<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{CommandFactory, FromArgMatches};
        let command = <Cli as CommandFactory>::command();
        let matches = command.clone().try_get_matches_from(args)?;
        let cli = Cli::from_arg_matches(&matches)?;
        charges_runtime::cli::reject_loop_flags_with_subcommand::<ServeArgs>(&command, &matches)?;
        cli.validate()?;
        Ok(cli)
    }

    /// What `charges-api` was asked to do; `serve` when no subcommand is given.
    pub fn action(&self) -> Command {
        self.command
            .clone()
            .unwrap_or_else(|| Command::Serve(self.serve.clone()))
    }

    fn validate(&self) -> Result<(), clap::Error> {
        use clap::CommandFactory;
        if let Command::Serve(serve) = self.action() {
            // A key that could expire while the transaction that completes it is still
            // open would let the client's retry run the operation again.
            let longest_transaction = self.pool.db_statement_timeout * 2;
            if serve.idempotency_ttl <= longest_transaction {
                return Err(<Cli as CommandFactory>::command().error(
                    clap::error::ErrorKind::ValueValidation,
                    format!(
                        "--idempotency-ttl ({}) must be longer than a request's transaction can last \
                         (2 × --db-statement-timeout = {})",
                        humantime::format_duration(serve.idempotency_ttl),
                        humantime::format_duration(longest_transaction)
                    ),
                ));
            }
        }
        Ok(())
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse_checked(std::env::args_os()).unwrap_or_else(|error| error.exit());
    let command = cli.action();
    // Every secret the process holds is known to the log redactor before the first
    // log line: the database password and the API keys (valid or not).
    let mut secrets = secrets::database_password(cli.database.database_url.expose_secret());
    let key_text = match &command {
        Command::Serve(args) => args.api_keys_text(),
        Command::Migrate(_) => Ok(None),
    };
    if let Ok(Some(text)) = &key_text {
        secrets.extend(auth::secret_candidates(text));
    }
    if let Err(e) = charges_runtime::init_logging(
        cli.log_format,
        Redactor::new(secrets),
        LogTarget::Stdout,
        "charges-api",
    ) {
        eprintln!("charges-api: {e}");
        return ExitCode::FAILURE;
    }
    let api_keys = match key_text.and_then(|text| text.as_deref().map(ApiKeys::parse).transpose()) {
        Ok(keys) => keys,
        Err(error) => {
            tracing::error!(error = %error, "charges-api failed: invalid API keys");
            return ExitCode::FAILURE;
        }
    };
    let result = actix_web::rt::System::new().block_on(run(cli, command, api_keys));
    // The last spans, when they are exported.
    charges_runtime::telemetry::shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = %charges_runtime::error_chain(error.as_ref()), "charges-api failed");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli, command: Command, api_keys: Option<ApiKeys>) -> anyhow::Result<()> {
    let settings = cli.pool_settings();
    let database_url = cli.database.database_url.expose_secret();
    match command {
        Command::Migrate(args) => {
            let roles = match (&args.grant_api_role, &args.grant_relay_role) {
                (Some(api), Some(relay)) => {
                    Some(charges_store::migrations::GrantRoles::new(api, relay)?)
                }
                _ => None,
            };
            let pool = charges_store::connect(database_url, &settings).await?;
            charges_store::migrations::run(&pool).await?;
            if let Some(roles) = roles {
                charges_store::migrations::grant(&pool, &roles).await?;
            }
            Ok(())
        }
        Command::Serve(args) => {
            let pool = charges_store::connect(database_url, &settings).await?;
            if args.migrate {
                charges_store::migrations::run(&pool).await?;
            }
            let metrics = crate::metrics::install()?;
            crate::serve(pool, &args, metrics, api_keys).await?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn verify_cli() {
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_is_the_default_with_documented_defaults() {
        let args = ServeArgs::default();
        assert_eq!(args.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(args.idempotency_ttl, Duration::from_secs(24 * 3600));
        assert!(!args.migrate);
    }

    #[test]
    fn secrets_are_hidden_from_debug_and_help() {
        let cli = Cli::try_parse_from([
            "charges-api",
            "serve",
            "--api-keys",
            "a:0123456789abcdef-hidden",
        ])
        .unwrap();
        assert!(!format!("{cli:?}").contains("hidden"));
        let help = Cli::command()
            .find_subcommand_mut("serve")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(help.contains("API_KEYS"));
    }
}

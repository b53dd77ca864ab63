//! Command-line conventions every binary follows.

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command};

use crate::secrets::{ExposeSecret, SecretString};

/// With a subcommand, flags of the default command (the long-running loop) on the
/// command line are a mistake: they would be ignored. Connection and log flags are
/// `global` and welcome before or after the subcommand; values from the environment
/// are the deployment's and not the person's typing, so they are not checked.
///
/// clap's `args_conflicts_with_subcommands` would also refuse the global flags before
/// the subcommand, hence this check.
pub fn reject_loop_flags_with_subcommand<Loop: Args>(
    command: &Command,
    matches: &ArgMatches,
) -> Result<(), clap::Error> {
    let Some((subcommand, _)) = matches.subcommand() else {
        return Ok(());
    };
    let loop_args = Loop::augment_args(Command::new("loop"));
    for arg in loop_args.get_arguments() {
        let id = arg.get_id().as_str();
        if matches.value_source(id) == Some(ValueSource::CommandLine) {
            let flag = arg
                .get_long()
                .map_or_else(|| id.to_owned(), |long| format!("--{long}"));
            return Err(command.clone().error(
                clap::error::ErrorKind::ArgumentConflict,
                format!("{flag} configures the long-running loop, not `{subcommand}`; drop it"),
            ));
        }
    }
    Ok(())
}

/// A clap value parser for a duration (`humantime`: `500ms`, `5s`, `2m`, `7d`) within
/// `[min, max]`. A value outside is a usage error that names the flag and the range.
pub fn duration_within(
    min: std::time::Duration,
    max: std::time::Duration,
) -> impl Fn(&str) -> Result<std::time::Duration, String> + Clone + Send + Sync + 'static {
    move |text: &str| {
        let value = humantime::parse_duration(text).map_err(|e| e.to_string())?;
        if value < min {
            return Err(format!(
                "must be at least {}",
                humantime::format_duration(min)
            ));
        }
        if value > max {
            return Err(format!(
                "must be at most {}",
                humantime::format_duration(max)
            ));
        }
        Ok(value)
    }
}

/// [`duration_within`] with no upper bound worth naming (ten years).
pub fn duration_at_least(
    min: std::time::Duration,
) -> impl Fn(&str) -> Result<std::time::Duration, String> + Clone + Send + Sync + 'static {
    duration_within(min, std::time::Duration::from_secs(10 * 365 * 24 * 3600))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations_out_of_range_name_the_range() {
        let parse = duration_within(Duration::from_millis(100), Duration::from_secs(60));
        assert_eq!(parse("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse("0s").unwrap_err(), "must be at least 100ms");
        assert_eq!(parse("2m").unwrap_err(), "must be at most 1m");
        assert!(parse("-1s").is_err());
        assert!(parse("soon").is_err());
    }
}

/// librdkafka settings, from three places, later ones winning: the file
/// (`--kafka-config-file`, e.g. a mounted Secret), the `KAFKA_CONFIG` environment
/// variable (`--kafka-config-lines`: one `KEY=VALUE` per line, e.g. from a Secret), then
/// `--kafka-config` flags.
/// Secrets (passwords, keys) belong in the first two: a command line is visible to
/// `ps` and in a pod spec.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KafkaConfigArgs {
    /// librdkafka setting, `KEY=VALUE`; repeatable; applied last, so it overrides the
    /// file and KAFKA_CONFIG. Visible to `ps`: keep secrets in --kafka-config-file or
    /// the KAFKA_CONFIG environment variable (one KEY=VALUE per line).
    #[arg(long = "kafka-config", value_name = "KEY=VALUE", value_parser = crate::parse_key_value)]
    pub kafka_config: Vec<(String, String)>,
    /// File of librdkafka settings, one KEY=VALUE per line, `#` comments (e.g. a mounted
    /// Kubernetes Secret holding sasl.password).
    #[arg(long, env = "KAFKA_CONFIG_FILE", value_name = "PATH")]
    pub kafka_config_file: Option<std::path::PathBuf>,
    /// librdkafka settings as one text, one KEY=VALUE per line: meant for the environment
    /// variable (e.g. from a Kubernetes Secret), since a command line is visible to `ps`.
    /// Applied after --kafka-config-file. Never logged.
    #[arg(long, env = KAFKA_CONFIG_ENV, value_name = "LINES", hide_env_values = true)]
    pub kafka_config_lines: Option<SecretString>,
    /// Every setting from the three sources, resolved by [`KafkaConfigArgs::resolve`].
    #[arg(skip)]
    pub resolved: Vec<(String, SecretString)>,
}

/// The environment variable of settings, one `KEY=VALUE` per line.
pub const KAFKA_CONFIG_ENV: &str = "KAFKA_CONFIG";

impl KafkaConfigArgs {
    /// Reads the file and the environment and fills [`KafkaConfigArgs::resolved`]. An
    /// unreadable file or a line that is not `KEY=VALUE` is an error naming where
    /// (never the value: it may be a secret).
    pub fn resolve(&mut self) -> Result<(), String> {
        let mut settings = Vec::new();
        if let Some(path) = &self.kafka_config_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--kafka-config-file {}: {e}", path.display()))?;
            settings.extend(parse_lines(&text, &path.display().to_string())?);
        }
        if let Some(text) = &self.kafka_config_lines {
            settings.extend(parse_lines(
                text.expose_secret(),
                "--kafka-config-lines / KAFKA_CONFIG",
            )?);
        }
        settings.extend(self.kafka_config.iter().cloned());
        self.resolved = settings
            .into_iter()
            .map(|(key, value)| (key, SecretString::from(value)))
            .collect();
        Ok(())
    }
}

fn parse_lines(text: &str, source: &str) -> Result<Vec<(String, String)>, String> {
    text.lines()
        .enumerate()
        .map(|(n, line)| (n + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
        .map(|(n, line)| {
            crate::parse_key_value(line)
                .map_err(|_| format!("{source}, line {n}: expected KEY=VALUE"))
        })
        .collect()
}

#[cfg(test)]
mod kafka_config_tests {
    use super::*;

    #[test]
    fn lines_with_comments_and_a_named_error() {
        let parsed = parse_lines(
            "# tls\nsecurity.protocol=SSL\n\n  sasl.password = a=b\n",
            "f",
        )
        .unwrap();
        assert_eq!(
            parsed,
            vec![
                ("security.protocol".into(), "SSL".into()),
                ("sasl.password".into(), " a=b".into())
            ]
        );
        let error = parse_lines("ok=1\nsecret-without-equals\n", "f").unwrap_err();
        assert_eq!(error, "f, line 2: expected KEY=VALUE");
    }
}

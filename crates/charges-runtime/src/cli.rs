//! Command-line conventions every binary follows.

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command};

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

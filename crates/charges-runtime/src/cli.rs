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

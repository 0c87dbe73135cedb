//! Parsing a binary's command line the one way every binary does: its own defaults,
//! environment variables for every flag, `--log-format`, and the exit-code table in `--help`.

use crate::exit::EXIT_CODES_HELP;
use clap::{CommandFactory, FromArgMatches};

/// Parses the command line into `T`, after `tweak` adjusted the clap command (a binary's
/// own defaults, e.g. `producer`'s 10 s deadline, or old spellings as hidden aliases),
/// and appends the exit-code table to `--help`. Every flag can also come from an
/// environment variable (`QLIST_NODES`, `IDBROKER_LISTEN`, ...: [`mod@crate::env`]), and
/// every binary gets `--log-format text|json` ([`crate::init_logging`]).
///
/// On a usage error clap prints it with the usage line and exits 2; `--help` and
/// `--version` print and exit 0.
pub fn parse<T: CommandFactory + FromArgMatches>(
    tweak: impl FnOnce(clap::Command) -> clap::Command,
) -> T {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut command = crate::env::with_env(
        tweak(with_exit_codes(T::command())).arg(crate::logging::log_format_arg()),
        &argv,
    );
    let parsed = command
        .try_get_matches_from_mut(argv.iter())
        .and_then(|mut matches| {
            if let Some(format) = matches.get_one(crate::logging::LOG_FORMAT_ID) {
                crate::logging::set_format(*format);
            }
            T::from_arg_matches_mut(&mut matches)
        });
    match parsed {
        Ok(t) => t,
        Err(e) => match crate::env::env_error(&mut command, &e, &argv) {
            Some(named) => named.exit(),
            None => e.format(&mut command).exit(),
        },
    }
}

/// `cmd` and each of its subcommands, with the exit-code table after their help.
fn with_exit_codes(cmd: clap::Command) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    names
        .iter()
        .fold(cmd.after_help(EXIT_CODES_HELP), |cmd, name| {
            cmd.mut_subcommand(name, with_exit_codes)
        })
}

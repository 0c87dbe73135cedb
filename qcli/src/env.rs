//! Every flag can also come from an environment variable, named by one rule, so that flags
//! added later get one too without anyone remembering to.
//!
//! - The shared flags (those of [`SourceArgs`](crate::SourceArgs): quorum, broker,
//!   deadline) are `QLIST_` + the flag in upper snake case: `QLIST_NODES`,
//!   `QLIST_DEADLINE_MS`, `QLIST_CONNECT_TIMEOUT_MS`; `--broker` is `QLIST_BROKERS`, and
//!   `--log-format` is `QLIST_LOG_FORMAT`.
//! - A binary's own flags are its name + the flag: `IDBROKER_LISTEN`, `PRODUCER_SHARD`,
//!   `MERGER_OUT`, `IDCTL_COUNT` (the same variable for the same flag in every
//!   subcommand). A subcommand flag spelled like a shared one but meaning something else
//!   (`idctl cluster up --nodes 5`, a count) adds the subcommand path:
//!   `IDCTL_CLUSTER_UP_NODES`.
//! - A flag on the command line wins over its variable, and a flag given on the command
//!   line silences the variables of the flags it excludes (`--broker` on the command line
//!   with `QLIST_NODES` in the environment uses the broker).
//! - Positional arguments, `--help`/`--version` and hidden old spellings have none.
//! - `--help` names the variables but never shows their values (a node URL can hold a
//!   password), and an invalid value from a variable is reported by the variable's name,
//!   without the value.
//! - On/off flags take `true/false`, `yes/no`, `on/off` or `1/0` from a variable.

use clap::builder::BoolishValueParser;
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, ArgAction, Args, Command};
use std::ffi::OsString;

/// The prefix of the shared flags' variables.
pub const SHARED_PREFIX: &str = "QLIST";

/// `cmd` with an environment variable for every flag that has none (module docs), read
/// now; `argv` is the command line, whose flags silence the variables of the flags they
/// exclude.
pub(crate) fn with_env(cmd: Command, argv: &[OsString]) -> Command {
    let shared = crate::SourceArgs::augment_args(Command::new(SHARED_PREFIX));
    let prefix = upper_snake(cmd.get_name());
    walk(cmd, &prefix, &prefix, &shared, argv)
}

/// `cmd` and its subcommands: their flags use `prefix` (the binary's), except those
/// spelled like a shared flag but not one, which use `path` (the binary's and the
/// subcommands' names).
fn walk(
    mut cmd: Command,
    prefix: &str,
    path: &str,
    shared: &Command,
    argv: &[OsString],
) -> Command {
    let silenced = excluded_by_command_line(&cmd, argv);
    let ids: Vec<clap::Id> = cmd.get_arguments().map(|a| a.get_id().clone()).collect();
    for id in ids {
        let silence = silenced.contains(&id);
        let collides = !is_shared(cmd.get_arguments().find(|a| a.get_id() == &id), shared)
            && shared.get_arguments().any(|s| s.get_id() == &id);
        let p = if collides { path } else { prefix };
        cmd = cmd.mut_arg(id, |a| with_var(a, p, shared, silence));
    }
    let subcommands: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for name in subcommands {
        let sub_path = format!("{path}_{}", upper_snake(&name));
        cmd = cmd.mut_subcommand(&name, |sub| walk(sub, prefix, &sub_path, shared, argv));
    }
    cmd
}

/// `arg` with its variable: its own if it has one, else `QLIST_` + id for a shared flag,
/// else `prefix` + id; none at all when `silence`d or not a flag a user sets.
fn with_var(arg: Arg, prefix: &str, shared: &Command, silence: bool) -> Arg {
    let meta = matches!(
        arg.get_action(),
        ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
    );
    if arg.is_positional() || arg.is_hide_set() || meta {
        return arg;
    }
    if silence {
        return arg.env(None);
    }
    let arg = match arg.get_env() {
        Some(_) => arg,
        None => {
            let name = if is_shared(Some(&arg), shared) {
                var_name(SHARED_PREFIX, arg.get_id().as_str())
            } else {
                var_name(prefix, arg.get_id().as_str())
            };
            arg.env(name)
        }
    };
    let arg = arg.hide_env_values(true);
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        arg.value_parser(BoolishValueParser::new())
    } else {
        arg
    }
}

/// Whether `arg` is one of the shared flags (same name, same long flag, same value
/// names), not merely spelled like one.
fn is_shared(arg: Option<&Arg>, shared: &Command) -> bool {
    let Some(arg) = arg else { return false };
    shared.get_arguments().any(|s| {
        s.get_id() == arg.get_id()
            && s.get_long() == arg.get_long()
            && s.get_value_names() == arg.get_value_names()
    })
}

/// The ids of the flags of `cmd` that a flag on the command line excludes (through an
/// exclusive group such as "`--nodes` or `--broker`"): their variables must not make
/// the command line a usage error.
fn excluded_by_command_line(cmd: &Command, argv: &[OsString]) -> Vec<clap::Id> {
    let mut out = Vec::new();
    for group in cmd.get_groups() {
        if group.clone().is_multiple() {
            continue;
        }
        let members: Vec<&clap::Id> = group.get_args().collect();
        let given = members.iter().any(|id| {
            cmd.get_arguments()
                .find(|a| a.get_id() == *id)
                .is_some_and(|a| on_command_line(a, argv))
        });
        if given {
            for id in members {
                let on_line = cmd
                    .get_arguments()
                    .find(|a| a.get_id() == id)
                    .is_some_and(|a| on_command_line(a, argv));
                if !on_line {
                    out.push(id.clone());
                }
            }
        }
    }
    out
}

/// Whether `arg` appears in `argv` (by its long flag, an alias or its short flag).
fn on_command_line(arg: &Arg, argv: &[OsString]) -> bool {
    let longs: Vec<String> = arg
        .get_long()
        .into_iter()
        .chain(arg.get_all_aliases().unwrap_or_default())
        .map(|l| format!("--{l}"))
        .collect();
    let short = arg.get_short().map(|s| format!("-{s}"));
    argv.iter().skip(1).any(|word| {
        let Some(word) = word.to_str() else {
            return false;
        };
        longs.iter().any(|l| {
            word == l
                || word
                    .strip_prefix(l.as_str())
                    .is_some_and(|r| r.starts_with('='))
        }) || short
            .as_deref()
            .is_some_and(|s| word.starts_with(s) && !word.starts_with("--"))
    })
}

/// `PREFIX_ID` in upper snake case.
fn var_name(prefix: &str, id: &str) -> String {
    format!("{prefix}_{}", upper_snake(id))
}

fn upper_snake(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

/// When clap refused a value that came from an environment variable, the same error
/// naming the variable and not the value (it may be a secret); `None` for any other error.
pub(crate) fn env_error(
    cmd: &mut Command,
    e: &clap::Error,
    argv: &[OsString],
) -> Option<clap::Error> {
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation | ErrorKind::InvalidUtf8
    ) {
        return None;
    }
    let Some(ContextValue::String(shown)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    // Subcommands are built (and their flags printable) only once asked for.
    cmd.build();
    let (var, shown, path) = find_env_arg(cmd, shown, argv)?;
    let reason = match (e.get(ContextKind::ValidValue), std::error::Error::source(e)) {
        (Some(ContextValue::Strings(valid)), _) => {
            format!("expected one of: {}", valid.join(", "))
        }
        (_, Some(source)) => source.to_string(),
        _ if e.kind() == ErrorKind::InvalidUtf8 => "not valid UTF-8".to_string(),
        _ => "invalid value".to_string(),
    };
    let mut at = cmd;
    for name in &path {
        at = at.find_subcommand_mut(name)?;
    }
    Some(at.error(
        ErrorKind::ValueValidation,
        format!("environment variable {var} (for {shown}): invalid value (not shown): {reason}"),
    ))
}

/// The variable, the flag and the subcommand path of the set variable whose flag (not on
/// the command line) clap shows as `shown`, in built `cmd` or its subcommands.
fn find_env_arg(
    cmd: &Command,
    shown: &str,
    argv: &[OsString],
) -> Option<(String, String, Vec<String>)> {
    for arg in cmd.get_arguments() {
        let Some(var) = arg.get_env() else { continue };
        if arg.to_string() == shown
            && std::env::var_os(var).is_some()
            && !on_command_line(arg, argv)
        {
            return Some((
                var.to_string_lossy().into_owned(),
                shown.to_string(),
                Vec::new(),
            ));
        }
    }
    cmd.get_subcommands().find_map(|sub| {
        let (var, shown, mut path) = find_env_arg(sub, shown, argv)?;
        path.insert(0, sub.get_name().to_string());
        Some((var, shown, path))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Debug, Parser)]
    #[command(name = "idbroker")]
    struct Flags {
        #[arg(long)]
        listen: String,
        #[command(flatten)]
        source: crate::SourceArgs,
    }

    #[derive(Debug, Parser)]
    #[command(name = "idctl")]
    struct Ctl {
        #[command(subcommand)]
        cmd: Sub,
    }

    // A test-only mirror of idctl's subcommands: variant sizes do not matter here.
    #[allow(clippy::large_enum_variant)]
    #[derive(Debug, clap::Subcommand)]
    enum Sub {
        #[command(subcommand)]
        Cluster(Cluster),
        Next {
            #[command(flatten)]
            source: crate::SourceArgs,
            #[arg(long, default_value_t = 1)]
            count: u64,
        },
        Stats {
            addr: String,
        },
    }

    #[derive(Debug, clap::Subcommand)]
    enum Cluster {
        Up {
            #[arg(long, default_value_t = 5)]
            nodes: usize,
        },
    }

    fn vars(cmd: &Command) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = cmd
            .get_arguments()
            .filter_map(|a| {
                a.get_env().map(|v| {
                    (
                        format!("{}{}", cmd.get_name(), a.get_id()),
                        v.to_string_lossy().into_owned(),
                    )
                })
            })
            .collect();
        for sub in cmd.get_subcommands() {
            out.extend(vars(sub));
        }
        out
    }

    fn argv(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn shared_flags_are_qlist_own_flags_are_the_binarys() {
        let cmd = with_env(Flags::command(), &argv(&["idbroker"]));
        let v = vars(&cmd);
        for (arg, var) in [
            ("idbrokerlisten", "IDBROKER_LISTEN"),
            ("idbrokernodes", "QLIST_NODES"),
            ("idbrokerkey", "QLIST_KEY"),
            ("idbrokerdeadline_ms", "QLIST_DEADLINE_MS"),
            ("idbrokerconnect_timeout_ms", "QLIST_CONNECT_TIMEOUT_MS"),
            ("idbrokerbroker", "QLIST_BROKERS"),
            ("idbrokerclassic", "QLIST_CLASSIC"),
        ] {
            assert!(
                v.contains(&(arg.to_string(), var.to_string())),
                "{arg} -> {var} missing in {v:?}"
            );
        }
        // The hidden old spelling has none.
        assert!(!v.iter().any(|(a, _)| a == "idbrokertimeout_ms"), "{v:?}");
        assert!(cmd
            .get_arguments()
            .all(|a| a.get_env().is_none() || a.is_hide_env_values_set()));
    }

    #[test]
    fn subcommands_share_the_binary_prefix_and_collisions_get_the_path() {
        let cmd = with_env(Ctl::command(), &argv(&["idctl"]));
        let v = vars(&cmd);
        assert!(
            v.contains(&("nextcount".into(), "IDCTL_COUNT".into())),
            "{v:?}"
        );
        assert!(
            v.contains(&("nextnodes".into(), "QLIST_NODES".into())),
            "{v:?}"
        );
        assert!(
            v.contains(&("upnodes".into(), "IDCTL_CLUSTER_UP_NODES".into())),
            "{v:?}"
        );
        assert!(
            !v.iter().any(|(a, _)| a == "statsaddr"),
            "positional: {v:?}"
        );
    }

    #[test]
    fn a_flag_on_the_command_line_silences_the_variables_it_excludes() {
        let cmd = with_env(Flags::command(), &argv(&["idbroker", "--broker=h:1"]));
        let nodes = cmd
            .get_arguments()
            .find(|a| a.get_id() == "nodes")
            .expect("nodes");
        assert!(nodes.get_env().is_none());
        let broker = cmd
            .get_arguments()
            .find(|a| a.get_id() == "broker")
            .expect("broker");
        assert_eq!(
            broker.get_env().and_then(|v| v.to_str()),
            Some("QLIST_BROKERS")
        );
    }

    /// merger's shape: top-level flags that conflict with subcommands.
    #[derive(Debug, Parser)]
    #[command(
        name = "qcli-test-merger",
        args_conflicts_with_subcommands = true,
        subcommand_negates_reqs = true
    )]
    struct Merger {
        #[command(subcommand)]
        cmd: Option<MergerSub>,
        #[arg(long, required = true)]
        out: Option<String>,
    }

    #[derive(Debug, clap::Subcommand)]
    enum MergerSub {
        Verify { file: String },
    }

    #[test]
    fn a_top_level_variable_does_not_block_a_subcommand() {
        // Only this test reads this variable (std serialises environment access).
        std::env::set_var("QCLI_TEST_MERGER_OUT", "env.bin");
        let parse = |words: &[&str]| {
            let argv = argv(words);
            let mut cmd = with_env(Merger::command(), &argv);
            cmd.try_get_matches_from_mut(argv.iter())
                .and_then(|mut m| Merger::from_arg_matches_mut(&mut m))
        };
        let merge = parse(&["m"]).expect("merge from the variable");
        assert_eq!(merge.out.as_deref(), Some("env.bin"));
        let verify = parse(&["m", "verify", "x.bin"]);
        std::env::remove_var("QCLI_TEST_MERGER_OUT");
        let verify = verify.expect("verify despite QCLI_TEST_MERGER_OUT");
        assert!(matches!(verify.cmd, Some(MergerSub::Verify { .. })));
    }
}

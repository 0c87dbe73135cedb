//! One exit-code convention for every binary: the code says why a command failed.

use idproto::IdError;
use std::error::Error;
use std::process::ExitCode;

/// Why a command failed; [`Cause::code`] is its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// 1: anything not below (a bug, the OS refusing a runtime or a socket, ...).
    Other,
    /// 2: the command line is wrong (clap's usage errors, a bad value such as `--batch 0`,
    /// a malformed node URL, an even node count).
    Usage,
    /// 3: the input is missing, unreadable, malformed or changed (producer's input file;
    /// merger's sublists; the list.bin given to `merger verify`/`cat`).
    Input,
    /// 4: the output is refused or cannot be written (a sublist in use, another shard's
    /// or written from other input; disk full; list.bin not durable).
    Output,
    /// 5: the ID generator is unavailable or unsafe: no quorum or no broker before the
    /// deadline, an unsafe node (`idctl check` too), a bad register value, IDs that went
    /// backwards. Work done before stays durable: run again to resume.
    Ids,
}

impl Cause {
    /// The process exit code for this cause.
    pub const fn code(self) -> u8 {
        match self {
            Cause::Other => 1,
            Cause::Usage => 2,
            Cause::Input => 3,
            Cause::Output => 4,
            Cause::Ids => 5,
        }
    }

    /// The cause whose [`code`](Cause::code) is `code`; unknown codes are [`Cause::Other`].
    pub const fn from_code(code: u8) -> Cause {
        match code {
            2 => Cause::Usage,
            3 => Cause::Input,
            4 => Cause::Output,
            5 => Cause::Ids,
            _ => Cause::Other,
        }
    }
}

/// The exit-code table, appended to every binary's `--help` (README: "Command-line
/// conventions").
pub const EXIT_CODES_HELP: &str = "\
Exit codes: 0 ok; 1 other failure; 2 usage (bad flag or value); 3 bad, unreadable or
changed input; 4 output refused or not writable; 5 ID generator unavailable or unsafe
(no quorum or broker before the deadline, unsafe node).";

/// An error a binary raises itself, with its cause: a value that parsed but makes no
/// sense ([`usage`]), nodes that `idctl check` found unusable, ...
#[derive(Debug)]
pub struct Failure {
    /// Why it failed, which decides the exit code.
    pub cause: Cause,
    /// The whole error text the binary prints (its `Display`).
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for Failure {}

/// A [`Failure`] as an `anyhow::Error`, for `bail!`-like use in binaries.
pub fn fail(cause: Cause, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Failure {
        cause,
        message: message.into(),
    })
}

/// A command-line value that parsed but makes no sense: a [`Failure`] with
/// [`Cause::Usage`] (exit code 2).
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    fail(Cause::Usage, message)
}

/// The cause of an ID-generator error: a bad configuration or request is the user's
/// (usage); everything else means the generator could not (safely) hand out IDs.
pub fn id_error_cause(e: &IdError) -> Cause {
    match e {
        IdError::Config(_) | IdError::BadRequest(_) => Cause::Usage,
        IdError::NoQuorum { .. }
        | IdError::Deadline { .. }
        | IdError::UnsafeNode { .. }
        | IdError::BadValue { .. }
        | IdError::Exhausted { .. }
        | IdError::BrokersUnavailable { .. }
        | IdError::Protocol { .. } => Cause::Ids,
    }
}

/// The cause of `err`: the outermost error in its chain that `classify` or the shared
/// rules ([`Failure`], [`IdError`], clap's errors) recognise; [`Cause::Other`] if none.
pub fn cause_of(
    err: &anyhow::Error,
    classify: impl Fn(&(dyn Error + 'static)) -> Option<Cause>,
) -> Cause {
    err.chain()
        .find_map(|e| classify(e).or_else(|| shared_cause(e)))
        .unwrap_or(Cause::Other)
}

fn shared_cause(e: &(dyn Error + 'static)) -> Option<Cause> {
    if let Some(f) = e.downcast_ref::<Failure>() {
        Some(f.cause)
    } else if e.is::<clap::Error>() {
        Some(Cause::Usage)
    } else {
        e.downcast_ref::<IdError>().map(id_error_cause)
    }
}

/// Ends a binary's `main`: `Ok` is exit code 0; an error is printed once as
/// `BIN: error: CAUSE: CAUSE...` (`{:#}`, each cause once; with `--log-format json` one
/// JSON object like the log lines) on stderr and exits with the
/// code of its [`Cause`] (see [`cause_of`]; `classify` names the binary's own errors).
pub fn exit(
    bin: &str,
    result: anyhow::Result<()>,
    classify: impl Fn(&(dyn Error + 'static)) -> Option<Cause>,
) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = cause_of(&e, classify).code();
            if crate::logging::format() == crate::LogFormat::Json {
                // One more JSON line, shaped like the log lines, for log collectors.
                let line = serde_json::json!({
                    "level": "ERROR",
                    "target": bin,
                    "fields": { "message": format!("error: {e:#}"), "exit_code": code },
                });
                eprintln!("{line}");
            } else {
                eprintln!("{bin}: error: {e:#}");
            }
            ExitCode::from(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    fn none(_: &(dyn Error + 'static)) -> Option<Cause> {
        None
    }

    #[test]
    fn codes_are_the_documented_ones() {
        let all = [
            Cause::Other,
            Cause::Usage,
            Cause::Input,
            Cause::Output,
            Cause::Ids,
        ];
        let codes: Vec<u8> = all.iter().map(|c| c.code()).collect();
        assert_eq!(codes, [1, 2, 3, 4, 5]);
        for c in all {
            assert_eq!(Cause::from_code(c.code()), c);
        }
        assert_eq!(Cause::from_code(0), Cause::Other);
        assert_eq!(Cause::from_code(200), Cause::Other);
    }

    #[test]
    fn the_outermost_known_cause_wins_through_context() {
        let e = Err::<(), _>(IdError::Deadline {
            deadline: std::time::Duration::from_secs(1),
            rounds: 3,
        })
        .context("next")
        .unwrap_err();
        assert_eq!(cause_of(&e, none), Cause::Ids);
        let e = Err::<(), _>(IdError::Config("even node count".into()))
            .context("connect")
            .unwrap_err();
        assert_eq!(cause_of(&e, none), Cause::Usage);
        let e = usage("--clients must be at least 1").context("bench");
        assert_eq!(cause_of(&e, none), Cause::Usage);
        let e = fail(Cause::Input, "input x: gone").context("reading");
        assert_eq!(cause_of(&e, none), Cause::Input);
        let e = anyhow::anyhow!("something else");
        assert_eq!(cause_of(&e, none), Cause::Other);
    }

    #[test]
    fn the_binary_classifier_comes_first() {
        let e = usage("x").context("y");
        let input = |_: &(dyn Error + 'static)| Some(Cause::Input);
        assert_eq!(cause_of(&e, input), Cause::Input);
    }
}

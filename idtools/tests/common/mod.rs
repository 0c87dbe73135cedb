//! Helpers shared by the idclient test binaries that run `idctl` as a user would.
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs the idctl binary of this build with `args`.
pub fn idctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idctl"))
        .args(args)
        .output()
        .expect("run idctl")
}

/// Everything a command printed, stdout then stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

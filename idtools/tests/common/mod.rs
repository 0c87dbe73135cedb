//! Helpers shared by the idclient test binaries that run `idctl` as a user would.
// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

use std::path::PathBuf;
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

/// The idbroker binary beside idctl in the same target directory (build it first:
/// `cargo build --release -p broker --bins`; in a target directory shared by several
/// checkouts, build it from this one right before).
pub fn idbroker_bin() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_idctl")).with_file_name("idbroker");
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --release --workspace --bins` first",
        path.display()
    );
    path
}

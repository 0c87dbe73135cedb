//! What the producer's process tests share: a local quorum, the binary run as a user runs
//! it, and its exit.
#![allow(dead_code)] // each test file uses its own subset

use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::Receiver;

/// A throwaway local quorum of `n` nodes; panics with the reason if it cannot start.
pub use idtools::cluster::test_quorum as quorum;

pub fn producer_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_producer"));
    c.args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

pub fn run(args: &[&str]) -> Output {
    producer_cmd(args).output().expect("spawn producer")
}

pub use testkit::assert_exit;

/// Reads the child's stderr on a thread and forwards every line, so a test can wait for
/// one (a stall point) and still read the error at the end.
pub fn stderr_lines(child: &mut Child) -> Receiver<String> {
    use std::io::BufRead;
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

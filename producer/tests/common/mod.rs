//! What the producer's process tests share: a local quorum, the binary run as a user runs
//! it, and its exit.
#![allow(dead_code, unused_imports)] // each test file uses its own subset

pub mod publish;

use qformat::names::shard_db_path;
use qformat::Record;
use std::path::Path;
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

/// The records of shard `shard`'s sublist under `data`, in ID order; none while the
/// sublist does not exist yet (a producer killed before it created it).
pub fn durable_items(data: &Path, shard: u32) -> Vec<Record> {
    let db = shard_db_path(data, shard);
    if !db.join("CURRENT").exists() {
        return Vec::new();
    }
    let r = sublist::shard::ShardReader::open(&db).expect("open the sublist");
    r.iter()
        .collect::<Result<_, _>>()
        .expect("read the sublist")
}

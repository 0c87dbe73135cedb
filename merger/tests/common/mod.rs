//! What the runs tests share: sublists made directly with `ShardWriter`, the merger
//! binary run as a user runs it, and assertions on its exit.
#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use qformat::names::shard_db_path;
use qformat::shard::ProgressMarker;
use qformat::Record;
use sublist::shard::ShardWriter;

pub mod publish;

pub const MERGER: &str = env!("CARGO_BIN_EXE_merger");
pub const USAGE: i32 = 2;
pub const INPUT: i32 = 3;

/// Writes a finished (or not) sublist `shard` under `dir` holding `ids` (ascending),
/// with payloads from `payload`, in batches like a producer's.
pub fn make_shard_with(
    dir: &Path,
    shard: u32,
    ids: &[u64],
    payload: impl Fn(u64) -> Vec<u8>,
    finished: bool,
) -> PathBuf {
    let mut w = ShardWriter::open(dir, shard).expect("open shard writer");
    let mut seq = 0u64;
    for chunk in ids.chunks(10_000) {
        let recs: Vec<Record> = chunk
            .iter()
            .map(|&id| {
                seq += 1;
                Record {
                    id,
                    shard,
                    seq: seq - 1,
                    payload: payload(id),
                }
            })
            .collect();
        let p = ProgressMarker {
            next_seq: seq,
            finished: false,
            last_id: chunk.last().copied().unwrap_or(0),
            fingerprint: b"test".to_vec(),
        };
        w.write_batch(&recs, &p).expect("write batch");
    }
    let p = ProgressMarker {
        next_seq: seq,
        finished,
        last_id: ids.last().copied().unwrap_or(0),
        fingerprint: b"test".to_vec(),
    };
    w.write_batch(&[], &p).expect("final marker");
    shard_db_path(dir, shard)
}

/// [`make_shard_with`] the payloads of [`payload`].
pub fn make_shard(dir: &Path, shard: u32, ids: &[u64], finished: bool) -> PathBuf {
    make_shard_with(dir, shard, ids, payload, finished)
}

pub fn payload(id: u64) -> Vec<u8> {
    format!("item-{id}-{}", "x".repeat((id % 200) as usize)).into_bytes()
}

/// `shards` sublists under `dir` with `n` IDs dealt by a fixed pattern (not round-robin,
/// so blocks of different shards overlap unevenly).
pub fn make_shards(dir: &Path, shards: u32, n: u64) -> Vec<PathBuf> {
    (0..shards)
        .map(|s| {
            let ids: Vec<u64> = (1..=n)
                .filter(|i| (i * 7 + i / 13) % u64::from(shards) == u64::from(s))
                .collect();
            make_shard(dir, s, &ids, true)
        })
        .collect()
}

pub fn merger(args: &[&str]) -> Output {
    Command::new(MERGER)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run merger")
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[track_caller]
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "merger failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts that the merger exited with `code`, without a panic, its stderr saying each of
/// `needles` ([`testkit::assert_exit`] for each): its stderr.
#[track_caller]
pub fn fails(out: &Output, code: i32, needles: &[&str]) -> String {
    testkit::assert_exit(out, code, "");
    for n in needles {
        testkit::assert_exit(out, code, n);
    }
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every record of the files, in order, through `merger cat --json` (what a user sees).
pub fn cat(files: &[&Path]) -> Vec<String> {
    let mut args = vec!["cat", "--json"];
    args.extend(files.iter().map(|f| s(f)));
    ok(&merger(&args)).lines().map(str::to_string).collect()
}

/// Seals each sublist into `runs/shard-<n>.bin` with a merge of that sublist alone.
pub fn seal_all(sublists: &[PathBuf], runs: &Path) {
    std::fs::create_dir_all(runs).expect("mkdir runs");
    for (n, sub) in sublists.iter().enumerate() {
        let out = runs.join(format!("shard-{n}.bin"));
        ok(&merger(&["--out", s(&out), s(sub)]));
    }
}

pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("ls")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

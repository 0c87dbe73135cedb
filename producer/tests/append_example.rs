//! The embedding API as a user's job runs it: `examples/append.rs`, a process appending
//! computed records with `producer::Appender`, killed with SIGKILL (by its pid) at stall
//! points and rerun; against a real redis-server quorum and real RocksDB.

mod common;

use common::{assert_exit, durable_items as items, quorum, stderr_lines};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The example's record `i`: a copy of `record` in examples/append.rs (an example is a
/// binary of its own, nothing to import from).
fn record(shard: u32, i: u64) -> Vec<u8> {
    match i % 5 {
        0 => Vec::new(),
        1 => format!("shard {shard}\nrecord {i}\n").into_bytes(),
        2 => [&i.to_le_bytes()[..], b"\0\0", &(i * i).to_be_bytes()[..]].concat(),
        _ => format!("{shard}:{i}:{}", "x".repeat((i % 7) as usize)).into_bytes(),
    }
}

/// The example binary, which `cargo test` builds beside the tests (target/<profile>/examples).
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test executable");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps")
        .join("examples")
        .join("append");
    assert!(
        path.is_file(),
        "{} is missing: `cargo test -p producer` builds it (a filter like `--test NAME` does not: add `--examples` or build it with `cargo build --release -p producer --examples`)",
        path.display()
    );
    path
}

/// The durable records are records `0..n` exactly, in order with increasing IDs, and none
/// changed its ID since an earlier look (`seen`: seq -> ID). Returns `n`.
#[track_caller]
fn check_prefix(data: &Path, shard: u32, seen: &mut BTreeMap<u64, u64>) -> u64 {
    let recs = items(data, shard);
    for (i, r) in recs.iter().enumerate() {
        assert_eq!((r.shard, r.seq), (shard, i as u64), "record {i}");
        assert_eq!(r.payload, record(shard, i as u64), "payload of record {i}");
        if i > 0 {
            assert!(recs[i - 1].id < r.id, "IDs not increasing at {i}");
        }
        let before = seen.insert(r.seq, r.id);
        assert!(
            before.is_none() || before == Some(r.id),
            "record {i} changed its ID from {before:?} to {}",
            r.id
        );
    }
    recs.len() as u64
}

#[test]
fn the_append_example_resumes_exactly_once_after_kill_9() {
    const COUNT: u64 = 3000;
    const KILLS: u64 = 4;
    const STEP: u64 = 500;
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let runs = tmp.path().join("runs");
    std::fs::create_dir(&runs).expect("runs dir");
    let args = [
        "--nodes".to_string(),
        q.urls_arg(),
        "--data-dir".into(),
        data.display().to_string(),
        "--shard".into(),
        "7".into(),
        "--count".into(),
        COUNT.to_string(),
        "--batch".into(),
        "40".into(),
        "--seal-to".into(),
        runs.display().to_string(),
    ];
    let bin = example();
    let mut seen = BTreeMap::new();
    let mut durable = 0;
    for round in 0..KILLS {
        // Stalls once this many records are durable, with the next batch's IDs in hand.
        let stall_at = (round + 1) * STEP;
        let mut child = Command::new(&bin)
            .args(&args)
            .env(producer::test_hooks::STALL_ENV, stall_at.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the example");
        let lines = stderr_lines(&mut child);
        let mut said = Vec::new();
        loop {
            match lines.recv_timeout(Duration::from_secs(120)) {
                Ok(line) if line.contains(producer::STALL_ANNOUNCE) => break,
                Ok(line) => said.push(line),
                Err(e) => panic!(
                    "round {round}: no stall announced ({e}); exit {:?}; stderr:\n{}",
                    child.try_wait(),
                    said.join("\n")
                ),
            }
        }
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "round {round}: the example exited before its kill"
        );
        child.kill().expect("SIGKILL to the example's pid");
        let status = child.wait().expect("wait");
        assert_eq!(status.code(), None, "round {round}: not killed by a signal");
        let now = check_prefix(&data, 7, &mut seen);
        assert!(
            now >= stall_at && now >= durable,
            "round {round}: {now} records durable after stalling at {stall_at} (before: {durable})"
        );
        assert!(now < COUNT, "round {round}: finished before its kill");
        durable = now;
    }
    assert!(
        !runs.join("shard-7.bin").exists(),
        "no run before the job finished"
    );

    let out = Command::new(&bin)
        .args(&args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run the example");
    assert_exit(&out, 0, "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "{durable} records durable, appending from {durable}"
        )) && stdout.contains(&format!("resumed after {durable} items"))
            && stdout.contains("sealed shard 7: 3000 items"),
        "{stdout}"
    );
    assert_eq!(
        check_prefix(&data, 7, &mut seen),
        COUNT,
        "every record exactly once"
    );
    let run = std::fs::read(runs.join("shard-7.bin")).expect("the sealed run");

    // Finished: a rerun appends nothing, and seals the same bytes again.
    let again = Command::new(&bin)
        .args(&args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("rerun the example");
    assert_exit(&again, 0, "");
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("nothing to do"),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
    assert_eq!(check_prefix(&data, 7, &mut seen), COUNT);
    assert_eq!(
        std::fs::read(runs.join("shard-7.bin")).expect("run"),
        run,
        "sealing is deterministic"
    );

    // Another count is another job: refused, nothing changed.
    let other: Vec<String> = args
        .iter()
        .map(|a| {
            if *a == COUNT.to_string() {
                "10".into()
            } else {
                a.clone()
            }
        })
        .collect();
    let refused = Command::new(&bin)
        .args(&other)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run the example");
    assert!(!refused.status.success(), "another count accepted");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("different input"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

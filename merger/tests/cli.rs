//! The `merger` binary against real RocksDB sublists: merging, verify, cat, bad input,
//! corrupt list.bin files and a kill -9 in the middle of a merge.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{make_shard_with, merger as run, s, INPUT, MERGER, USAGE};
use qformat::listbin::{verify, ListWriter};
use qformat::Record;
use testkit::assert_exit;

fn text_payload(id: u64) -> Vec<u8> {
    format!("item-{id}").into_bytes()
}

/// Three shards, IDs 1..=30 dealt round-robin (shard = id % 3).
fn three_shards(dir: &Path) -> Vec<PathBuf> {
    (0..3u32)
        .map(|s| {
            let ids: Vec<u64> = (1..=30).filter(|i| i % 3 == u64::from(s)).collect();
            make_shard_with(dir, s, &ids, text_payload, true)
        })
        .collect()
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("list dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn merge_data_dir_then_verify_and_cat() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    three_shards(&data);
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).expect("mkdir");
    let list = out_dir.join("list.bin");

    let out = run(&["--out", s(&list), "--data-dir", s(&data)]);
    assert!(
        out.status.success(),
        "merge failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("merged 30 items from 3 shards"), "{stdout}");
    assert_eq!(
        dir_names(&out_dir),
        vec!["list.bin"],
        "temporary file left behind"
    );

    let records: Vec<Record> = qformat::read_list(&list)
        .expect("open")
        .collect::<Result<_, _>>()
        .expect("read");
    assert_eq!(
        records.iter().map(|r| r.id).collect::<Vec<_>>(),
        (1..=30).collect::<Vec<_>>()
    );
    for r in &records {
        assert_eq!(u64::from(r.shard), r.id % 3);
        assert_eq!(
            r.seq,
            (r.id - 1) / 3,
            "each shard's items keep their input order"
        );
        assert_eq!(r.payload, text_payload(r.id));
    }
    assert_eq!(records_in(&list, "verify"), 30);

    let out = run(&["verify", s(&list)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK: 30 records"));

    let out = run(&["cat", s(&list)]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().next(), Some("1\t1\t0\titem-1"));
    assert_eq!(text.lines().count(), 30);

    let out = run(&["cat", "--json", s(&list)]);
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 30);
    assert_eq!(
        lines[29],
        serde_json::json!({"id": 30, "shard": 0, "seq": 9, "payload": "item-30"})
    );
}

#[test]
fn merge_explicit_paths_and_escaped_cat() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = make_shard_with(
        &tmp.path().join("a"),
        0,
        &[2, 4],
        |_| vec![0, 255, b'\n'],
        true,
    );
    let b = make_shard_with(
        &tmp.path().join("b"),
        1,
        &[1, 3],
        |id| format!("{id}").into_bytes(),
        true,
    );
    let list = tmp.path().join("list.bin");
    let out = run(&["--out", s(&list), s(&a), s(&b)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["cat", s(&list)]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        text,
        "1\t1\t0\t1\n2\t0\t0\t\\x00\\xff\\n\n3\t1\t1\t3\n4\t0\t1\t\\x00\\xff\\n\n"
    );
    let out = run(&["cat", "--json", s(&list)]);
    let first_bin = String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .map(str::to_owned);
    assert_eq!(
        first_bin.as_deref(),
        Some(r#"{"id":2,"payload_hex":"00ff0a","seq":0,"shard":0}"#)
    );
}

#[test]
fn no_shards_found() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(tmp.path().join("unrelated")).expect("mkdir");
    let list = tmp.path().join("list.bin");
    assert_exit(
        &run(&["--out", s(&list), "--data-dir", s(tmp.path())]),
        INPUT,
        "no sublists found",
    );
    assert_exit(
        &run(&[
            "--out",
            s(&list),
            "--data-dir",
            s(&tmp.path().join("missing")),
        ]),
        INPUT,
        "cannot list data dir",
    );
    assert!(!list.exists());
}

#[test]
fn shard_dir_that_is_not_rocksdb() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bogus = tmp.path().join("shard-0");
    std::fs::create_dir(&bogus).expect("mkdir");
    std::fs::write(bogus.join("notes.txt"), "hello").expect("write");
    let list = tmp.path().join("list.bin");
    let out = run(&["--out", s(&list), "--data-dir", s(tmp.path())]);
    assert_exit(&out, INPUT, "not a sublist database");
    assert_exit(&out, INPUT, "shard-0");
    assert_exit(
        &run(&["--out", s(&list), s(&tmp.path().join("nope"))]),
        INPUT,
        "no such sublist database",
    );
    std::fs::create_dir(tmp.path().join("shard-3.bak")).expect("mkdir");
    assert_exit(
        &run(&["--out", s(&list), "--data-dir", s(tmp.path())]),
        INPUT,
        "not shard-<number>",
    );
    assert!(!list.exists());
}

#[test]
fn out_in_missing_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    three_shards(&data);
    let list = tmp.path().join("no/such/dir/list.bin");
    assert_exit(
        &run(&["--out", s(&list), "--data-dir", s(&data)]),
        USAGE,
        "does not exist",
    );
}

#[test]
fn usage_errors_exit_2() {
    let out = run(&["--out", "x.bin"]);
    assert_eq!(out.status.code(), Some(USAGE));
    let out = run(&["--out", "x.bin", "--data-dir", "d", "--part", "1"]);
    assert_eq!(out.status.code(), Some(USAGE));
    let out = run(&["--out", "x.bin", "--data-dir", "d", "--jobs", "0"]);
    assert_eq!(out.status.code(), Some(USAGE));
}

#[test]
fn duplicate_id_across_shards_leaves_no_list() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    make_shard_with(&data, 0, &[1, 5, 9], text_payload, true);
    make_shard_with(&data, 1, &[2, 5, 10], text_payload, true);
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).expect("mkdir");
    let list = out_dir.join("list.bin");
    let out = run(&["--out", s(&list), "--data-dir", s(&data)]);
    assert_exit(&out, INPUT, "duplicate id 5");
    assert_exit(&out, INPUT, "shard-0");
    assert_exit(&out, INPUT, "shard-1");
    assert_eq!(
        dir_names(&out_dir),
        Vec::<String>::new(),
        "no list.bin and no temporary file"
    );
}

#[test]
fn same_shard_twice_and_unfinished() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let a = make_shard_with(&tmp.path().join("a"), 0, &[1, 2], text_payload, true);
    let b = make_shard_with(&tmp.path().join("b"), 0, &[3], text_payload, true);
    let list = tmp.path().join("list.bin");
    assert_exit(
        &run(&["--out", s(&list), s(&a), s(&b)]),
        INPUT,
        "both hold shard 0",
    );
    let c = make_shard_with(&tmp.path().join("c"), 1, &[4, 7], text_payload, false);
    assert_exit(
        &run(&["--out", s(&list), s(&a), s(&c)]),
        INPUT,
        "is not finished",
    );
    assert!(!list.exists());
    let out = run(&["--out", s(&list), "--allow-unfinished", s(&a), s(&c)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(records_in(&list, "verify"), 4);
}

/// Every corruption of a valid list.bin gives a clear error from `merger verify`, with
/// exit code 1 and the byte offset of the problem.
#[test]
fn verify_rejects_corrupt_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let good = version_one_bytes(tmp.path());
    let footer = good.len() - 4;
    // Record 0 starts at 16: 28 fixed bytes, then the payload "item-1".
    let checksum_at_footer = format!("byte {footer}: checksum mismatch");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("payload byte", flip(&good, 16 + 28), &checksum_at_footer),
        ("shard byte", flip(&good, 16 + 8), &checksum_at_footer),
        ("checksum", flip(&good, footer + 1), "checksum mismatch"),
        (
            "truncated by 1",
            good[..good.len() - 1].to_vec(),
            "is truncated",
        ),
        (
            "truncated to 10",
            good[..10].to_vec(),
            "shorter than the 20-byte minimum",
        ),
        (
            "wrong magic",
            [&b"QLIST009"[..], &good[8..]].concat(),
            "bad magic",
        ),
        (
            "count too high",
            with_count(&good, 31),
            "header says 31 records but the records end after 30",
        ),
        (
            "count too low",
            with_count(&good, 29),
            "header says 29 records but more record bytes follow",
        ),
        (
            "id out of order",
            with_id_of_second(&good, 0),
            "byte 50: record 1 has id 0",
        ),
        (
            "long length",
            with_first_len(&good, 100_000),
            "byte 16: record 0 is truncated: its payload needs 100000 bytes",
        ),
        (
            "huge length",
            with_first_len(&good, u64::MAX),
            "byte 16: record 0 claims a payload of 18446744073709551615 bytes, above the limit",
        ),
    ];
    for (name, bytes, needle) in cases {
        let bad = tmp.path().join("bad.bin");
        std::fs::write(&bad, &bytes).expect("write");
        let out = run(&["verify", s(&bad)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(INPUT), "{name}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{name}: stderr lacks {needle:?}: {stderr}"
        );
        assert!(
            stderr.contains("is not a valid list.bin"),
            "{name}: {stderr}"
        );
        assert!(verify(&bad).is_err(), "{name}: library verify accepted it");
        // `cat` must not print a corrupt file as if it were fine.
        assert_eq!(
            run(&["cat", s(&bad)]).status.code(),
            Some(INPUT),
            "{name}: cat"
        );
    }
    assert_exit(
        &run(&["verify", s(&tmp.path().join("absent.bin"))]),
        INPUT,
        "absent.bin",
    );
}

/// The records of a valid list of either version, every check made (panics naming what
/// is wrong).
#[track_caller]
fn records_in(list: &Path, what: &str) -> u64 {
    let mut n = 0;
    for r in qformat::read_list(list).unwrap_or_else(|e| panic!("{what}: {e}")) {
        r.unwrap_or_else(|e| panic!("{what}: {e}"));
        n += 1;
    }
    n
}

/// The three shards' 30 records as a version 1 list.bin (the merger writes version 2;
/// `verify` and `cat` still read version 1, and these are its corruptions).
fn version_one_bytes(dir: &Path) -> Vec<u8> {
    let path = dir.join("v1.bin");
    let mut w = ListWriter::create(&path).expect("create v1");
    for id in 1..=30u64 {
        let r = Record {
            id,
            shard: (id % 3) as u32,
            seq: (id - 1) / 3,
            payload: text_payload(id),
        };
        w.write(&r).expect("write v1");
    }
    w.finish().expect("finish v1");
    std::fs::read(&path).expect("read v1")
}

fn flip(b: &[u8], at: usize) -> Vec<u8> {
    let mut v = b.to_vec();
    v[at] ^= 0x20;
    v
}

fn with_count(b: &[u8], n: u64) -> Vec<u8> {
    let mut v = b.to_vec();
    v[8..16].copy_from_slice(&n.to_le_bytes());
    v
}

/// Record 0 is 28 + 6 bytes ("item-1"), so record 1 starts at byte 50.
fn with_id_of_second(b: &[u8], id: u64) -> Vec<u8> {
    let mut v = b.to_vec();
    v[50..58].copy_from_slice(&id.to_le_bytes());
    v
}

fn with_first_len(b: &[u8], len: u64) -> Vec<u8> {
    let mut v = b.to_vec();
    v[16 + 20..16 + 28].copy_from_slice(&len.to_le_bytes());
    v
}

/// kill -9 in the middle of a big merge: no list.bin appears under the final name, and an
/// older list.bin already there is left intact. The merger is told (test hook) to stall
/// after 30,000 records, so the kill lands mid-merge on any machine, without timing luck.
#[test]
fn kill_9_mid_merge_leaves_no_partial_list() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let payload = |id: u64| vec![(id % 251) as u8; 500];
    for s in 0..4u32 {
        let ids: Vec<u64> = (0..20_000u64).map(|i| i * 4 + u64::from(s) + 1).collect();
        make_shard_with(&data, s, &ids, payload, true);
    }
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&out_dir).expect("mkdir");
    let list = out_dir.join("list.bin");

    for old_list in [false, true] {
        if old_list {
            let old = make_shard_with(&tmp.path().join("old"), 9, &[7], text_payload, true);
            let out = run(&["--out", s(&list), s(&old)]);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let before = std::fs::read(&list).ok();
        let mut child = Command::new(MERGER)
            .args(["--out", s(&list), "--data-dir", s(&data)])
            .env("QLIST_MERGER_TEST_STALL_AFTER", "30000")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn merger");
        let stderr = child.stderr.take().expect("piped stderr");
        let mut stalled = false;
        for line in BufReader::new(stderr).lines() {
            let line = line.expect("read merger stderr");
            if line.contains("stalling until killed") {
                stalled = true;
                break;
            }
        }
        assert!(stalled, "merger exited before reaching the stall point");
        let tmp_files: Vec<String> = dir_names(&out_dir)
            .into_iter()
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(
            !tmp_files.is_empty(),
            "the merge should be writing a temporary file"
        );
        child.kill().expect("kill -9 the merger by its pid"); // SIGKILL on Unix
        let status = child.wait().expect("wait");
        assert!(!status.success());
        assert_eq!(
            std::fs::read(&list).ok(),
            before,
            "list.bin changed by a killed merge"
        );
        if let Some(before) = before {
            assert!(!before.is_empty());
            assert_eq!(records_in(&list, "old list.bin still valid"), 1);
        }
    }

    // A fresh run ignores the killed runs' leftovers and completes.
    let out = run(&["--out", s(&list), "--data-dir", s(&data)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(records_in(&list, "verify"), 80_000);
}

/// `--out` inside an input sublist (or spelled to reach one through a symlink or
/// `..`), or named like a sublist in the data dir, used to succeed and destroy the input.
#[test]
fn out_that_would_destroy_an_input_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let shards = three_shards(&data);
    let current = std::fs::read(data.join("shard-0/CURRENT")).expect("read CURRENT");
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(data.join("shard-1"), &link).expect("symlink");
    let before = dir_names(&data);

    let inside = "is inside the input sublist";
    let named = "is a sublist's name in the data dir";
    let dd = ["--data-dir", s(&data)];
    let cases: Vec<(PathBuf, Vec<&str>, &str)> = vec![
        (data.join("shard-0/CURRENT"), dd.to_vec(), inside),
        (data.join("shard-9"), dd.to_vec(), named),
        (data.join(".creating-shard-9"), dd.to_vec(), named),
        (link.join("CURRENT"), dd.to_vec(), inside),
        (data.join("shard-2/../shard-1/LOG"), dd.to_vec(), inside),
        (data.join("shard-0/list.bin"), vec![s(&shards[0])], inside),
        (
            data.join("shard-7"),
            vec![s(&shards[0]), s(&shards[1])],
            named,
        ),
    ];
    for (out, args, needle) in cases {
        let mut all = vec!["--out", s(&out)];
        all.extend(args);
        let res = run(&all);
        assert_exit(&res, USAGE, needle);
        assert_exit(&res, USAGE, "refusing --out");
    }
    assert_eq!(
        std::fs::read(data.join("shard-0/CURRENT")).expect("read CURRENT"),
        current,
        "CURRENT was overwritten"
    );
    assert_eq!(dir_names(&data), before, "the data dir changed");
    for shard in &shards {
        assert!(
            !dir_names(shard).iter().any(|n| n.contains("list.bin")),
            "a list.bin or temporary file landed in {}",
            shard.display()
        );
    }

    // A list.bin with an ordinary name may live in the data dir, and D still merges.
    let list = data.join("list.bin");
    let ok = run(&["--out", s(&list), "--data-dir", s(&data)]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let again = run(&["--out", s(&list), "--data-dir", s(&data)]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(records_in(&list, "verify"), 30);
}

/// A producer killed while creating its sublist leaves only
/// `.creating-shard-<n>`; merging the data dir without a word about shard n dropped it.
#[test]
fn a_sublist_that_was_never_created_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    three_shards(&data);
    // Exactly what a kill between creation and rename leaves: the database under its
    // temporary name, no `shard-1`.
    std::fs::rename(data.join("shard-1"), data.join(".creating-shard-1")).expect("rename");
    let list = tmp.path().join("list.bin");

    let out = run(&["--out", s(&list), "--data-dir", s(&data)]);
    for needle in [
        "shard 1 has no sublist",
        ".creating-shard-1",
        "run the producer of shard 1 again",
        "--allow-unfinished",
    ] {
        assert_exit(&out, INPUT, needle);
    }
    assert!(!list.exists(), "list.bin written without shard 1");

    let out = run(&[
        "--out",
        s(&list),
        "--data-dir",
        s(&data),
        "--allow-unfinished",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("without shard 1"), "no warning: {stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("merged 20 items from 2 shards"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // A leftover next to a complete shard-<n> (a lost creation race) is harmless.
    std::fs::rename(data.join(".creating-shard-1"), data.join("shard-1")).expect("rename");
    std::fs::create_dir(data.join(".creating-shard-0")).expect("mkdir");
    let out = run(&["--out", s(&list), "--data-dir", s(&data)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(records_in(&list, "verify"), 30);
}

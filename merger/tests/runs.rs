//! The `merger` binary on runs in a directory: runs from sublists, merges of merges,
//! the checks across inputs, corrupt runs, and merges split into parts (`--part`,
//! `--jobs`, `merger verify` of parts). The same against a real S3 server: tests/s3.rs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;

/// `merger --out OUT --runs RUNS`, then `more`.
fn merge_runs(out: &Path, runs: &Path, more: &[&str]) -> Output {
    let mut args = vec!["--out", s(out), "--runs", s(runs)];
    args.extend_from_slice(more);
    merger(&args)
}

/// `shards` sublists of `items` items in all under `tmp`/data, sealed into runs in
/// `tmp`/runs: the sublists and the runs directory.
fn sealed_shards(tmp: &Path, shards: u32, items: u64) -> (Vec<PathBuf>, PathBuf) {
    let subs = make_shards(&tmp.join("data"), shards, items);
    let runs = tmp.join("runs");
    seal_all(&subs, &runs);
    (subs, runs)
}

/// The arguments of `merger verify` of `parts`, in that order.
fn verify_args(parts: &[PathBuf]) -> Vec<&str> {
    std::iter::once("verify")
        .chain(parts.iter().map(|p| s(p)))
        .collect()
}

#[test]
fn runs_merge_to_the_same_list_as_sublists_and_merges_compose() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let subs = make_shards(&data, 4, 20_000);
    let direct = tmp.path().join("direct.bin");
    let stdout = ok(&merger(&[
        "--out",
        s(&direct),
        "--data-dir",
        s(&data),
        "--expect-shards",
        "4",
    ]));
    assert!(
        stdout.contains("merged 20000 items from 4 shards"),
        "{stdout}"
    );
    let runs = tmp.path().join("runs");
    seal_all(&subs, &runs);
    let from_runs = tmp.path().join("from-runs.bin");
    ok(&merge_runs(&from_runs, &runs, &["--expect-shards", "4"]));
    let expected = cat(&[&direct]);
    assert_eq!(expected.len(), 20_000);
    assert_eq!(cat(&[&from_runs]), expected);
    // The same list, the same bytes: a merge is deterministic.
    assert_eq!(
        std::fs::read(&direct).expect("read"),
        std::fs::read(&from_runs).expect("read")
    );
    // A merge of merges, with a mix of a run, a sublist and a run file.
    let m01 = tmp.path().join("m01.bin");
    ok(&merger(&[
        "--out",
        s(&m01),
        s(&runs.join("shard-0.bin")),
        s(&subs[1]),
    ]));
    let m23 = tmp.path().join("m23.bin");
    ok(&merger(&["--out", s(&m23), s(&subs[2]), s(&subs[3])]));
    let both = tmp.path().join("both.bin");
    ok(&merger(&[
        "--out",
        s(&both),
        s(&m01),
        s(&m23),
        "--expect-shards",
        "4",
    ]));
    assert_eq!(cat(&[&both]), expected);
    let v = ok(&merger(&["verify", s(&both)]));
    assert!(v.contains("OK: 20000 records"), "{v}");
    // The library's own reader agrees, record for record.
    let mut n = 0;
    for r in qformat::read_list(&both).expect("open") {
        r.expect("record");
        n += 1;
    }
    assert_eq!(n, 20_000);
}

#[test]
fn inputs_are_checked_across_each_other() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (subs, runs) = sealed_shards(tmp.path(), 3, 3000);
    let out = tmp.path().join("out.bin");
    let run0 = runs.join("shard-0.bin");
    // A shard in two inputs: a run and the sublist it came from.
    fails(
        &merger(&["--out", s(&out), s(&run0), s(&subs[0])]),
        INPUT,
        &["both hold shard 0", "shard-0.bin", s(&subs[0])],
    );
    // --expect-shards: a missing shard, and an extra one.
    let e = fails(
        &merge_runs(&out, &runs, &["--expect-shards", "5"]),
        INPUT,
        &["--expect-shards 5", "missing from every input: 3, 4"],
    );
    assert!(!e.contains("incomplete"), "{e}");
    fails(
        &merge_runs(&out, &runs, &["--expect-shards", "2"]),
        INPUT,
        &["2 (", "beyond --expect-shards"],
    );
    // An unfinished sublist, merged with --allow-unfinished, is an incomplete shard.
    let unfinished = make_shard(&tmp.path().join("u"), 3, &[100_000, 100_001], false);
    let partial = tmp.path().join("partial.bin");
    ok(&merger(&[
        "--out",
        s(&partial),
        "--allow-unfinished",
        s(&unfinished),
    ]));
    fails(
        &merge_runs(&out, &runs, &[s(&partial), "--expect-shards", "4"]),
        INPUT,
        &["not finished"],
    );
    fails(
        &merge_runs(
            &out,
            &runs,
            &[s(&partial), "--allow-unfinished", "--expect-shards", "4"],
        ),
        INPUT,
        &["incomplete", "3 (", "partial.bin"],
    );
    // An empty --runs directory, a missing one.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    fails(
        &merge_runs(&out, &empty, &[]),
        INPUT,
        &["no runs found", s(&empty)],
    );
    fails(
        &merge_runs(&out, &tmp.path().join("nope"), &[]),
        INPUT,
        &["nope"],
    );
    // --out among the runs it reads, or onto an input run.
    fails(
        &merge_runs(&runs.join("all.bin"), &runs, &[]),
        USAGE,
        &["lands among the runs"],
    );
    fails(
        &merger(&["--out", s(&run0), s(&run0)]),
        USAGE,
        &["refusing --out"],
    );
    assert!(!out.exists(), "a failed merge left {}", out.display());
    // A version 1 list.bin is no input.
    let v1 = tmp.path().join("v1.bin");
    let w = qformat::listbin::ListWriter::create(&v1).expect("v1");
    w.finish().expect("finish v1");
    fails(
        &merger(&["--out", s(&out), s(&v1)]),
        INPUT,
        &["version 1 list.bin", "v1.bin"],
    );
    // Bad spellings of an S3 location are usage errors.
    fails(
        &merger(&["--out", "gs://bucket/x.bin", s(&run0)]),
        USAGE,
        &["gs://"],
    );
    fails(
        &merger(&["--out", s(&out), "--runs", "s3://"]),
        USAGE,
        &["s3://"],
    );
    fails(
        &merger(&["--out", s(&out), s(&run0), "--part", "4/4"]),
        USAGE,
        &["4/4"],
    );
}

#[test]
fn a_corrupt_run_is_named_with_the_offset() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_, runs) = sealed_shards(tmp.path(), 2, 5000);
    let good = std::fs::read(runs.join("shard-1.bin")).expect("read");
    let meta = qformat::run::RunMeta::decode(good.len() as u64, &good).expect("meta");
    assert!(meta.blocks.len() >= 2, "want several blocks");
    let block1 = meta.blocks[1];
    let out = tmp.path().join("out.bin");
    let bad = runs.join("shard-1.bin");
    let cases: Vec<(&str, Vec<u8>, String)> = vec![
        (
            "a flipped payload byte",
            {
                let mut b = good.clone();
                b[block1.offset as usize + 40] ^= 1;
                b
            },
            format!(
                "byte {}: block 1 checksum mismatch",
                block1.offset + u64::from(block1.len) - 4
            ),
        ),
        (
            "truncated",
            good[..good.len() - 100].to_vec(),
            "bad magic".to_string(),
        ),
        (
            "cut to 50 bytes",
            good[..50].to_vec(),
            "shorter than the 80-byte minimum".to_string(),
        ),
        (
            "a flipped index byte",
            {
                let mut b = good.clone();
                b[meta.footer.index_offset as usize + 3] ^= 0x10;
                b
            },
            "metadata checksum mismatch".to_string(),
        ),
    ];
    for (name, bytes, needle) in cases {
        std::fs::write(&bad, &bytes).expect("write");
        let e = fails(
            &merge_runs(&out, &runs, &[]),
            INPUT,
            &[&needle, "shard-1.bin"],
        );
        assert!(
            e.contains("no list.bin written") || e.contains("nothing written"),
            "{name}: {e}"
        );
        assert!(!out.exists(), "{name}: a failed merge left its output");
        fails(&merger(&["verify", s(&bad)]), INPUT, &[&needle]);
        assert_eq!(
            merger(&["cat", s(&bad)]).status.code(),
            Some(INPUT),
            "{name}: cat"
        );
    }
    assert_eq!(
        names(tmp.path()),
        vec!["data", "runs"],
        "temporary files left behind"
    );
}

/// Every K in 1..=8: the K parts as separate processes, verified as one list, are the
/// records of one merge; parts out of order or missing are refused by name.
#[test]
fn parts_are_the_list_in_order() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_, runs) = sealed_shards(tmp.path(), 5, 60_000);
    let whole = tmp.path().join("whole.bin");
    ok(&merge_runs(&whole, &runs, &[]));
    let expected = cat(&[&whole]);
    for k in 1..=8u32 {
        let dir = tmp.path().join(format!("k{k}"));
        std::fs::create_dir(&dir).expect("mkdir");
        let parts: Vec<PathBuf> = (0..k)
            .map(|i| {
                let out = dir.join(format!("part-{i}.bin"));
                ok(&merge_runs(&out, &runs, &["--part", &format!("{i}/{k}")]));
                out
            })
            .collect();
        let refs: Vec<&Path> = parts.iter().map(PathBuf::as_path).collect();
        assert_eq!(cat(&refs), expected, "k={k}");
        let args = verify_args(&parts);
        let v = ok(&merger(&args));
        assert!(v.contains("OK: 60000 records"), "k={k}: {v}");
        if k >= 3 {
            let mut swapped = args.clone();
            swapped.swap(1, 2);
            // `cat` prints what it reads, but not parts out of order as a list.
            let mut cat_swapped = swapped.clone();
            cat_swapped[0] = "cat";
            if !cat(&[&parts[0]]).is_empty() && !cat(&[&parts[1]]).is_empty() {
                fails(
                    &merger(&cat_swapped),
                    INPUT,
                    &["not the parts of one list in order"],
                );
            }
            fails(
                &merger(&swapped),
                INPUT,
                &["part-1.bin", "is part 1/", "given as file 1"],
            );
            let mut missing = args.clone();
            missing.remove(2);
            fails(&merger(&missing), INPUT, &["part-2.bin"]);
            let mut last_missing = args.clone();
            last_missing.pop();
            fails(
                &merger(&last_missing),
                INPUT,
                &[&format!("part {} is missing", k - 1)],
            );
        }
    }
}

/// A part reads only its range of each run, shown by corruption it would meet otherwise.
/// With the last blocks of two runs corrupt (blocks whose IDs are all beyond part 0 of 4),
/// part 0 still succeeds and gives the same bytes as before. With their first blocks
/// corrupt too (IDs all below parts 1 and 2), parts 1 and 2 still give the same bytes as
/// before: a part k > 0 that read a run from its start and dropped the IDs below its range
/// would fail, as would a part that read whole runs. The whole merge, part 0 and part 3,
/// which read those blocks, fail on their checksums, naming the run and the block.
#[test]
fn a_part_reads_only_its_range() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_, runs) = sealed_shards(tmp.path(), 3, 60_000);
    let run_meta =
        |bytes: &[u8]| qformat::run::RunMeta::decode(bytes.len() as u64, bytes).expect("meta");
    // Each part merged from clean runs, and its ID range (from its footer).
    let clean: Vec<PathBuf> = (0..4)
        .map(|k| {
            let out = tmp.path().join(format!("clean-part-{k}.bin"));
            ok(&merge_runs(&out, &runs, &["--part", &format!("{k}/4")]));
            out
        })
        .collect();
    let ranges: Vec<qformat::run::Part> = clean
        .iter()
        .map(|p| run_meta(&std::fs::read(p).expect("read part")).part())
        .collect();
    for (k, part) in clean.iter().enumerate().take(3) {
        assert!(
            !cat(&[part.as_path()]).is_empty(),
            "part {k} of 4 holds records"
        );
    }
    // (run, block, what an error about it says)
    let mut crc_errors: Vec<(PathBuf, usize, String)> = Vec::new();
    let mut corrupt = |path: &Path, n: usize| {
        let mut bytes = std::fs::read(path).expect("read run");
        let b = run_meta(&bytes).blocks[n];
        bytes[b.offset as usize + 30] ^= 0x40;
        std::fs::write(path, &bytes).expect("corrupt run");
        let at = format!(
            "byte {}: block {n} checksum mismatch",
            b.offset + u64::from(b.len) - 4
        );
        crc_errors.push((path.to_path_buf(), n, at));
    };
    let same = |k: usize, out: &Path| {
        assert!(
            std::fs::read(out).expect("part") == std::fs::read(&clean[k]).expect("clean part"),
            "part {k} changed with blocks outside its range corrupt"
        );
    };
    // The last block of two runs: beyond part 0.
    let shards = [0, 2];
    let mut lasts = Vec::new();
    for shard in shards {
        let path = runs.join(format!("shard-{shard}.bin"));
        let meta = run_meta(&std::fs::read(&path).expect("read run"));
        assert!(meta.blocks.len() >= 4, "want several blocks per run");
        let n = meta.blocks.len() - 1;
        let b = meta.blocks[n];
        assert!(
            b.first_id > ranges[0].last_id,
            "block {n} of shard {shard} (IDs {}..={}) is outside part 0 (IDs up to {})",
            b.first_id,
            b.last_id,
            ranges[0].last_id
        );
        corrupt(&path, n);
        lasts.push(n);
    }
    let part = tmp.path().join("part-0.bin");
    ok(&merge_runs(&part, &runs, &["--part", "0/4"]));
    same(0, &part);
    // The first block of the same runs: below parts 1 and 2, whose ranges also end below
    // the last blocks.
    for (shard, n) in shards.into_iter().zip(lasts) {
        let path = runs.join(format!("shard-{shard}.bin"));
        let meta = run_meta(&std::fs::read(&path).expect("read run"));
        let (lo, hi) = (meta.blocks[0], meta.blocks[n]);
        for r in &ranges[1..3] {
            assert!(
                lo.last_id < r.first_id && hi.first_id > r.last_id,
                "blocks 0 (IDs {}..={}) and {n} (IDs {}..={}) of shard {shard} are not both \
                 outside part {} (IDs {}..={})",
                lo.first_id,
                lo.last_id,
                hi.first_id,
                hi.last_id,
                r.index,
                r.first_id,
                r.last_id
            );
        }
        corrupt(&path, 0);
    }
    for k in [1, 2] {
        let part = tmp.path().join(format!("part-{k}.bin"));
        ok(&merge_runs(&part, &runs, &["--part", &format!("{k}/4")]));
        same(k, &part);
    }
    // Whichever corrupt block a merge reaches first: it names that run and that block
    // (for a part, one of the blocks in its range: `first` or the last ones).
    let named = |stderr: &str, first: Option<bool>| {
        crc_errors.iter().any(|(path, n, at)| {
            first.is_none_or(|first| first == (*n == 0))
                && stderr.contains(s(path))
                && stderr.contains(at.as_str())
        })
    };
    let whole = tmp.path().join("whole.bin");
    let e = fails(
        &merge_runs(&whole, &runs, &[]),
        INPUT,
        &["checksum mismatch"],
    );
    assert!(named(&e, None), "{e}");
    let first = tmp.path().join("part-0-corrupt.bin");
    let e = fails(
        &merge_runs(&first, &runs, &["--part", "0/4"]),
        INPUT,
        &["checksum mismatch"],
    );
    assert!(named(&e, Some(true)), "{e}");
    let last = tmp.path().join("part-3.bin");
    let e = fails(
        &merge_runs(&last, &runs, &["--part", "3/4"]),
        INPUT,
        &["checksum mismatch"],
    );
    assert!(named(&e, Some(false)), "{e}");
    assert!(
        !whole.exists() && !first.exists() && !last.exists(),
        "a failed merge left output"
    );
}

#[test]
fn a_part_may_be_empty_and_parts_need_runs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let subs = vec![make_shard(&data, 0, &[10, 11, 12], true)];
    let runs = tmp.path().join("runs");
    seal_all(&subs, &runs);
    let parts: Vec<PathBuf> = (0..4)
        .map(|i| {
            let out = tmp.path().join(format!("p{i}.bin"));
            ok(&merge_runs(&out, &runs, &["--part", &format!("{i}/4")]));
            out
        })
        .collect();
    let counts: Vec<usize> = parts.iter().map(|p| cat(&[p]).len()).collect();
    assert_eq!(counts.iter().sum::<usize>(), 3);
    assert!(
        counts.contains(&0),
        "one block of 3 items in 4 parts: {counts:?}"
    );
    ok(&merger(&verify_args(&parts)));
    fails(
        &merger(&[
            "--out",
            s(&tmp.path().join("x.bin")),
            "--data-dir",
            s(&data),
            "--part",
            "0/2",
        ]),
        INPUT,
        &["is a RocksDB sublist", "seal it first"],
    );
    fails(
        &merge_runs(
            &tmp.path().join("x.bin"),
            &runs,
            &["--part", "0/2", "--jobs", "2"],
        ),
        USAGE,
        &["cannot be combined"],
    );
}

#[test]
fn jobs_write_the_list_one_merge_writes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_, runs) = sealed_shards(tmp.path(), 4, 50_000);
    let whole = tmp.path().join("whole.bin");
    ok(&merge_runs(&whole, &runs, &[]));
    let expected = cat(&[&whole]);
    let whole_bytes = std::fs::read(&whole).expect("read");
    for j in 1..=4 {
        let out = tmp.path().join(format!("jobs-{j}.bin"));
        ok(&merge_runs(&out, &runs, &["--jobs", &j.to_string()]));
        assert_eq!(cat(&[&out]), expected, "--jobs {j}");
        ok(&merger(&["verify", s(&out)]));
        // Not only the same records: the same bytes, blocks and index included.
        assert!(
            std::fs::read(&out).expect("read") == whole_bytes,
            "--jobs {j} wrote other bytes than one merge"
        );
    }
    // No temporary file of the jobs is left (they are anonymous).
    let left: Vec<String> = names(tmp.path())
        .into_iter()
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `--jobs J` merges its J ranges each on a thread of its own: the merger reports how
/// many distinct threads merged ranges, counted by thread ID where each range is merged
/// (no timing). Ranges merged one after another on the calling thread would report 1
/// thread, which the byte-for-byte test above cannot tell apart.
#[test]
fn jobs_merge_their_ranges_on_as_many_threads() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_, runs) = sealed_shards(tmp.path(), 4, 50_000);
    for j in 2..=4 {
        let out = tmp.path().join(format!("jobs-{j}.bin"));
        let done = Command::new(MERGER)
            .args([
                "--out",
                s(&out),
                "--runs",
                s(&runs),
                "--jobs",
                &j.to_string(),
            ])
            .env("RUST_LOG", "info")
            .output()
            .expect("run merger");
        ok(&done);
        let stderr = String::from_utf8_lossy(&done.stderr);
        let want = format!("--jobs: {j} ranges merged by {j} threads");
        assert!(stderr.contains(&want), "want {want:?} in: {stderr}");
    }
}

/// Records longer than a block cannot be placed in advance: `--jobs` merges them with one
/// thread, says so, and still writes the bytes one merge writes.
#[test]
fn jobs_with_records_longer_than_a_block_fall_back_to_one_thread() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let big = |id: u64| vec![b'a' + (id % 26) as u8; 300_000 + (id % 7) as usize * 1000];
    let subs: Vec<PathBuf> = (0..2u32)
        .map(|s| {
            let ids: Vec<u64> = (1..=40u64).filter(|i| i % 2 == u64::from(s)).collect();
            make_shard_with(&data, s, &ids, big, true)
        })
        .collect();
    let runs = tmp.path().join("runs");
    seal_all(&subs, &runs);
    let whole = tmp.path().join("whole.bin");
    ok(&merge_runs(&whole, &runs, &[]));
    let out = tmp.path().join("jobs.bin");
    let done = Command::new(MERGER)
        .args(["--out", s(&out), "--runs", s(&runs), "--jobs", "3"])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run merger");
    ok(&done);
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert!(stderr.contains("merging with one thread"), "{stderr}");
    assert!(std::fs::read(&out).expect("read") == std::fs::read(&whole).expect("read"));
}

/// kill -9 of a part process leaves no part file; running it again completes the list.
#[test]
fn a_killed_part_leaves_nothing_and_reruns() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_, runs) = sealed_shards(tmp.path(), 3, 40_000);
    let dir = tmp.path().join("parts");
    std::fs::create_dir(&dir).expect("mkdir");
    let part = |i: u32| dir.join(format!("part-{i}.bin"));
    ok(&merge_runs(&part(0), &runs, &["--part", "0/2"]));
    let mut child = Command::new(MERGER)
        .args(["--out", s(&part(1)), "--runs", s(&runs), "--part", "1/2"])
        .env("QLIST_MERGER_TEST_STALL_AFTER", "5000")
        .env("RUST_LOG", "warn")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn merger");
    let stderr = child.stderr.take().expect("stderr");
    let stalled = std::io::BufRead::lines(std::io::BufReader::new(stderr))
        .map_while(Result::ok)
        .any(|l| l.contains("stalling until killed"));
    assert!(stalled, "the part exited before its stall point");
    child.kill().expect("kill -9 by pid");
    assert!(!child.wait().expect("wait").success());
    assert!(!part(1).exists(), "a killed part left its output");
    assert_eq!(
        names(&dir)
            .into_iter()
            .filter(|n| n.ends_with(".bin"))
            .count(),
        1
    );
    ok(&merge_runs(&part(1), &runs, &["--part", "1/2"]));
    let v = ok(&merger(&["verify", s(&part(0)), s(&part(1))]));
    assert!(v.contains("OK: 40000 records in 2 parts"), "{v}");
}

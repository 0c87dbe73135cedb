//! The `merger` binary with runs and outputs in a real S3 server (SeaweedFS, started by
//! `testkit::s3::TestS3` on loopback and stopped on drop): the same lists as from a
//! directory, parts, and the faults: a missing, truncated, bit-flipped or replaced object,
//! wrong credentials, an empty prefix, a missing shard, and the server killed and
//! restarted in the middle of a merge that reads from it and writes to it.

mod common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use common::*;
use testkit::s3::TestS3;
use testkit::ChildGuard;

/// The merger with the server's credentials in its environment.
fn merger_s3(s3: &TestS3, args: &[&str]) -> Output {
    Command::new(MERGER)
        .args(args)
        .envs(s3.env())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run merger")
}

/// Sublists sealed (by a merge of each alone) into `s3://bucket/runs/shard-<n>.bin`, and
/// the same runs in a local directory; returns that directory.
fn runs_in_both(s3: &TestS3, tmp: &Path, shards: u32, n: u64) -> PathBuf {
    let subs = make_shards(&tmp.join("data"), shards, n);
    let runs = tmp.join("runs");
    seal_all(&subs, &runs);
    for (i, sub) in subs.iter().enumerate() {
        let url = s3.url(&format!("runs/shard-{i}.bin"));
        ok(&merger_s3(s3, &["--out", &url, s(sub)]));
        let local = std::fs::read(runs.join(format!("shard-{i}.bin"))).expect("read run");
        assert_eq!(
            s3.get(&format!("runs/shard-{i}.bin")),
            Some(local),
            "sealing is deterministic"
        );
    }
    runs
}

/// A merger run in the background, stalled after `after` records (for `ms`, or, with
/// `None`, until killed); and what it writes on stderr after the stall announcement (all
/// of it once it exits; each line is also printed).
fn stalled_merger(
    s3: &TestS3,
    args: &[&str],
    after: u64,
    ms: Option<u64>,
) -> (Child, std::thread::JoinHandle<String>) {
    let mut cmd = Command::new(MERGER);
    if let Some(ms) = ms {
        cmd.env("QLIST_MERGER_TEST_STALL_MS", ms.to_string());
    }
    let mut child = cmd
        .args(args)
        .envs(s3.env())
        .env("QLIST_MERGER_TEST_STALL_AFTER", after.to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn merger");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = std::io::BufReader::new(stderr).lines();
    let stalled = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("stalling for") || l.contains("stalling until killed"));
    assert!(stalled, "the merger exited before its stall point");
    // Keep draining stderr so the child never blocks on a full pipe.
    let rest = std::thread::spawn(move || {
        let mut all = String::new();
        for l in lines.map_while(Result::ok) {
            eprintln!("merger: {l}");
            all.push_str(&l);
            all.push('\n');
        }
        all
    });
    (child, rest)
}

#[test]
fn runs_in_s3_merge_like_runs_in_a_directory() {
    let s3 = TestS3::start("lists");
    let tmp = tempfile::tempdir().expect("tempdir");
    let runs = runs_in_both(&s3, tmp.path(), 4, 30_000);
    let local = tmp.path().join("local.bin");
    ok(&merger(&[
        "--out",
        s(&local),
        "--runs",
        s(&runs),
        "--expect-shards",
        "4",
    ]));
    let expected = cat(&[&local]);
    // From S3 to S3, and from S3 to a file: the same bytes as from the directory.
    let out_url = s3.url("out/list.bin");
    ok(&merger_s3(
        &s3,
        &[
            "--runs",
            &s3.url("runs"),
            "--expect-shards",
            "4",
            "--out",
            &out_url,
        ],
    ));
    assert_eq!(
        s3.get("out/list.bin"),
        Some(std::fs::read(&local).expect("read"))
    );
    let v = ok(&merger_s3(&s3, &["verify", &out_url]));
    assert!(v.contains("OK: 30000 records"), "{v}");
    // --jobs into S3: the ranges after the first go through a temporary file, and the
    // object holds the bytes one merge writes.
    let jobs_url = s3.url("out/jobs.bin");
    ok(&merger_s3(
        &s3,
        &["--runs", &s3.url("runs"), "--jobs", "3", "--out", &jobs_url],
    ));
    assert_eq!(
        s3.get("out/jobs.bin"),
        Some(std::fs::read(&local).expect("read"))
    );
    let from_s3 = tmp.path().join("from-s3.bin");
    ok(&merger_s3(
        &s3,
        &["--runs", &s3.url("runs/"), "--out", s(&from_s3)],
    ));
    assert_eq!(cat(&[&from_s3]), expected);
    // Parts from S3 into S3, K = 1..=8 separate processes, verified and read as one list.
    for k in 1..=8u32 {
        let parts: Vec<String> = (0..k)
            .map(|i| {
                let url = s3.url(&format!("k{k}/part-{i}.bin"));
                let part = format!("{i}/{k}");
                ok(&merger_s3(
                    &s3,
                    &["--runs", &s3.url("runs"), "--part", &part, "--out", &url],
                ));
                url
            })
            .collect();
        let mut args = vec!["verify"];
        args.extend(parts.iter().map(String::as_str));
        let v = ok(&merger_s3(&s3, &args));
        assert!(v.contains("OK: 30000 records"), "k={k}: {v}");
        args[0] = "cat";
        args.insert(1, "--json");
        let text = ok(&merger_s3(&s3, &args));
        assert_eq!(
            text.lines().map(str::to_string).collect::<Vec<_>>(),
            expected,
            "k={k}"
        );
    }
    assert!(
        s3.multipart_uploads().is_empty(),
        "uploads left open: {:?}",
        s3.multipart_uploads()
    );
}

#[test]
fn bad_objects_are_named() {
    let s3 = TestS3::start("bad");
    let tmp = tempfile::tempdir().expect("tempdir");
    runs_in_both(&s3, tmp.path(), 2, 8000);
    let out = tmp.path().join("out.bin");
    let run1 = s3.url("runs/shard-1.bin");
    // A missing object, an empty prefix, a shard missing.
    fails(
        &merger_s3(&s3, &["--out", s(&out), &s3.url("runs/shard-9.bin")]),
        INPUT,
        &["s3://bad/runs/shard-9.bin"],
    );
    fails(
        &merger_s3(&s3, &["--out", s(&out), "--runs", &s3.url("nothing-here")]),
        INPUT,
        &["no runs found", "s3://bad/nothing-here"],
    );
    fails(
        &merger_s3(
            &s3,
            &[
                "--out",
                s(&out),
                "--runs",
                &s3.url("runs"),
                "--expect-shards",
                "3",
            ],
        ),
        INPUT,
        &["missing from every input: 2"],
    );
    // Truncated and bit-flipped objects: the error names the object and the offset.
    let good = s3.get("runs/shard-1.bin").expect("run");
    let meta = qformat::run::RunMeta::decode(good.len() as u64, &good).expect("meta");
    let b = meta.blocks[0];
    let mut flipped = good.clone();
    flipped[b.offset as usize + 30] ^= 0x40;
    s3.put("runs/shard-1.bin", &flipped);
    let crc_at = format!(
        "byte {}: block 0 checksum mismatch",
        b.offset + u64::from(b.len) - 4
    );
    fails(
        &merger_s3(&s3, &["--out", s(&out), "--runs", &s3.url("runs")]),
        INPUT,
        &[&run1, &crc_at],
    );
    fails(
        &merger_s3(&s3, &["verify", &run1]),
        INPUT,
        &[&run1, &crc_at],
    );
    s3.put("runs/shard-1.bin", &good[..good.len() - 7]);
    fails(
        &merger_s3(&s3, &["--out", s(&out), "--runs", &s3.url("runs")]),
        INPUT,
        &[&run1, "bad magic"],
    );
    assert!(!out.exists(), "a failed merge left {}", out.display());
    // Wrong credentials: a clear error, no secret.
    let secret = "wrong-secret-sentinel-4711";
    let denied = Command::new(MERGER)
        .args(["--out", s(&out), "--runs", &s3.url("runs")])
        .envs(s3.env())
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("RUST_LOG", "debug")
        .output()
        .expect("run merger");
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(!denied.status.success(), "{stderr}");
    assert!(stderr.contains("s3://bad/runs"), "{stderr}");
    assert!(
        stderr.to_lowercase().contains("denied") || stderr.contains("AWS_SECRET_ACCESS_KEY"),
        "{stderr}"
    );
    assert!(!stderr.contains(secret) && !String::from_utf8_lossy(&denied.stdout).contains(secret));
    let help = ok(&merger(&["--help"]));
    assert!(help.contains("AWS_SECRET_ACCESS_KEY") && !help.contains(secret));
}

/// A run replaced while a merge reads it: the ETag check fails the merge.
#[test]
fn an_object_replaced_mid_merge_fails_the_merge() {
    let s3 = TestS3::start("swap");
    let tmp = tempfile::tempdir().expect("tempdir");
    // Runs of ~40 MB each: more than the reads a merge keeps in flight (4 x 4 MiB a run).
    runs_in_both(&s3, tmp.path(), 2, 600_000);
    let out = s3.url("out/list.bin");
    let (mut child, stderr) = stalled_merger(
        &s3,
        &["--runs", &s3.url("runs"), "--out", &out],
        5000,
        Some(1500),
    );
    let replacement = s3.get("runs/shard-0.bin").expect("run");
    s3.put("runs/shard-0.bin", &replacement); // same bytes, a new version: a new ETag
    let status = child.wait().expect("wait");
    let stderr = stderr.join().expect("stderr reader");
    assert_eq!(status.code(), Some(INPUT), "the merge must fail: {stderr}");
    // The error names the object and says that it changed.
    assert!(
        stderr.contains("error: ")
            && stderr.contains("s3://swap/runs/shard-0.bin changed while it was being read"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        s3.get("out/list.bin"),
        None,
        "a failed merge left its output"
    );
    assert!(
        s3.multipart_uploads().is_empty(),
        "{:?}",
        s3.multipart_uploads()
    );
}

/// The server killed in the middle of a merge that reads runs from it and writes the
/// list to it, restarted a second later: the merge retries within its deadline and
/// completes; nothing partial is visible at any time.
#[test]
fn the_server_killed_and_restarted_mid_merge() {
    let mut s3 = TestS3::start("restart");
    let tmp = tempfile::tempdir().expect("tempdir");
    let runs = runs_in_both(&s3, tmp.path(), 3, 300_000);
    let local = tmp.path().join("local.bin");
    ok(&merger(&["--out", s(&local), "--runs", s(&runs)]));
    let out = s3.url("out/list.bin");
    let (child, _stderr) = stalled_merger(
        &s3,
        &[
            "--runs",
            &s3.url("runs"),
            "--out",
            &out,
            "--store-deadline-secs",
            "60",
        ],
        50_000,
        Some(500),
    );
    s3.kill();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    s3.restart();
    assert_eq!(
        s3.get("out/list.bin"),
        None,
        "visible before the merge finished"
    );
    let done = child.wait_with_output().expect("wait");
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stdout)
    );
    assert_eq!(
        s3.get("out/list.bin"),
        Some(std::fs::read(&local).expect("read"))
    );
}

/// The server killed while a merge's output is a multipart upload with parts uploaded
/// (and more in flight), the merger killed too, the server restarted: nothing is
/// visible (no object at the output's key, none anywhere), only the incomplete upload,
/// which is no object; the rerun completes the list, byte for byte.
#[test]
fn the_server_killed_mid_multipart_output_then_the_rerun_completes() {
    let mut s3 = TestS3::start("mpout");
    let tmp = tempfile::tempdir().expect("tempdir");
    // ~39 MB of list from local runs: five 8 MiB parts (the default part size).
    let subs = make_shards(&tmp.path().join("data"), 3, 300_000);
    let runs = tmp.path().join("runs");
    seal_all(&subs, &runs);
    let local = tmp.path().join("local.bin");
    ok(&merger(&["--out", s(&local), "--runs", s(&runs)]));
    let expected = std::fs::read(&local).expect("read");
    assert!(
        expected.len() > 4 * qstore::DEFAULT_PART_SIZE,
        "{}",
        expected.len()
    );
    let out = s3.url("out/list.bin");
    let args = [
        "--runs",
        s(&runs),
        "--out",
        &out,
        "--store-deadline-secs",
        "60",
    ];
    // Stalled for good after 250,000 records (~32 MB): three parts sent by then, and with
    // at most two in flight (qstore's upload) the first one complete. The parts are then
    // seen in the server's `.uploads/`, so the kill lands mid-upload without timing luck.
    let (child, _stderr) = stalled_merger(&s3, &args, 250_000, None);
    let mut child = ChildGuard::new("merger", child);
    let parts = s3.kill_mid_upload("out/list.bin", &mut child, 2);
    println!("parts uploaded when the server was killed: {parts:?}");

    ok(&merger_s3(&s3, &args));
    assert_eq!(s3.keys(""), ["out/list.bin"]);
    assert!(
        s3.get("out/list.bin") == Some(expected),
        "the rerun's list differs from the local merge"
    );
}

/// A merge whose server stays down fails within its deadline naming the object, and
/// leaves nothing.
#[test]
fn a_server_that_stays_down_fails_within_the_deadline() {
    let mut s3 = TestS3::start("down");
    let tmp = tempfile::tempdir().expect("tempdir");
    runs_in_both(&s3, tmp.path(), 2, 1000);
    let out = tmp.path().join("out.bin");
    s3.kill();
    let started = std::time::Instant::now();
    let e = fails(
        &merger_s3(
            &s3,
            &[
                "--runs",
                &s3.url("runs"),
                "--out",
                s(&out),
                "--store-deadline-secs",
                "3",
            ],
        ),
        INPUT,
        &["s3://down/runs"],
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "took {:?}: {e}",
        started.elapsed()
    );
    assert!(!out.exists());
}

/// Producers publishing into S3 (segments and checkpoints, one PUT each) while
/// `merger follow` reads them from there: its parts are the batch merge of the same
/// prefix; then a shard compacted in S3 (its run written from its checkpoint, the
/// checkpoint and segments deleted) leaves the batch list the same at every step.
#[test]
fn follow_from_s3_is_the_batch_merge_and_compaction_keeps_it() {
    use common::publish::{part_files, Dest, Plan};
    let s3 = TestS3::start("follow");
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let src = s3.url("pub");
    let mut plan = Plan::new(3, 8_000);
    let follow = std::thread::scope(|scope| {
        let follower = scope.spawn(|| {
            merger_s3(
                &s3,
                &[
                    "follow",
                    "--runs",
                    &src,
                    "--expect-shards",
                    "3",
                    "--out-dir",
                    s(&out),
                    "--poll-ms",
                    "20",
                    "--part-every",
                    "0.2",
                ],
            )
        });
        plan.run(Dest::S3(&s3, "pub"), 12, |_| {
            std::thread::sleep(std::time::Duration::from_millis(60));
        });
        follower.join().expect("follower thread")
    });
    ok(&follow);
    let batch = |name: &str| {
        let local = tmp.path().join(name);
        ok(&merger_s3(
            &s3,
            &["--runs", &src, "--expect-shards", "3", "--out", s(&local)],
        ));
        cat(&[&local])
    };
    let full = batch("before.bin");
    assert_eq!(full.len(), 8_000);
    let parts = part_files(&out, "bin");
    let refs: Vec<&Path> = parts.iter().map(PathBuf::as_path).collect();
    assert_eq!(cat(&refs), full, "the follow is the batch merge");
    // Compaction of shard 2 in S3, checked after each step.
    ok(&merger_s3(
        &s3,
        &[
            "--out",
            &s3.url("pub/shard-2.bin"),
            &s3.url("pub/shard-2.checkpoint"),
        ],
    ));
    assert_eq!(batch("run-and-checkpoint.bin"), full);
    s3.delete("pub/shard-2.checkpoint");
    assert_eq!(batch("run-and-segments.bin"), full);
    for key in s3.keys("pub/segments/shard-2/") {
        s3.delete(&key);
    }
    assert_eq!(batch("run-alone.bin"), full);
}

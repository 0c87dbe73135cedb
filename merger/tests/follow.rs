//! `merger follow` as a user runs it, against fake producers that publish segments and
//! checkpoints over time into a directory (common/publish.rs): the parts it writes, read
//! in order, are the batch merge of the same destination, record by record; everything it
//! has emitted at any moment is a prefix of that list; a shard without a checkpoint holds
//! it back; parts are cut by size and time; killed -9 and started again it loses and
//! repeats nothing; `merger verify` takes its parts as one list; compaction of a finished
//! shard changes no list.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::publish::{part_files, Dest, Plan, Publisher};
use common::*;
use testkit::ChildGuard;

/// A `merger follow` process, its stdout and stderr collected as it runs.
struct Follower {
    child: ChildGuard,
    stdout: Option<JoinHandle<String>>,
    stderr: Arc<Mutex<String>>,
    err_thread: Option<JoinHandle<()>>,
}

impl Follower {
    fn start(args: &[&str]) -> Follower {
        let mut cmd = Command::new(MERGER);
        cmd.arg("follow")
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = ChildGuard::spawn("merger follow", &mut cmd);
        let c = child.child_mut().expect("child");
        let out = c.stdout.take().expect("stdout");
        let err = c.stderr.take().expect("stderr");
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut BufReader::new(out), &mut s).ok();
            s
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let err_thread = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = sink.lock().expect("lock");
                s.push_str(&line);
                s.push('\n');
            }
        });
        Follower {
            child,
            stdout: Some(stdout),
            stderr,
            err_thread: Some(err_thread),
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    /// Waits for it to exit by itself (within `limit`); its status, stdout, stderr.
    fn wait(mut self, limit: Duration) -> (ExitStatus, String, String) {
        let until = Instant::now() + limit;
        let status = loop {
            if let Some(s) = self
                .child
                .child_mut()
                .and_then(|c| c.try_wait().expect("wait"))
            {
                break s;
            }
            assert!(
                Instant::now() < until,
                "merger follow did not finish within {limit:?}; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = self.stdout.take().expect("once").join().expect("stdout");
        self.err_thread
            .take()
            .expect("once")
            .join()
            .expect("stderr");
        (status, out, self.stderr())
    }

    /// kill -9, then reap.
    fn kill(mut self) {
        self.child.kill();
    }
}

/// The records of the files, as `merger cat --json` prints them.
fn cat_all(files: &[PathBuf]) -> Vec<String> {
    if files.is_empty() {
        return Vec::new();
    }
    let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    cat(&refs)
}

/// The batch merge of `src` (runs and checkpoints), as `merger cat --json` lines.
fn batch(src: &str, shards: u32, tmp: &Path) -> Vec<String> {
    let out = tmp.join("batch.bin");
    ok(&merger(&[
        "--runs",
        src,
        "--expect-shards",
        &shards.to_string(),
        "--out",
        s(&out),
    ]));
    let lines = cat(&[&out]);
    std::fs::remove_file(&out).expect("rm batch");
    lines
}

#[track_caller]
fn assert_prefix(seen: &[String], full: &[String], what: &str) {
    assert!(
        seen.len() <= full.len() && seen == &full[..seen.len()],
        "{what}: {} records emitted are not a prefix of the final {} (first difference at {:?})",
        seen.len(),
        full.len(),
        seen.iter().zip(full).position(|(a, b)| a != b)
    );
}

/// The whole list published over time; the follower's parts and its --stdout lines are
/// the batch merge record by record, every snapshot of its parts taken meanwhile is a
/// prefix of it, and `merger verify` takes the parts as one complete list.
#[test]
fn the_follow_is_the_batch_merge_and_every_prefix_is_final() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    let out = tmp.path().join("out");
    let dest = Dest::Dir(&src);
    let mut plan = Plan::new(4, 20_000);
    let f = Follower::start(&[
        "--runs",
        s(&src),
        "--expect-shards",
        "4",
        "--out-dir",
        s(&out),
        "--poll-ms",
        "20",
        "--part-every",
        "0.3",
        "--stdout",
        "--json",
    ]);
    let mut snapshots = Vec::new();
    plan.run(dest, 40, |_| {
        std::thread::sleep(Duration::from_millis(40));
        snapshots.push(cat_all(&part_files(&out, "bin")));
    });
    let (status, stdout, stderr) = f.wait(Duration::from_secs(60));
    assert!(status.success(), "merger follow failed:\n{stderr}");
    let full = batch(s(&src), 4, tmp.path());
    assert_eq!(full.len(), 20_000);
    let parts = part_files(&out, "bin");
    assert_eq!(cat_all(&parts), full, "the parts are the batch merge");
    let printed: Vec<String> = stdout.lines().map(str::to_string).collect();
    assert_eq!(printed, full, "--stdout printed the batch merge");
    assert!(snapshots
        .iter()
        .any(|s| !s.is_empty() && s.len() < full.len()));
    for (i, snap) in snapshots.iter().enumerate() {
        assert_prefix(snap, &full, &format!("snapshot {i}"));
    }
    // Cut by time (0.3 s) over a ~2 s publication: a handful, not one per move of W.
    assert!(
        (2..=20).contains(&parts.len()),
        "{} parts for 40 moves of W over ~2 s with --part-every 0.3",
        parts.len()
    );
    let mut args = vec!["verify"];
    args.extend(parts.iter().map(|p| s(p)));
    let v = ok(&merger(&args));
    assert!(
        v.contains("OK: 20000 records") && v.contains("4 shards complete"),
        "{v}"
    );
    assert!(stderr.contains("every shard finished"), "{stderr}");
    // Started again on a complete follow: nothing to do, nothing written.
    let again = Follower::start(&[
        "--runs",
        s(&src),
        "--expect-shards",
        "4",
        "--out-dir",
        s(&out),
    ]);
    let (status, stdout, _) = again.wait(Duration::from_secs(20));
    assert!(status.success());
    assert!(
        stdout.contains("followed 0 records into 0 parts"),
        "{stdout}"
    );
    assert_eq!(part_files(&out, "bin"), parts);
}

/// A shard with no checkpoint holds W before every ID: nothing is emitted, the progress
/// line and the metrics name it; once it publishes, everything comes.
#[test]
fn a_shard_without_a_checkpoint_holds_everything_back() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    let out = tmp.path().join("out");
    let dest = Dest::Dir(&src);
    let mut plan = Plan::new(3, 3_000);
    let f = Follower::start(&[
        "--runs",
        s(&src),
        "--expect-shards",
        "3",
        "--out-dir",
        s(&out),
        "--poll-ms",
        "20",
        "--part-every",
        "0.1",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    // Shards 0 and 1 publish everything and finish; shard 2 says nothing.
    plan.publish_until(dest, 0, 3_000);
    plan.publish_until(dest, 1, 3_000);
    testkit::wait_for("the metrics address", Duration::from_secs(10), || {
        f.stderr().contains("metrics listening on")
    });
    let err = f.stderr();
    let addr = err
        .lines()
        .find_map(|l| l.split("metrics listening on ").nth(1))
        .expect("address")
        .trim()
        .to_string();
    std::thread::sleep(Duration::from_millis(600));
    assert!(part_files(&out, "bin").is_empty(), "nothing may be emitted");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (code, body) = rt
        .block_on(qmetrics::get(&addr, "/metrics", Duration::from_secs(5)))
        .expect("scrape");
    assert_eq!(code, 200);
    for line in [
        "qlist_follow_watermark -1.0",
        "qlist_follow_blocking_shard 2.0",
        "qlist_follow_shard_claim{shard=\"0\"} +Inf",
        "qlist_follow_shard_claim{shard=\"2\"} -1.0",
        "qlist_follow_records_total 0",
        "qlist_follow_parts_total 0",
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "{line:?} missing in\n{body}"
        );
    }
    assert!(
        body.contains("qlist_follow_lag_seconds{shard=\"2\"} "),
        "{body}"
    );
    // Shard 2 publishes half: W moves to its claim, and only records up to it come out.
    plan.publish_until(dest, 2, 1_500);
    testkit::wait_for("a part", Duration::from_secs(10), || {
        !part_files(&out, "bin").is_empty()
    });
    let (_, body) = rt
        .block_on(qmetrics::get(&addr, "/metrics", Duration::from_secs(5)))
        .expect("scrape");
    assert!(
        body.lines().any(|l| l == "qlist_follow_watermark 1500.0"),
        "{body}"
    );
    let emitted = cat_all(&part_files(&out, "bin"));
    assert!(emitted.iter().all(|l| l.contains("\"id\":") && {
        let v: serde_json::Value = serde_json::from_str(l).expect("json");
        v["id"].as_u64().expect("id") <= 1_500
    }));
    plan.publish_until(dest, 2, 3_000);
    let (status, _, stderr) = f.wait(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    assert_eq!(
        cat_all(&part_files(&out, "bin")),
        batch(s(&src), 3, tmp.path())
    );
}

/// Parts are cut at --part-bytes, not at every move of W.
#[test]
fn parts_are_cut_by_size() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    let out = tmp.path().join("out");
    let dest = Dest::Dir(&src);
    let mut plan = Plan::new(2, 10_000);
    plan.run(dest, 5, |_| {});
    let f = Follower::start(&[
        "--runs",
        s(&src),
        "--expect-shards",
        "2",
        "--out-dir",
        s(&out),
        "--part-bytes",
        "100000",
        "--part-every",
        "3600",
    ]);
    let (status, _, stderr) = f.wait(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    let parts = part_files(&out, "bin");
    let sizes: Vec<u64> = parts
        .iter()
        .map(|p| std::fs::metadata(p).expect("stat").len())
        .collect();
    let total: u64 = sizes.iter().sum();
    assert!(parts.len() as u64 >= total / 120_000, "{sizes:?}");
    for size in &sizes[..sizes.len() - 1] {
        // At least the limit, at most the limit and one stretch (a block) more.
        assert!((100_000..100_000 + 300_000).contains(size), "{sizes:?}");
    }
    assert_eq!(cat_all(&parts), batch(s(&src), 2, tmp.path()));
}

/// Killed -9 at several points while producers publish, and started again each time:
/// the parts end up the batch merge exactly; half-written parts are removed.
#[test]
fn killed_and_restarted_it_loses_and_repeats_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    let out = tmp.path().join("out");
    let dest = Dest::Dir(&src);
    let mut plan = Plan::new(3, 30_000);
    let args = [
        "--runs",
        s(&src),
        "--expect-shards",
        "3",
        "--out-dir",
        s(&out),
        "--poll-ms",
        "10",
        "--part-every",
        "0.15",
        "--part-bytes",
        "200000",
    ];
    let mut f = Some(Follower::start(&args));
    let mut kills = 0;
    plan.run(dest, 30, |r| {
        std::thread::sleep(Duration::from_millis(30 + (r * 17) % 40));
        if r % 6 == 3 {
            if let Some(old) = f.take() {
                old.kill();
                kills += 1;
            }
            f = Some(Follower::start(&args));
        }
    });
    let (status, _, stderr) = f.take().expect("follower").wait(Duration::from_secs(60));
    assert!(status.success(), "{stderr}");
    assert_eq!(kills, 5);
    assert!(
        stderr.contains("resuming after the last complete part"),
        "{stderr}"
    );
    let parts = part_files(&out, "bin");
    assert_eq!(cat_all(&parts), batch(s(&src), 3, tmp.path()));
    let mut v = vec!["verify"];
    v.extend(parts.iter().map(|p| s(p)));
    ok(&merger(&v));
    assert!(
        names(&out).iter().all(|n| !n.ends_with(".tmp")),
        "{:?}",
        names(&out)
    );
    // A half-written part left by a kill is removed by the next follower.
    let tmpfile = out.join(".part-00000999.bin.abcdef.tmp");
    std::fs::write(&tmpfile, b"half").expect("write");
    let (status, _, _) = Follower::start(&args).wait(Duration::from_secs(20));
    assert!(status.success());
    assert!(!tmpfile.exists());
}

/// `merger verify` takes the parts of a follow in order as one list (a growing prefix
/// too), and names a missing or misplaced part.
#[test]
fn verify_takes_the_parts_in_order_and_names_a_missing_one() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    let out = tmp.path().join("out");
    let dest = Dest::Dir(&src);
    let mut plan = Plan::new(2, 6_000);
    plan.run(dest, 4, |_| {});
    let (status, _, stderr) = Follower::start(&[
        "--runs",
        s(&src),
        "--expect-shards",
        "2",
        "--out-dir",
        s(&out),
        "--part-bytes",
        "60000",
    ])
    .wait(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    let parts = part_files(&out, "bin");
    assert!(parts.len() >= 4, "{parts:?}");
    let verify = |files: &[&PathBuf]| {
        let mut v = vec!["verify".to_string()];
        v.extend(files.iter().map(|p| p.display().to_string()));
        let v: Vec<&str> = v.iter().map(String::as_str).collect();
        merger(&v)
    };
    let all: Vec<&PathBuf> = parts.iter().collect();
    let o = ok(&verify(&all));
    assert!(o.contains("2 shards complete"), "{o}");
    // The first parts alone: a prefix of a growing list.
    let o = ok(&verify(&all[..2]));
    assert!(o.contains("a prefix of a growing list"), "{o}");
    // One missing, two swapped, or not starting at part 0: named.
    let mut missing = all.clone();
    missing.remove(1);
    fails(
        &verify(&missing),
        INPUT,
        &[
            "part-00000002.bin",
            "is follow part 2, but it was given as file 2",
        ],
    );
    let mut swapped = all.clone();
    swapped.swap(1, 2);
    fails(&verify(&swapped), INPUT, &["misplaced"]);
    fails(&verify(&all[1..]), INPUT, &["from part 0"]);
    // The parts are refused as merge inputs (they are read in order, not merged).
    fails(
        &merger(&["--out", s(&tmp.path().join("x.bin")), s(&parts[0])]),
        INPUT,
        &["follow part 0"],
    );
}

/// A torn checkpoint is retried a few polls, then named in the error.
#[test]
fn a_bad_checkpoint_is_named() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    let out = tmp.path().join("out");
    let dest = Dest::Dir(&src);
    let mut p = Publisher::new(0);
    p.publish(dest, &[1, 2, 3], 3, false);
    let bytes = p.checkpoint.encode();
    std::fs::write(src.join("shard-0.checkpoint"), &bytes[..bytes.len() - 5]).expect("tear");
    let (status, _, stderr) = Follower::start(&[
        "--runs",
        s(&src),
        "--expect-shards",
        "1",
        "--out-dir",
        s(&out),
        "--poll-ms",
        "10",
    ])
    .wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(INPUT), "{stderr}");
    assert!(
        stderr.contains("shard-0.checkpoint") && stderr.contains("truncated"),
        "{stderr}"
    );
    // A segment whose length is not the checkpoint's: named.
    let mut p = Publisher::new(0);
    p.publish(dest, &[1, 2, 3], 3, false);
    p.checkpoint.segments[0].bytes += 1;
    dest.put("shard-0.checkpoint", &p.checkpoint.encode());
    let (status, _, stderr) =
        Follower::start(&["--runs", s(&src), "--expect-shards", "1", "--stdout"])
            .wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(INPUT), "{stderr}");
    assert!(
        stderr.contains(".seg") && stderr.contains("its checkpoint says"),
        "{stderr}"
    );
}

/// Compacting a finished shard (its checkpoint merged into `shard-<n>.bin`, then the
/// checkpoint removed, then its segments) leaves the same list at every step, for the
/// batch merge and for a follower; a run beside a checkpoint that is not the same
/// finished shard is an error naming both.
#[test]
fn compaction_keeps_the_list_at_every_step() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    let dest = Dest::Dir(&src);
    let mut plan = Plan::new(3, 9_000);
    plan.run(dest, 6, |_| {});
    let before = batch(s(&src), 3, tmp.path());
    assert_eq!(before.len(), 9_000);
    let run = src.join("shard-1.bin");
    let checkpoint = src.join("shard-1.checkpoint");
    // A stale or partial run beside the checkpoint: refused, naming both.
    let other = tmp.path().join("other");
    let mut partial = Plan::new(3, 9_000);
    partial.publish_until(Dest::Dir(&other), 1, 4_000);
    ok(&merger(&[
        "--allow-unfinished",
        "--out",
        s(&run),
        s(&other.join("shard-1.checkpoint")),
    ]));
    fails(
        &merger(&["--runs", s(&src), "--out", s(&tmp.path().join("x.bin"))]),
        INPUT,
        &["shard-1.bin", "shard-1.checkpoint", "both hold shard 1"],
    );
    // Step 1: the run, written from the checkpoint.
    ok(&merger(&["--out", s(&run), s(&checkpoint)]));
    assert_eq!(batch(s(&src), 3, tmp.path()), before, "run and checkpoint");
    // Step 2: the checkpoint removed.
    std::fs::remove_file(&checkpoint).expect("rm checkpoint");
    assert_eq!(batch(s(&src), 3, tmp.path()), before, "run and segments");
    // Step 3: the segments removed.
    std::fs::remove_dir_all(src.join("segments/shard-1")).expect("rm segments");
    assert_eq!(batch(s(&src), 3, tmp.path()), before, "run alone");
    // A follower of the compacted source reads the run.
    let out = tmp.path().join("out");
    let (status, _, stderr) = Follower::start(&[
        "--runs",
        s(&src),
        "--expect-shards",
        "3",
        "--out-dir",
        s(&out),
    ])
    .wait(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    assert_eq!(cat_all(&part_files(&out, "bin")), before);
    // --part and --jobs need runs: a checkpoint is refused with the fix.
    fails(
        &merger(&[
            "--runs",
            s(&src),
            "--jobs",
            "2",
            "--out",
            s(&tmp.path().join("y.bin")),
        ]),
        INPUT,
        &["is a checkpoint", "compact"],
    );
}

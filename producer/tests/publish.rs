//! Publishing as it goes (`--seal-to DEST --publish-every SECS`), with real processes of
//! the `producer` binary, a real Redis quorum, real RocksDB, a directory and a real S3
//! server (SeaweedFS): segments tile the sublist and hold exactly its items; the claim
//! rule; kill -9 right after a segment (before its checkpoint), right after a checkpoint,
//! and at seeded random moments, each followed by a restart, ends with every item
//! published exactly once and no orphan segment; SIGSTOP and SIGCONT; the flags' errors.

mod common;

use common::publish::{check_claim, Published};
use common::{assert_exit, durable_items, producer_cmd, quorum, run, stderr_lines};
use qformat::checkpoint::Checkpoint;
use qformat::names::checkpoint_name;
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};
use testkit::s3::TestS3;
use testkit::{wait_for, ChildGuard};

/// The durable-items stall hook (producer/src/test_hooks.rs).
const STALL_ENV: &str = "QLIST_PRODUCER_TEST_STALL_AFTER";
/// The publication abort hook: `segment:K` or `checkpoint:K`.
const ABORT_ENV: &str = "QLIST_PRODUCER_TEST_PUBLISH_ABORT";

fn arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// `producer` generating `count` items of shard `shard` into `data`, batches of 100,
/// publishing into `dest` every 0.2 s.
fn args(shard: u32, data: &Path, nodes: &str, count: u64, dest: &str) -> Vec<String> {
    [
        "--shard",
        &shard.to_string(),
        "--data-dir",
        arg(data),
        "--nodes",
        nodes,
        "--generate",
        &count.to_string(),
        "--payload-size",
        "100",
        "--batch",
        "100",
        "--seal-to",
        dest,
        "--publish-every",
        "0.2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn run_env(args: &[String], env: &[(String, String)]) -> Output {
    producer_cmd(&strs(args))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("spawn producer")
}

/// Runs with the abort hook at `point`; returns whether it aborted there (a run that
/// finished before reaching the point exits 0).
#[track_caller]
fn run_aborting(args: &[String], env: &[(String, String)], point: &str) -> bool {
    let out = producer_cmd(&strs(args))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env(ABORT_ENV, point)
        .output()
        .expect("spawn producer");
    match out.status.code() {
        Some(0) => false,
        None => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("aborting after"),
                "killed elsewhere: {stderr}"
            );
            true
        }
        Some(c) => panic!(
            "exit {c} with {point}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// Waits, then lets a producer stalled on stdin go on.
fn release(child: &mut Child) {
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin.write_all(b"go\n").expect("release the stall");
}

/// Spawns `args` stalled once `after` items are durable; returns once it announced it.
fn spawn_stalled(args: &[String], after: u64) -> Child {
    let mut child = producer_cmd(&strs(args))
        .env(STALL_ENV, after.to_string())
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn");
    let rx = stderr_lines(&mut child);
    loop {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(line) if line.contains(producer::STALL_ANNOUNCE) => return child,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!("the producer did not stall after {after} items: {e}");
            }
        }
    }
}

#[test]
fn publishing_every_0_2_s_tiles_the_sublist_and_keeps_the_claim() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, dest) = (tmp.path().join("data"), tmp.path().join("pub"));
    std::fs::create_dir_all(&dest).expect("mkdir dest");
    let a = args(3, &data, &q.urls_arg(), 20_000, arg(&dest));
    let published = Published::Dir(&dest);

    // Stalled with 5000 items durable for longer than the interval: the first batch
    // after it is preceded by a publication, so there are at least two segments.
    let mut child = spawn_stalled(&a, 5000);
    let stalled = Instant::now();
    wait_for("the interval to pass", Duration::from_secs(5), || {
        stalled.elapsed() > Duration::from_millis(300)
    });
    release(&mut child);
    // Every checkpoint seen while it runs keeps the claim rule (checked once it is done).
    let mut seen: Vec<Checkpoint> = Vec::new();
    let status = loop {
        if let Some(c) = published.checkpoint(3) {
            if seen.last() != Some(&c) {
                seen.push(c);
            }
        }
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(status.code(), Some(0));
    let items = durable_items(&data, 3);
    assert_eq!(items.len(), 20_000);
    published.check_finished(3, &items);
    let last = published.checkpoint(3).expect("checkpoint");
    assert!(last.segments.len() >= 2, "{last:?}");
    for c in &seen {
        check_claim(c, &items);
        let prefix = &last.segments[..c.segments.len()];
        assert_eq!(
            prefix,
            &c.segments[..],
            "a later checkpoint rewrote segments"
        );
    }
    for w in seen.windows(2) {
        assert!(w[0].count <= w[1].count && w[0].claim < w[1].claim, "{w:?}");
    }
    println!(
        "{} checkpoints seen, {} segments",
        seen.len(),
        last.segments.len()
    );

    // Run again: finished sublist, finished checkpoint: nothing changes.
    let out = run(&strs(&a));
    assert_exit(&out, 0, "");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("published 20000 items"), "{stdout}");
    assert_eq!(published.checkpoint(3), Some(last));
    assert!(
        !dest.join("shard-3.bin").exists(),
        "publishing seals no run"
    );
}

/// Kills (aborts, as kill -9 leaves it) right after a segment and right after a
/// checkpoint, several times, restarting in between: each checkpoint left keeps the claim
/// rule against the final items, the orphan segment of a kill before its checkpoint is
/// removed, and the final publication holds every item once.
fn kills_at_publication_points(published: &Published<'_>, dest: &str, env: &[(String, String)]) {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let a = args(5, &data, &q.urls_arg(), 20_000, dest);
    let mut left = Vec::new();
    for point in [
        "checkpoint:1",
        "segment:1",
        "checkpoint:2",
        "segment:2",
        "segment:1",
    ] {
        if !run_aborting(&a, env, point) {
            break;
        }
        let c = published.checkpoint(5);
        let files = published.segment_files(5);
        println!("after {point}: {c:?}, files {files:?}");
        if point.starts_with("segment") {
            let named = c.as_ref().map_or(0, |c| c.segments.len());
            assert_eq!(files.len(), named + 1, "the orphan is there: {files:?}");
        }
        left.extend(c);
    }
    let out = run_env(&a, env);
    assert_exit(&out, 0, "");
    let items = durable_items(&data, 5);
    assert_eq!(items.len(), 20_000);
    published.check_finished(5, &items);
    assert!(!left.is_empty());
    for c in &left {
        check_claim(c, &items);
    }
}

#[test]
fn killed_after_a_segment_or_a_checkpoint_then_restarted_publishes_each_item_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dest = tmp.path().join("pub");
    std::fs::create_dir_all(&dest).expect("mkdir dest");
    kills_at_publication_points(&Published::Dir(&dest), arg(&dest), &[]);
}

#[test]
fn killed_at_random_moments_then_restarted_publishes_each_item_once() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, dest) = (tmp.path().join("data"), tmp.path().join("pub"));
    std::fs::create_dir_all(&dest).expect("mkdir dest");
    let published = Published::Dir(&dest);
    let a = args(6, &data, &q.urls_arg(), 30_000, arg(&dest));
    let seed = 45;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut left = Vec::new();
    for kill in 0..10 {
        let delay = Duration::from_millis(rng.gen_range(50..600));
        let mut child = ChildGuard::new(
            "producer --publish-every",
            producer_cmd(&strs(&a)).spawn().expect("spawn"),
        );
        std::thread::sleep(delay);
        child.kill();
        let c = published.checkpoint(6);
        println!("seed {seed}, kill {kill} after {delay:?}: {c:?}");
        left.extend(c);
    }
    let out = run(&strs(&a));
    assert_exit(&out, 0, "");
    let items = durable_items(&data, 6);
    assert_eq!(items.len(), 30_000);
    published.check_finished(6, &items);
    for c in &left {
        check_claim(c, &items);
    }
}

#[test]
fn a_stopped_producer_holds_its_checkpoint_and_goes_on_when_continued() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, dest) = (tmp.path().join("data"), tmp.path().join("pub"));
    std::fs::create_dir_all(&dest).expect("mkdir dest");
    let published = Published::Dir(&dest);
    let a = args(7, &data, &q.urls_arg(), 40_000, arg(&dest));
    let mut child = ChildGuard::new(
        "producer --publish-every",
        producer_cmd(&strs(&a)).spawn().expect("spawn"),
    );
    wait_for("a first checkpoint", Duration::from_secs(60), || {
        published.checkpoint(7).is_some()
    });
    child.signal(libc::SIGSTOP);
    // The stop lands at any point, maybe mid-publication: read once it has landed (or the
    // producer, if it was that fast, has ended).
    let stat = format!("/proc/{}/stat", child.pid().expect("pid"));
    wait_for("the producer to stop", Duration::from_secs(10), || {
        std::fs::read_to_string(&stat).map_or(true, |s| {
            let state = s.rsplit(')').next().unwrap_or_default().trim_start();
            state.starts_with('T') || state.starts_with('Z')
        })
    });
    let held = published.checkpoint(7).expect("checkpoint");
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        published.checkpoint(7),
        Some(held.clone()),
        "a stopped producer published"
    );
    child.signal(libc::SIGCONT);
    let status = child.wait();
    assert_eq!(status.code(), Some(0));
    let items = durable_items(&data, 7);
    published.check_finished(7, &items);
    check_claim(&held, &items);
}

#[test]
fn publication_flags_and_a_bad_or_foreign_checkpoint_are_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, dest) = (tmp.path().join("data"), tmp.path().join("pub"));
    std::fs::create_dir_all(&dest).expect("mkdir dest");
    let base = [
        "--shard",
        "1",
        "--data-dir",
        arg(&data),
        "--nodes",
        "redis://127.0.0.1:1",
        "--generate",
        "10",
    ];
    let with = |extra: &[&str]| {
        let mut v: Vec<&str> = base.to_vec();
        v.extend_from_slice(extra);
        run(&v)
    };
    for bad in ["0", "-1", "nan", "x"] {
        let out = with(&["--seal-to", arg(&dest), "--publish-every", bad]);
        assert_exit(&out, 2, "");
    }
    assert_exit(&with(&["--publish-every", "0.2"]), 2, "--seal-to");

    // A checkpoint that is not one: exit 3, never read as empty.
    let q = quorum(3);
    let a = args(1, &data, &q.urls_arg(), 300, arg(&dest));
    std::fs::write(
        dest.join(checkpoint_name(1)),
        b"qlist-checkpoint 1\nshard 1\n",
    )
    .expect("write a torn checkpoint");
    let out = run(&strs(&a));
    assert_exit(&out, 3, "not a valid checkpoint");
    // Another shard's checkpoint under this shard's name: someone else's destination.
    let mut other = Checkpoint::empty(9);
    other.claim = 5;
    std::fs::write(dest.join(checkpoint_name(1)), other.encode()).expect("write");
    let out = run(&strs(&a));
    assert_exit(&out, 3, "another producer publishes there");
    // More items than the sublist holds.
    std::fs::remove_file(dest.join(checkpoint_name(1))).expect("rm");
    assert_exit(&run(&strs(&a)), 0, "");
    let done = Published::Dir(&dest).checkpoint(1).expect("checkpoint");
    assert!(done.finished && done.count == 300, "{done:?}");
    let tmp2 = tempfile::tempdir().expect("tempdir");
    let b = args(1, tmp2.path(), &q.urls_arg(), 100, arg(&dest));
    let out = run(&strs(&b));
    assert_exit(&out, 3, "it publishes 300 items, the sublist holds 0");
    // Nothing was removed or replaced by the refused runs.
    assert_eq!(Published::Dir(&dest).checkpoint(1), Some(done));
}

#[test]
fn publishing_to_s3_survives_kills_and_leaves_no_orphan() {
    let s3 = TestS3::start("qlist-pub");
    let url = s3.url("pub");
    kills_at_publication_points(&Published::S3(&s3, "pub"), &url, &s3.env());
    assert!(
        s3.multipart_uploads().is_empty(),
        "{:?}",
        s3.multipart_uploads()
    );
}

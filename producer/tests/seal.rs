//! Sealing, with real processes of the `producer` binary, a real Redis quorum, real
//! RocksDB and a real S3 server (SeaweedFS, `testkit::s3::TestS3`): `--seal-to` and
//! `producer seal` into a directory and into S3, idempotence and determinism, every error's
//! exit code, kill -9 mid-seal, wrong credentials, an S3 server down when the seal starts,
//! and one killed while a multipart seal has parts uploaded.

mod common;

use common::{assert_exit, producer_cmd, quorum, run, stderr_lines};
use qformat::names::shard_db_path;
use qformat::run::{decode_block, RunMeta};
use qformat::shard::ProgressMarker;
use qformat::Record;
use std::path::Path;
use std::process::{Child, Output};
use std::time::Duration;
use sublist::shard::{ShardReader, ShardWriter};
use testkit::s3::TestS3;
use testkit::ChildGuard;

/// The seal's crash-test hook (see the binary): stall once this many items are in the run.
const SEAL_STALL_ENV: &str = "QLIST_PRODUCER_TEST_SEAL_STALL_AFTER";

fn run_env(args: &[&str], env: &[(String, String)]) -> Output {
    producer_cmd(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("spawn producer")
}

#[track_caller]
fn assert_stdout_has(out: &Output, needle: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(needle), "stdout lacks {needle:?}: {stdout}");
}

fn arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

fn items(dir: &Path, shard: u32) -> Vec<Record> {
    let r = ShardReader::open(&shard_db_path(dir, shard)).expect("open sublist");
    r.iter().collect::<Result<_, _>>().expect("read sublist")
}

/// Decodes a whole run (metadata, then every block) and checks that it holds exactly
/// `want`, as the complete shard `shard`.
#[track_caller]
fn check_run(bytes: &[u8], shard: u32, want: &[Record]) {
    let meta = RunMeta::decode(bytes.len() as u64, bytes).expect("run metadata");
    let mut got = Vec::new();
    for (i, b) in meta.blocks.iter().enumerate() {
        let range = b.offset as usize..(b.offset + u64::from(b.len)) as usize;
        got.extend(decode_block(&bytes[range], b, i as u64).expect("block"));
    }
    assert_eq!(got.len(), want.len(), "records in the run");
    assert!(got == want, "the run's records differ from the sublist's");
    assert_eq!(meta.shards.len(), 1, "{:?}", meta.shards);
    let entry = meta.shard(shard).expect("the shard's entry");
    assert!(entry.complete(), "{entry:?}");
    assert_eq!(entry.total, want.len() as u64);
}

/// The producer command for `shard` of `data` generating `count` items, plus `extra`.
fn produce_args(shard: u32, data: &Path, nodes: &str, count: u64, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--shard",
        &shard.to_string(),
        "--data-dir",
        arg(data),
        "--nodes",
        nodes,
        "--generate",
        &count.to_string(),
        "--payload-size",
        "200",
        "--batch",
        "500",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn seal_args<'a>(shard: &'a str, data: &'a Path, to: &'a str) -> [&'a str; 7] {
    [
        "seal",
        "--shard",
        shard,
        "--data-dir",
        arg(data),
        "--to",
        to,
    ]
}

/// Spawns `args` with the seal stall hook at `after` items; returns once it stalls.
fn spawn_seal_stalled(args: &[&str], env: &[(String, String)], after: u64) -> Child {
    let mut child = producer_cmd(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env(SEAL_STALL_ENV, after.to_string())
        .spawn()
        .expect("spawn");
    let rx = stderr_lines(&mut child);
    loop {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(line) if line.contains(producer::STALL_ANNOUNCE) => return child,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!("the producer did not stall while sealing after {after} items: {e}");
            }
        }
    }
}

#[test]
fn seal_to_a_directory_holds_the_sublist_and_is_idempotent() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, runs, again) = (
        tmp.path().join("data"),
        tmp.path().join("runs"),
        tmp.path().join("again"),
    );
    std::fs::create_dir_all(&runs).expect("mkdir runs");
    std::fs::create_dir_all(&again).expect("mkdir again");
    let args = produce_args(3, &data, &q.urls_arg(), 3000, &["--seal-to", arg(&runs)]);
    let out = run(&strs(&args));
    assert_exit(&out, 0, "");
    assert_stdout_has(&out, "sealed shard 3: 3000 items");
    assert_stdout_has(
        &out,
        &format!("into {}", runs.join("shard-3.bin").display()),
    );
    let sublist = items(&data, 3);
    let first = std::fs::read(runs.join("shard-3.bin")).expect("the run");
    check_run(&first, 3, &sublist);

    // Again: nothing stamped (the same items, the same IDs), the same bytes sealed.
    let out = run(&strs(&args));
    assert_exit(&out, 0, "");
    assert_stdout_has(&out, "nothing to do");
    assert_stdout_has(&out, "sealed shard 3: 3000 items");
    assert!(items(&data, 3) == sublist, "the sublist changed");
    let second = std::fs::read(runs.join("shard-3.bin")).expect("the run");
    assert!(first == second, "sealing again gave other bytes");

    // `producer seal` gives the same bytes, and only the run is left in the directory.
    let out = run(&seal_args("3", &data, arg(&again)));
    assert_exit(&out, 0, "");
    assert_stdout_has(&out, "sealed shard 3: 3000 items");
    assert!(std::fs::read(again.join("shard-3.bin")).expect("run") == first);
    let names: Vec<_> = std::fs::read_dir(&runs)
        .expect("list runs")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["shard-3.bin"]);
}

#[test]
fn seal_errors_name_the_sublist_or_destination_with_their_exit_codes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let runs = tmp.path().join("runs");
    std::fs::create_dir_all(&runs).expect("mkdir runs");
    // An unfinished sublist: one batch written, the producer never reached its end.
    {
        let mut w = ShardWriter::open(&data, 4).expect("create sublist");
        let recs: Vec<Record> = (0..10)
            .map(|i| Record {
                id: 100 + i,
                shard: 4,
                seq: i,
                payload: vec![b'x'; 5],
            })
            .collect();
        let p = ProgressMarker {
            next_seq: 10,
            finished: false,
            last_id: 109,
            fingerprint: b"generate count=20 payload-size=5".to_vec(),
        };
        w.write_batch(&recs, &p).expect("write a batch");
    }
    let unfinished = shard_db_path(&data, 4);
    let out = run(&seal_args("4", &data, arg(&runs)));
    assert_exit(&out, 3, &unfinished.display().to_string());
    assert_exit(&out, 3, "has not finished its input");
    let out = run(&seal_args("5", &data, arg(&runs)));
    assert_exit(&out, 3, &shard_db_path(&data, 5).display().to_string());
    assert!(std::fs::read_dir(&runs).expect("ls").next().is_none());

    // Destinations: a missing directory is output (4), a bad DEST usage (2).
    let missing = tmp.path().join("no-such-dir");
    let out = run(&seal_args("4", &data, arg(&missing)));
    assert_exit(&out, 4, &missing.display().to_string());
    for bad in ["s3:/x", "gs://b", "s3://"] {
        let out = run(&seal_args("4", &data, bad));
        assert_exit(&out, 2, "");
    }
    let out = run(&["seal", "--shard", "4", "--data-dir", arg(&data)]);
    assert_exit(&out, 2, "--to");
    // `--seal-to` with a bad DEST fails before anything is produced.
    let out = run(&[
        "--shard",
        "6",
        "--data-dir",
        arg(&data),
        "--nodes",
        "redis://127.0.0.1:1",
        "--generate",
        "5",
        "--seal-to",
        "gs://b/runs",
    ]);
    assert_exit(&out, 2, "gs://");
    assert!(!shard_db_path(&data, 6).exists());
    let help = run(&["seal", "--help"]);
    assert_exit(&help, 0, "");
    for var in [
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ENDPOINT_URL",
        "AWS_ALLOW_HTTP",
        "s3://",
    ] {
        assert_stdout_has(&help, var);
    }
}

#[test]
fn kill_9_while_sealing_leaves_no_run_and_rerunning_completes_it() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, runs, clean) = (
        tmp.path().join("data"),
        tmp.path().join("runs"),
        tmp.path().join("clean"),
    );
    std::fs::create_dir_all(&runs).expect("mkdir runs");
    std::fs::create_dir_all(&clean).expect("mkdir clean");
    let args = produce_args(7, &data, &q.urls_arg(), 6000, &["--seal-to", arg(&runs)]);
    // 3000 items of ~230 bytes: two 256 KiB blocks are in the temporary file by then.
    let mut child = spawn_seal_stalled(&strs(&args), &[], 3000);
    let names: Vec<String> = std::fs::read_dir(&runs)
        .expect("list runs")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| n.starts_with('.')),
        "a visible file while sealing: {names:?}"
    );
    child.kill().expect("kill -9");
    assert_eq!(child.wait().expect("wait").code(), None);
    assert!(!runs.join("shard-7.bin").exists());
    let stamped = items(&data, 7);
    assert_eq!(stamped.len(), 6000);

    let out = run(&strs(&args));
    assert_exit(&out, 0, "");
    assert_stdout_has(&out, "nothing to do");
    assert_stdout_has(&out, "sealed shard 7: 6000 items");
    assert!(items(&data, 7) == stamped, "the sublist changed");
    let resumed = std::fs::read(runs.join("shard-7.bin")).expect("the run");
    check_run(&resumed, 7, &stamped);
    assert_exit(&run(&seal_args("7", &data, arg(&clean))), 0, "");
    let uninterrupted = std::fs::read(clean.join("shard-7.bin")).expect("the run");
    assert!(
        resumed == uninterrupted,
        "the resumed seal gave other bytes"
    );
}

#[test]
fn seal_to_s3_matches_the_directory_seal_and_never_shows_a_partial_object() {
    let q = quorum(3);
    let mut s3 = TestS3::start("qlist");
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, runs) = (tmp.path().join("data"), tmp.path().join("runs"));
    std::fs::create_dir_all(&runs).expect("mkdir runs");
    let env = s3.env();
    let url = s3.url("runs");
    let args = produce_args(2, &data, &q.urls_arg(), 4000, &["--seal-to", &url]);
    let out = run_env(&strs(&args), &env);
    assert_exit(&out, 0, "");
    assert_stdout_has(&out, "sealed shard 2: 4000 items");
    assert_stdout_has(&out, "into s3://qlist/runs/shard-2.bin");
    assert_exit(&run(&seal_args("2", &data, arg(&runs))), 0, "");
    let local = std::fs::read(runs.join("shard-2.bin")).expect("the dir run");
    let object = s3.get("runs/shard-2.bin").expect("the object");
    assert!(object == local, "the S3 run differs from the directory run");
    check_run(&object, 2, &items(&data, 2));

    // Killed mid-seal: no object under the name, before or after the kill.
    let stalled_url = s3.url("stalled");
    let mut child = spawn_seal_stalled(&seal_args("2", &data, &stalled_url), &env, 2000);
    assert!(s3.keys("stalled").is_empty(), "{:?}", s3.keys("stalled"));
    child.kill().expect("kill -9");
    child.wait().expect("wait");
    assert!(s3.keys("stalled").is_empty(), "{:?}", s3.keys("stalled"));

    // Wrong credentials: output (4), a clear message, never the secret.
    let secret = "wrong-secret-sentinel-7731";
    let mut bad_env = env.clone();
    for (k, v) in bad_env.iter_mut() {
        if k == "AWS_SECRET_ACCESS_KEY" {
            *v = secret.to_string();
        }
    }
    let out = run_env(&seal_args("2", &data, &s3.url("denied")), &bad_env);
    assert_exit(&out, 4, "s3://qlist/denied/shard-2.bin");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains(secret), "the secret was shown: {all}");
    assert!(all.contains("refused"), "{all}");
    println!("wrong credentials: {all}");
    assert!(s3.keys("denied").is_empty());
    assert!(
        !s3.multipart_uploads().iter().any(|k| k.contains("denied")),
        "{:?}",
        s3.multipart_uploads()
    );

    // The S3 server is down when the seal starts and back a second later: retries carry it.
    s3.kill();
    let started = std::time::Instant::now();
    let child = producer_cmd(&seal_args("2", &data, &s3.url("later")))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_secs(1));
    s3.restart();
    let out = child.wait_with_output().expect("wait");
    assert_exit(&out, 0, "");
    println!(
        "sealed across an S3 restart in {:?}: {}",
        started.elapsed(),
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(s3.get("later/shard-2.bin").expect("the object") == local);
}

/// The server killed while a seal is a multipart upload with parts uploaded (and more in
/// flight), the producer killed too, the server restarted: no object anywhere, only the
/// incomplete upload, which is no object; sealing again completes the run, byte for byte
/// the directory seal's.
#[test]
fn the_server_killed_mid_multipart_seal_then_sealing_again_completes() {
    let q = quorum(3);
    let mut s3 = TestS3::start("mpseal");
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, runs) = (tmp.path().join("data"), tmp.path().join("runs"));
    std::fs::create_dir_all(&runs).expect("mkdir runs");
    let env = s3.env();
    // 40,000 items of 1000 bytes: a ~41 MB run, five 8 MiB parts (the default size).
    let mut args = produce_args(5, &data, &q.urls_arg(), 40_000, &[]);
    let at = args
        .iter()
        .position(|a| a == "--payload-size")
        .expect("flag")
        + 1;
    args[at] = "1000".to_string();
    assert_exit(&run(&strs(&args)), 0, "");
    assert_exit(&run(&seal_args("5", &data, arg(&runs))), 0, "");
    let local = std::fs::read(runs.join("shard-5.bin")).expect("the dir run");
    assert!(
        local.len() > 4 * qstore::DEFAULT_PART_SIZE,
        "{}",
        local.len()
    );

    // Stalled for good after 30,000 items (~31 MB): three parts sent by then, and with
    // at most two in flight (qstore's upload) the first one complete. The parts are then
    // seen in the server's `.uploads/`, so the kill lands mid-upload without timing luck.
    let url = s3.url("runs");
    let mut child = ChildGuard::new(
        "producer --seal-to",
        spawn_seal_stalled(&seal_args("5", &data, &url), &env, 30_000),
    );
    let parts = s3.kill_mid_upload("runs/shard-5.bin", &mut child, 2);
    println!("parts uploaded when the server was killed: {parts:?}");

    let out = run_env(&seal_args("5", &data, &url), &env);
    assert_exit(&out, 0, "");
    assert_stdout_has(&out, "sealed shard 5: 40000 items");
    assert_eq!(s3.keys(""), ["runs/shard-5.bin"]);
    let object = s3.get("runs/shard-5.bin").expect("the object");
    assert!(object == local, "the S3 run differs from the directory run");
    check_run(&object, 5, &items(&data, 5));
}

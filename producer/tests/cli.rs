//! The `producer` binary as OS processes against a real local Redis quorum and real
//! RocksDB: parallel shards, real-time order, kill -9 crash loop with exactly-once check,
//! broker mode, and every bad-input case of the issue.

use idclient::cluster::LocalQuorum;
use producer::generate_payload;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;
use sublist::shard::{shard_db_path, ShardReader, ShardWriter};
use sublist::Record;

fn quorum(n: usize) -> LocalQuorum {
    LocalQuorum::temp(n)
        .expect("cannot start a local redis-server quorum (is redis-server installed?)")
}

fn producer_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_producer"));
    c.args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn run(args: &[&str]) -> Output {
    producer_cmd(args).output().expect("spawn producer")
}

#[track_caller]
fn assert_exit(out: &Output, code: i32, stderr_has: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {}\nstderr: {stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        stderr.contains(stderr_has),
        "stderr lacks {stderr_has:?}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn items(dir: &Path, shard: u32) -> Vec<Record> {
    let r = ShardReader::open(&shard_db_path(dir, shard)).expect("open sublist");
    assert_eq!(r.shard(), shard);
    r.iter().collect::<Result<_, _>>().expect("read sublist")
}

/// Strictly increasing IDs, seqs exactly 0..n in ID order, the expected payloads.
#[track_caller]
fn check_sublist(recs: &[Record], shard: u32, payloads: &[Vec<u8>]) {
    assert_eq!(recs.len(), payloads.len(), "shard {shard}: item count");
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(
            (r.shard, r.seq),
            (shard, i as u64),
            "shard {shard}: item {i}"
        );
        assert_eq!(r.payload, payloads[i], "shard {shard}: payload of seq {i}");
        if i > 0 {
            assert!(
                recs[i - 1].id < r.id,
                "shard {shard}: ids not increasing at {i}"
            );
        }
    }
}

fn generated(shard: u32, count: u64, size: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|s| generate_payload(shard, s, size))
        .collect()
}

fn dir_arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

#[test]
fn four_parallel_producers_are_ordered_disjoint_and_complete() {
    let q = quorum(5);
    let tmp = tempfile::tempdir().expect("tempdir");
    let nodes = q.urls_arg();
    let count = 3000u64;
    let children: Vec<(u32, Child)> = (0..4u32)
        .map(|shard| {
            let batch = ["1", "37", "500", "3000"][shard as usize];
            let child = producer_cmd(&[
                "--shard",
                &shard.to_string(),
                "--data-dir",
                dir_arg(tmp.path()),
                "--nodes",
                &nodes,
                "--generate",
                &count.to_string(),
                "--payload-size",
                "20",
                "--batch",
                batch,
            ])
            .spawn()
            .expect("spawn");
            (shard, child)
        })
        .collect();
    for (shard, c) in children {
        let out = c.wait_with_output().expect("wait");
        assert_exit(&out, 0, "");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("shard {shard}: {count} items"))
        );
    }
    let mut all = HashSet::new();
    for shard in 0..4 {
        let recs = items(tmp.path(), shard);
        check_sublist(&recs, shard, &generated(shard, count, 20));
        for r in recs {
            assert!(all.insert(r.id), "id {} in two sublists", r.id);
        }
    }
}

#[test]
fn a_producer_started_after_another_finished_gets_higher_ids() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("b.txt");
    std::fs::write(
        &input,
        (0..300).map(|i| format!("line {i}\n")).collect::<String>(),
    )
    .expect("write input");
    let data = tmp.path().join("data");
    let a = run(&[
        "--shard",
        "0",
        "--data-dir",
        dir_arg(&data),
        "--nodes",
        &q.urls_arg(),
        "--generate",
        "500",
        "--batch",
        "64",
    ]);
    assert_exit(&a, 0, "");
    let a_max = items(&data, 0)
        .iter()
        .map(|r| r.id)
        .max()
        .expect("A wrote items");
    let b = run(&[
        "--shard",
        "1",
        "--data-dir",
        dir_arg(&data),
        "--nodes",
        &q.urls_arg(),
        "--input",
        dir_arg(&input),
        "--batch",
        "7",
    ]);
    assert_exit(&b, 0, "");
    let recs = items(&data, 1);
    let want: Vec<Vec<u8>> = (0..300).map(|i| format!("line {i}").into_bytes()).collect();
    check_sublist(&recs, 1, &want);
    let b_min = recs.iter().map(|r| r.id).min().expect("B wrote items");
    assert!(
        b_min > a_max,
        "B's lowest id {b_min} is not above A's highest {a_max}"
    );
}

/// At least 20 rounds of kill -9 at a random moment and restart; then every input line is in
/// the sublist exactly once, with the ID it had in every earlier snapshot.
#[test]
fn crash_loop_kill_9_then_resume_is_exactly_once() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("in.bin");
    let n = 40_000u64;
    let lines: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("item-{i}-{}", "z".repeat((i % 13) as usize)).into_bytes())
        .collect();
    let mut bytes = Vec::new();
    for l in &lines {
        bytes.extend_from_slice(l);
        bytes.push(b'\n');
    }
    std::fs::write(&input, &bytes).expect("write input");
    let data = tmp.path().join("data");
    let args = [
        "--shard",
        "9",
        "--data-dir",
        dir_arg(&data),
        "--nodes",
        &q.urls_arg(),
        "--input",
        dir_arg(&input),
        "--batch",
        "25",
    ];
    let seed: u64 = rand::thread_rng().gen();
    println!("crash loop seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new(); // seq -> id, from every snapshot
    let (mut kills, mut rounds) = (0, 0);
    while kills < 20 {
        rounds += 1;
        assert!(
            rounds < 200,
            "could not kill the producer 20 times in 200 rounds"
        );
        let mut child = producer_cmd(&args).spawn().expect("spawn");
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..120)));
        if child.try_wait().expect("try_wait").is_none() {
            // SIGKILL to this child's own pid.
            child.kill().expect("kill -9");
            kills += 1;
        }
        let out = child.wait_with_output().expect("wait");
        if out.status.code().is_some() {
            assert_exit(&out, 0, "");
            break; // finished before we could kill it: nothing more to crash
        }
        if shard_db_path(&data, 9).join("CURRENT").exists() {
            if let Ok(r) = ShardReader::open(&shard_db_path(&data, 9)) {
                for rec in r.iter() {
                    let rec = rec.expect("snapshot item");
                    let prev = seen.insert(rec.seq, rec.id);
                    assert!(
                        prev.is_none() || prev == Some(rec.id),
                        "seq {} changed id {prev:?} -> {}",
                        rec.seq,
                        rec.id
                    );
                }
            }
        }
    }
    println!(
        "{kills} kills in {rounds} rounds; {} items durable before the final run",
        seen.len()
    );
    let out = run(&args);
    assert_exit(&out, 0, "");
    let recs = items(&data, 9);
    check_sublist(&recs, 9, &lines);
    for r in &recs {
        if let Some(&id) = seen.get(&r.seq) {
            assert_eq!(id, r.id, "seq {} changed its id after a restart", r.seq);
        }
    }
    let again = run(&args);
    assert_exit(&again, 0, "");
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to do"));
}

#[test]
fn bad_inputs_get_clear_errors_and_exit_codes() {
    let mut q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let d = dir_arg(&data).to_string();
    let nodes = q.urls_arg();
    let path = |name: &str| -> PathBuf { tmp.path().join(name) };

    // --shard not a number: a usage error.
    assert_exit(
        &run(&[
            "--shard",
            "x1",
            "--data-dir",
            &d,
            "--nodes",
            &nodes,
            "--generate",
            "1",
        ]),
        2,
        "--shard",
    );
    assert_exit(
        &run(&[
            "--shard",
            "-1",
            "--data-dir",
            &d,
            "--nodes",
            &nodes,
            "--generate",
            "1",
        ]),
        2,
        "",
    );
    // Neither or both inputs / ID sources.
    assert_exit(
        &run(&["--shard", "1", "--data-dir", &d, "--nodes", &nodes]),
        2,
        "",
    );
    assert_exit(
        &run(&[
            "--shard",
            "1",
            "--data-dir",
            &d,
            "--nodes",
            &nodes,
            "--broker",
            "127.0.0.1:1",
            "--generate",
            "1",
        ]),
        2,
        "",
    );
    assert_exit(
        &run(&[
            "--shard",
            "1",
            "--data-dir",
            &d,
            "--nodes",
            &nodes,
            "--generate",
            "1",
            "--batch",
            "0",
        ]),
        2,
        "--batch",
    );

    // Missing input file.
    let missing = path("missing.txt");
    assert_exit(
        &run(&[
            "--shard",
            "1",
            "--data-dir",
            &d,
            "--nodes",
            &nodes,
            "--input",
            dir_arg(&missing),
        ]),
        3,
        "missing.txt",
    );

    // Empty input: an empty, finished sublist.
    std::fs::write(path("empty.txt"), b"").expect("write");
    assert_exit(
        &run(&[
            "--shard",
            "2",
            "--data-dir",
            &d,
            "--nodes",
            &nodes,
            "--input",
            dir_arg(&path("empty.txt")),
        ]),
        0,
        "empty",
    );
    assert!(items(&data, 2).is_empty());
    let again = run(&[
        "--shard",
        "2",
        "--data-dir",
        &d,
        "--nodes",
        &nodes,
        "--input",
        dir_arg(&path("empty.txt")),
    ]);
    assert_exit(&again, 0, "");
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to do"));

    // A 10 MB line is accepted, with its neighbours and arbitrary bytes.
    let big = vec![b'x'; 10_000_000];
    let mut content = b"first\n".to_vec();
    content.extend_from_slice(&big);
    content.extend_from_slice(b"\n\xff\xfe\x00raw\n");
    std::fs::write(path("big.txt"), &content).expect("write");
    assert_exit(
        &run(&[
            "--shard",
            "3",
            "--data-dir",
            &d,
            "--nodes",
            &nodes,
            "--input",
            dir_arg(&path("big.txt")),
        ]),
        0,
        "",
    );
    check_sublist(
        &items(&data, 3),
        3,
        &[b"first".to_vec(), big, b"\xff\xfe\x00raw".to_vec()],
    );

    // A line above the limit is refused before anything is written.
    let mut huge = b"ok\n".to_vec();
    huge.resize(huge.len() + producer::MAX_ITEM_BYTES + 1, b'y');
    std::fs::write(path("huge.txt"), &huge).expect("write");
    assert_exit(
        &run(&[
            "--shard",
            "4",
            "--data-dir",
            &d,
            "--nodes",
            &nodes,
            "--input",
            dir_arg(&path("huge.txt")),
        ]),
        3,
        "line 2 is longer than the limit",
    );
    assert!(ShardReader::open(&shard_db_path(&data, 4))
        .expect("open")
        .progress()
        .expect("progress")
        .is_none());

    // The data dir is a file.
    std::fs::write(path("afile"), b"x").expect("write");
    assert_exit(
        &run(&[
            "--shard",
            "1",
            "--data-dir",
            dir_arg(&path("afile")),
            "--nodes",
            &nodes,
            "--generate",
            "1",
        ]),
        4,
        "afile",
    );

    // A sublist written by another shard number.
    let other = path("other");
    assert_exit(
        &run(&[
            "--shard",
            "5",
            "--data-dir",
            dir_arg(&other),
            "--nodes",
            &nodes,
            "--generate",
            "10",
        ]),
        0,
        "",
    );
    std::fs::rename(shard_db_path(&other, 5), shard_db_path(&other, 6)).expect("rename");
    assert_exit(
        &run(&[
            "--shard",
            "6",
            "--data-dir",
            dir_arg(&other),
            "--nodes",
            &nodes,
            "--generate",
            "10",
        ]),
        4,
        "belongs to shard 5, not shard 6",
    );

    // Different input for an existing sublist.
    assert_exit(
        &run(&[
            "--shard",
            "3",
            "--data-dir",
            &d,
            "--nodes",
            &nodes,
            "--input",
            dir_arg(&path("empty.txt")),
        ]),
        4,
        "different input",
    );
    std::fs::rename(shard_db_path(&other, 6), shard_db_path(&other, 5)).expect("rename back");
    assert_exit(
        &run(&[
            "--shard",
            "5",
            "--data-dir",
            dir_arg(&other),
            "--nodes",
            &nodes,
            "--generate",
            "11",
        ]),
        4,
        "different input",
    );
    assert_exit(
        &run(&[
            "--shard",
            "5",
            "--data-dir",
            dir_arg(&other),
            "--nodes",
            &nodes,
            "--generate",
            "10",
            "--payload-size",
            "9",
        ]),
        4,
        "different input",
    );

    // In use by another producer (this process holds the lock).
    {
        let _held = ShardWriter::open(&data, 7).expect("hold shard 7");
        assert_exit(
            &run(&[
                "--shard",
                "7",
                "--data-dir",
                &d,
                "--nodes",
                &nodes,
                "--generate",
                "5",
            ]),
            4,
            "in use by another producer",
        );
    }

    // stdin works once and is not resumable.
    let mut c = producer_cmd(&[
        "--shard",
        "8",
        "--data-dir",
        &d,
        "--nodes",
        &nodes,
        "--input",
        "-",
    ]);
    let mut child = c.stdin(Stdio::piped()).spawn().expect("spawn");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"s0\ns1\n").expect("write stdin");
    }
    assert_exit(&child.wait_with_output().expect("wait"), 0, "");
    check_sublist(&items(&data, 8), 8, &[b"s0".to_vec(), b"s1".to_vec()]);
    assert_exit(
        &run(&[
            "--shard",
            "8",
            "--data-dir",
            &d,
            "--nodes",
            &nodes,
            "--input",
            "-",
        ]),
        4,
        "is finished with 2 items; input from stdin cannot be resumed",
    );

    // Bad node URLs; no broker listening.
    assert_exit(
        &run(&[
            "--shard",
            "10",
            "--data-dir",
            &d,
            "--nodes",
            "not-a-url",
            "--generate",
            "5",
            "--deadline",
            "1",
        ]),
        2,
        "",
    );
    assert_exit(
        &run(&[
            "--shard",
            "11",
            "--data-dir",
            &d,
            "--broker",
            "127.0.0.1:1",
            "--generate",
            "5",
            "--deadline",
            "1",
        ]),
        5,
        "",
    );

    // No quorum: 2 of 3 nodes down. Nothing is half-written.
    q.kill(0);
    q.kill(1);
    let out = run(&[
        "--shard",
        "12",
        "--data-dir",
        &d,
        "--nodes",
        &nodes,
        "--generate",
        "5",
        "--deadline",
        "1",
    ]);
    assert_exit(&out, 5, "quorum");
    if let Ok(r) = ShardReader::open(&shard_db_path(&data, 12)) {
        assert_eq!(r.iter().count(), 0);
    }
}

#[test]
fn broker_mode_produces_ordered_disjoint_sublists() {
    use std::sync::Arc;
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let client = rt
        .block_on(idclient::QuorumClient::connect(
            idclient::ClientConfig::new(q.urls()),
        ))
        .expect("quorum client");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(broker::run(
        listener,
        Arc::new(client),
        broker::BrokerConfig::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    let children: Vec<(u32, Child)> = (0..2u32)
        .map(|shard| {
            let c = producer_cmd(&[
                "--shard",
                &shard.to_string(),
                "--data-dir",
                dir_arg(tmp.path()),
                "--broker",
                &addr,
                "--generate",
                "1000",
                "--batch",
                "10",
            ])
            .spawn()
            .expect("spawn");
            (shard, c)
        })
        .collect();
    for (_, c) in children {
        assert_exit(&c.wait_with_output().expect("wait"), 0, "");
    }
    let _ = stop.send(());
    rt.block_on(server)
        .expect("join broker")
        .expect("broker ran");
    let mut all = HashSet::new();
    for shard in 0..2 {
        let recs = items(tmp.path(), shard);
        check_sublist(
            &recs,
            shard,
            &generated(shard, 1000, producer::DEFAULT_PAYLOAD_SIZE),
        );
        assert!(
            recs.iter().all(|r| all.insert(r.id)),
            "ids overlap across shards"
        );
    }
}

/// A majority stops answering mid-run: the producer exits 5 after its deadline with every
/// batch before the failure durable (none half-written), and a rerun finishes exactly once.
#[test]
fn losing_the_quorum_mid_run_stops_cleanly_and_resumes() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let count = 300_000u64;
    let args = [
        "--shard",
        "4",
        "--data-dir",
        dir_arg(tmp.path()),
        "--nodes",
        &q.urls_arg(),
        "--generate",
        &count.to_string(),
        "--payload-size",
        "8",
        "--batch",
        "10",
        "--deadline",
        "1",
    ];
    let child = producer_cmd(&args).spawn().expect("spawn");
    // Wait until some batches are durable, then freeze a majority.
    let db = shard_db_path(tmp.path(), 4);
    let mut waited = 0;
    while ShardReader::open(&db)
        .ok()
        .and_then(|r| r.progress().ok().flatten())
        .is_none()
    {
        std::thread::sleep(Duration::from_millis(20));
        waited += 1;
        assert!(waited < 1500, "the producer wrote nothing in 30 s");
    }
    q.pause(0);
    q.pause(1);
    let out = child.wait_with_output().expect("wait");
    q.resume(0);
    q.resume(1);
    assert_exit(&out, 5, "no quorum");
    let r = ShardReader::open(&db).expect("open");
    let p = r.progress().expect("progress").expect("a marker");
    let recs: Vec<Record> = r.iter().collect::<Result<_, _>>().expect("items");
    assert!(!p.finished && p.next_seq < count);
    assert_eq!(recs.len() as u64, p.next_seq, "marker and items disagree");
    drop(r);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("{} items are durably in the sublist", p.next_seq)),
        "{stderr}"
    );
    // The rerun may use another batch size: the marker counts items, not batches.
    let mut rerun = args.to_vec();
    let b = rerun.iter().position(|a| *a == "--batch").expect("--batch") + 1;
    rerun[b] = "50000";
    let out = run(&rerun);
    assert_exit(&out, 0, "");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("resumed after {}", p.next_seq)));
    let all = items(tmp.path(), 4);
    check_sublist(&all, 4, &generated(4, count, 8));
    assert_eq!(
        &all[..recs.len()],
        &recs[..],
        "durable items changed on resume"
    );
}

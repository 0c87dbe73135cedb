//! The `producer` binary as OS processes against a real local Redis quorum and real
//! RocksDB: parallel shards, real-time order, kill -9 crash loop with exactly-once check,
//! broker mode, and every bad-input case of the issue.

mod common;

use common::{assert_exit, producer_cmd, quorum, run, stderr_lines};
use idtools::cluster::LocalQuorum;
use producer::generate_payload;
use qformat::names::shard_db_path;
use qformat::Record;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashSet};
use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;
use sublist::shard::{ShardReader, ShardWriter};

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

/// A producer's command line, built in the order a user types it: `--shard` and
/// `--data-dir` first, then the ID source and what each run adds, so a test states only
/// what differs.
struct Args(Vec<String>);

impl Args {
    fn shard(shard: impl Display, data: impl AsRef<Path>) -> Args {
        Args(Vec::new())
            .arg("--shard", shard)
            .arg("--data-dir", dir_arg(data.as_ref()))
    }

    fn nodes(self, nodes: &str) -> Args {
        self.arg("--nodes", nodes)
    }

    fn broker(self, addr: &str) -> Args {
        self.arg("--broker", addr)
    }

    /// A file, or `-` for stdin.
    fn input(self, path: impl AsRef<Path>) -> Args {
        self.arg("--input", dir_arg(path.as_ref()))
    }

    fn generate(self, count: u64) -> Args {
        self.arg("--generate", count)
    }

    fn payload_size(self, bytes: u64) -> Args {
        self.arg("--payload-size", bytes)
    }

    fn batch(self, size: impl Display) -> Args {
        self.arg("--batch", size)
    }

    fn deadline_ms(self, ms: u64) -> Args {
        self.arg("--deadline-ms", ms)
    }

    fn arg(mut self, flag: &str, value: impl Display) -> Args {
        self.0.push(flag.to_string());
        self.0.push(value.to_string());
        self
    }

    /// The same command line with `flag`'s value replaced (a rerun that changes one).
    fn with(mut self, flag: &str, value: impl Display) -> Args {
        let i = self.0.iter().position(|a| a == flag).expect("flag given") + 1;
        self.0[i] = value.to_string();
        self
    }

    fn strs(&self) -> Vec<&str> {
        self.0.iter().map(String::as_str).collect()
    }

    fn cmd(&self) -> Command {
        producer_cmd(&self.strs())
    }

    fn run(&self) -> Output {
        run(&self.strs())
    }
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
            let child = Args::shard(shard, tmp.path())
                .nodes(&nodes)
                .generate(count)
                .payload_size(20)
                .batch(batch)
                .cmd()
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
    let a = Args::shard(0, &data)
        .nodes(&q.urls_arg())
        .generate(500)
        .batch(64)
        .run();
    assert_exit(&a, 0, "");
    let a_max = items(&data, 0)
        .iter()
        .map(|r| r.id)
        .max()
        .expect("A wrote items");
    let b = Args::shard(1, &data)
        .nodes(&q.urls_arg())
        .input(&input)
        .batch(7)
        .run();
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

/// Exactly 20 rounds of kill -9 and restart, then a final run; every input line ends up in
/// the sublist exactly once, with the ID it had in every earlier snapshot.
///
/// No run can finish before its kill: run i stalls (the `QLIST_PRODUCER_TEST_STALL_AFTER`
/// hook) once `(i + 1) * STEP` items are durable, far before the end of the input. Even
/// rounds kill at a random moment (0-120 ms after start, possibly before anything is
/// durable: seed printed); odd rounds kill only once the stall is announced, so at least
/// `(i + 1) * STEP` items were durable before that kill: work is durable between kills on
/// any machine, fast or slow.
#[test]
fn crash_loop_kill_9_then_resume_is_exactly_once() {
    const KILLS: u64 = 20;
    const STEP: u64 = 1000;
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let input = tmp.path().join("in.bin");
    let n = 40_000u64;
    assert!(n > (KILLS + 1) * STEP, "the input must outlast every stall");
    let lines: Vec<Vec<u8>> = (0..n)
        .map(|i| format!("item-{i}-{}", "z".repeat((i % 13) as usize)).into_bytes())
        .collect();
    std::fs::write(&input, join_lines(&lines)).expect("write input");
    let data = tmp.path().join("data");
    let args = Args::shard(9, &data)
        .nodes(&q.urls_arg())
        .input(&input)
        .batch(25);
    let seed: u64 = rand::thread_rng().gen();
    println!("crash loop seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new(); // seq -> id, from every snapshot
    let mut kills = 0u64;
    let mut durable = 0u64;
    for round in 0..KILLS {
        let stall_at = (round + 1) * STEP;
        let mut child = spawn_with_stall(&args, stall_at);
        let stalled = stall_watch(&mut child);
        if round % 2 == 0 {
            std::thread::sleep(Duration::from_millis(rng.gen_range(0..120)));
        } else {
            stalled
                .recv_timeout(Duration::from_secs(120))
                .expect("the producer did not reach its stall point in 120 s");
        }
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "round {round}: the producer exited before its kill"
        );
        // SIGKILL to this child's own pid.
        child.kill().expect("kill -9");
        kills += 1;
        let status = child.wait().expect("wait");
        assert_eq!(status.code(), None, "round {round}: not killed by a signal");
        let now = snapshot(&data, &mut seen);
        assert!(
            now >= durable,
            "round {round}: durable items went from {durable} to {now}"
        );
        if round % 2 == 1 {
            assert!(
                now >= stall_at,
                "round {round}: stalled with {now} durable items, {stall_at} expected"
            );
        }
        durable = now;
    }
    assert_eq!(kills, KILLS);
    println!("{kills} kills; {durable} items durable before the final run");
    let out = args.run();
    assert_exit(&out, 0, "");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("resumed after {durable}")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let recs = items(&data, 9);
    check_sublist(&recs, 9, &lines);
    for r in &recs {
        if let Some(&id) = seen.get(&r.seq) {
            assert_eq!(id, r.id, "seq {} changed its id after a restart", r.seq);
        }
    }
    let again = args.run();
    assert_exit(&again, 0, "");
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to do"));
}

/// The producer's test hook: stall once this many items are durable (see `producer::Config`).
const STALL_ENV: &str = "QLIST_PRODUCER_TEST_STALL_AFTER";

/// Reads the child's stderr on a thread; the receiver gets a message when the producer
/// announces its test stall. (stderr is drained to the end so the child never blocks on it.)
fn stall_watch(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.contains(producer::STALL_ANNOUNCE) {
                let _ = tx.send(line);
            }
        }
    });
    rx
}

/// Reads the sublist (if it exists yet), checks no (seq, id) pair changed since earlier
/// snapshots, and returns how many items are durable.
fn snapshot(data: &Path, seen: &mut BTreeMap<u64, u64>) -> u64 {
    let db = shard_db_path(data, 9);
    if !db.join("CURRENT").exists() {
        return 0;
    }
    let r = ShardReader::open(&db).expect("open the sublist after a kill");
    let mut count = 0;
    for rec in r.iter() {
        let rec = rec.expect("snapshot item");
        let prev = seen.insert(rec.seq, rec.id);
        assert!(
            prev.is_none() || prev == Some(rec.id),
            "seq {} changed id {prev:?} -> {}",
            rec.seq,
            rec.id
        );
        count += 1;
    }
    count
}

#[test]
fn bad_inputs_get_clear_errors_and_exit_codes() {
    let mut q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let d = dir_arg(&data).to_string();
    let nodes = q.urls_arg();
    let path = |name: &str| -> PathBuf { tmp.path().join(name) };
    // Most cases run one shard of `data` against the quorum.
    let shard = |n: u32| Args::shard(n, &d).nodes(&nodes);

    // --shard not a number: a usage error.
    assert_exit(
        &Args::shard("x1", &d).nodes(&nodes).generate(1).run(),
        2,
        "--shard",
    );
    assert_exit(
        &Args::shard("-1", &d).nodes(&nodes).generate(1).run(),
        2,
        "",
    );
    // Neither or both inputs / ID sources.
    assert_exit(&shard(1).run(), 2, "");
    assert_exit(&shard(1).broker("127.0.0.1:1").generate(1).run(), 2, "");
    assert_exit(&shard(1).generate(1).batch(0).run(), 2, "--batch");

    // Missing input file.
    let missing = path("missing.txt");
    assert_exit(&shard(1).input(&missing).run(), 3, "missing.txt");

    // Empty input: an empty, finished sublist.
    std::fs::write(path("empty.txt"), b"").expect("write");
    assert_exit(&shard(2).input(path("empty.txt")).run(), 0, "empty");
    assert!(items(&data, 2).is_empty());
    let again = shard(2).input(path("empty.txt")).run();
    assert_exit(&again, 0, "");
    assert!(String::from_utf8_lossy(&again.stdout).contains("nothing to do"));

    // A 10 MB line is accepted, with its neighbours and arbitrary bytes.
    let big = vec![b'x'; 10_000_000];
    let mut content = b"first\n".to_vec();
    content.extend_from_slice(&big);
    content.extend_from_slice(b"\n\xff\xfe\x00raw\n");
    std::fs::write(path("big.txt"), &content).expect("write");
    assert_exit(&shard(3).input(path("big.txt")).run(), 0, "");
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
        &shard(4).input(path("huge.txt")).run(),
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
        &Args::shard(1, path("afile"))
            .nodes(&nodes)
            .generate(1)
            .run(),
        4,
        "afile",
    );

    // A sublist written by another shard number.
    let other = path("other");
    let other_shard = |n: u32| Args::shard(n, &other).nodes(&nodes);
    assert_exit(&other_shard(5).generate(10).run(), 0, "");
    std::fs::rename(shard_db_path(&other, 5), shard_db_path(&other, 6)).expect("rename");
    assert_exit(
        &other_shard(6).generate(10).run(),
        4,
        "belongs to shard 5, not shard 6",
    );

    // Different input for an existing sublist.
    assert_exit(
        &shard(3).input(path("empty.txt")).run(),
        4,
        "different input",
    );
    std::fs::rename(shard_db_path(&other, 6), shard_db_path(&other, 5)).expect("rename back");
    assert_exit(&other_shard(5).generate(11).run(), 4, "different input");
    assert_exit(
        &other_shard(5).generate(10).payload_size(9).run(),
        4,
        "different input",
    );

    // In use by another producer (this process holds the lock).
    {
        let _held = ShardWriter::open(&data, 7).expect("hold shard 7");
        assert_exit(&shard(7).generate(5).run(), 4, "in use by another producer");
    }

    // stdin works once and is not resumable.
    let mut c = shard(8).input("-").cmd();
    let mut child = c.stdin(Stdio::piped()).spawn().expect("spawn");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"s0\ns1\n").expect("write stdin");
    }
    assert_exit(&child.wait_with_output().expect("wait"), 0, "");
    check_sublist(&items(&data, 8), 8, &[b"s0".to_vec(), b"s1".to_vec()]);
    assert_exit(
        &shard(8).input("-").run(),
        4,
        "is finished with 2 items; input from stdin cannot be resumed",
    );

    // Bad node URLs; no broker listening.
    assert_exit(
        &Args::shard(10, &d)
            .nodes("not-a-url")
            .generate(5)
            .deadline_ms(1000)
            .run(),
        2,
        "",
    );
    assert_exit(
        &Args::shard(11, &d)
            .broker("127.0.0.1:1")
            .generate(5)
            .deadline_ms(1000)
            .run(),
        5,
        "",
    );

    // No quorum: 2 of 3 nodes down. Nothing is half-written.
    q.kill(0);
    q.kill(1);
    let out = shard(12).generate(5).deadline_ms(1000).run();
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
            let c = Args::shard(shard, tmp.path())
                .broker(&addr)
                .generate(1000)
                .batch(10)
                .cmd()
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
    let args = Args::shard(4, tmp.path())
        .nodes(&q.urls_arg())
        .generate(count)
        .payload_size(8)
        .batch(10)
        .deadline_ms(1000);
    let child = args.cmd().spawn().expect("spawn");
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
    let out = args.with("--batch", 50000).run();
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

/// Starts a producer that stalls once `after` items are durable, stdin piped (a line on
/// stdin, or closing it, lets it go on).
fn spawn_with_stall(args: &Args, after: u64) -> Child {
    args.cmd()
        .env(STALL_ENV, after.to_string())
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawn")
}

/// [`spawn_with_stall`], returning once the producer announced the stall.
fn spawn_stalled(args: &Args, after: u64) -> Child {
    let mut child = spawn_with_stall(args, after);
    let stalled = stall_watch(&mut child);
    if let Err(e) = stalled.recv_timeout(Duration::from_secs(120)) {
        let _ = child.kill();
        panic!("the producer did not reach its stall point after {after} items in 120 s: {e}");
    }
    child
}

/// Lets a stalled producer go on; returns its exit code and the stderr lines after the stall.
fn release_with_stderr(
    mut child: Child,
    rx: std::sync::mpsc::Receiver<String>,
) -> (Option<i32>, String) {
    drop(child.stdin.take());
    let status = child.wait().expect("wait");
    (status.code(), rx.iter().collect::<Vec<_>>().join("\n"))
}

/// Starts a stalled producer and returns it with a receiver of all its stderr lines.
fn spawn_stalled_keep_stderr(
    args: &Args,
    after: u64,
) -> (Child, std::sync::mpsc::Receiver<String>) {
    let mut child = spawn_with_stall(args, after);
    let rx = stderr_lines(&mut child);
    loop {
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(line) if line.contains(producer::STALL_ANNOUNCE) => return (child, rx),
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!("the producer did not reach its stall point after {after} items: {e}");
            }
        }
    }
}

/// `lines` lines of `width` bytes (newline included), each unique.
fn wide_lines(lines: usize, width: usize) -> Vec<Vec<u8>> {
    (0..lines)
        .map(|i| {
            let mut l = format!("line-{i:08}-").into_bytes();
            l.resize(width - 1, b'.');
            l
        })
        .collect()
}

fn join_lines(lines: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(l);
        out.push(b'\n');
    }
    out
}

/// After the quorum is wiped (FLUSHALL), a resumed producer gets IDs below the
/// sublist's last ID. It must say that the IDs went backwards (the nodes lost
/// acknowledged writes) and write nothing, not print an internal `IdRange { .. }`.
#[test]
fn ids_going_backwards_after_a_wiped_quorum_are_refused_clearly() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let args = Args::shard(0, &data)
        .nodes(&q.urls_arg())
        .generate(5000)
        .batch(50)
        .deadline_ms(5000);
    let mut child = spawn_stalled(&args, 500);
    child.kill().expect("kill -9");
    child.wait().expect("wait");
    let before = items(&data, 0);
    let last_id = before.last().expect("durable items").id;
    assert!(
        before.len() >= 500 && last_id > 100,
        "{} items",
        before.len()
    );
    for port in q.ports() {
        let out = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "FLUSHALL"])
            .output()
            .expect("run redis-cli (is it installed?)");
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("OK"),
            "FLUSHALL on port {port}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = args.run();
    for needle in [
        "IDs went backwards",
        &format!("not above {last_id}, the last ID already in sublist"),
        "lost acknowledged writes",
        "nothing was written",
    ] {
        assert_exit(&out, 5, needle);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("IdRange"),
        "internal type in the message: {stderr}"
    );
    assert_eq!(items(&data, 0), before, "the sublist changed");
}

/// `--input <(zcat f.gz)` gives a pipe as /dev/fd/N. It cannot be read twice
/// (the first pass used to eat it: "0 were read"); it is read once, like stdin, said up
/// front, and refused on a started sublist. A named FIFO likewise.
#[test]
fn a_pipe_or_fifo_as_input_is_read_once_like_stdin() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let d = dir_arg(&data).to_string();
    let nodes = q.urls_arg();
    let pipe_run = |shard: &str| -> Output {
        Command::new("bash")
            .arg("-c")
            .arg(r#"exec "$0" "$@" --input <(printf 'p0\np1\n\np3\n')"#)
            .arg(env!("CARGO_BIN_EXE_producer"))
            .args(Args::shard(shard, &d).nodes(&nodes).strs())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .expect("run bash")
    };
    let out = pipe_run("0");
    assert_exit(&out, 0, "pipe or FIFO");
    check_sublist(
        &items(&data, 0),
        0,
        &[b"p0".to_vec(), b"p1".to_vec(), vec![], b"p3".to_vec()],
    );
    assert_exit(&pipe_run("0"), 4, "cannot be resumed");

    let fifo = tmp.path().join("fifo");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            // Blocks until the producer opens the FIFO for reading.
            std::fs::write(&fifo, b"f0\nf1\n").expect("write the fifo");
        })
    };
    let out = Args::shard(1, &d).nodes(&nodes).input(&fifo).run();
    assert_exit(&out, 0, "pipe or FIFO");
    writer.join().expect("fifo writer");
    check_sublist(&items(&data, 1), 1, &[b"f0".to_vec(), b"f1".to_vec()]);
}

/// An input edited in place (same size) while the producer reads it used to be
/// stored edited, and a rerun with the original said "nothing to do". What was read is
/// hashed and compared with the first pass; a resume compares the stored items with the
/// input's first lines.
#[test]
fn an_input_edited_in_place_during_a_run_is_caught() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let input = tmp.path().join("in.txt");
    // 4 MB: more than the producer's 1 MiB read buffer, so the end of the file is read
    // from disk after the stall.
    let (count, width) = (4000usize, 1000usize);
    let lines = wide_lines(count, width);
    let original = join_lines(&lines);
    std::fs::write(&input, &original).expect("write input");
    let args = Args::shard(0, &data)
        .nodes(&q.urls_arg())
        .input(&input)
        .batch(100);
    let (child, rx) = spawn_stalled_keep_stderr(&args, 100);
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&input)
            .expect("open input for editing");
        f.seek(SeekFrom::Start(3500 * width as u64)).expect("seek");
        f.write_all(b"EDITED").expect("edit");
        f.sync_all().expect("sync");
    }
    let (code, stderr) = release_with_stderr(child, rx);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(stderr.contains("edited while it was read"), "{stderr}");
    let r = ShardReader::open(&shard_db_path(&data, 0)).expect("open");
    let p = r.progress().expect("progress").expect("marker");
    assert!(
        !p.finished,
        "a sublist of an edited input was marked finished"
    );
    drop(r);

    // The original again: its fingerprint matches, but the sublist holds the edited line.
    std::fs::write(&input, &original).expect("restore input");
    let out = args.run();
    assert_exit(&out, 3, "line 3501 is not item 3500");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("nothing to do"));
}

/// Exit code 3 from the command line: the input shrinks under a running producer (here
/// truncated while it stalls): it stops, says so, and leaves the sublist unfinished.
#[test]
fn an_input_truncated_during_a_run_exits_3() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let input = tmp.path().join("in.txt");
    let lines = wide_lines(4000, 1000);
    std::fs::write(&input, join_lines(&lines)).expect("write input");
    let args = Args::shard(0, &data)
        .nodes(&q.urls_arg())
        .input(&input)
        .batch(100);
    let (child, rx) = spawn_stalled_keep_stderr(&args, 100);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&input)
        .and_then(|f| f.set_len(10 * 1000))
        .expect("truncate input");
    let (code, stderr) = release_with_stderr(child, rx);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("changed since the sublist was started") && stderr.contains("4000 items"),
        "{stderr}"
    );
    let r = ShardReader::open(&shard_db_path(&data, 0)).expect("open");
    assert!(!r.progress().expect("progress").expect("marker").finished);
}

/// A finished sublist needs no ID generator: "nothing to do" with every node down.
#[test]
fn nothing_to_do_with_every_node_down() {
    let mut q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let args = Args::shard(2, tmp.path())
        .nodes(&q.urls_arg())
        .generate(30)
        .deadline_ms(1000);
    assert_exit(&args.run(), 0, "");
    for i in 0..3 {
        q.kill(i);
    }
    let out = args.run();
    assert_exit(&out, 0, "");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("already finished (30 items): nothing to do"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Exit code 5 for a node that does not fsync every write; nothing is written.
#[test]
fn an_unsafe_node_exits_5() {
    let q = LocalQuorum::temp_with_args(3, &["--appendfsync".into(), "everysec".into()])
        .expect("cannot start a local redis-server quorum (is redis-server installed?)");
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = Args::shard(0, tmp.path())
        .nodes(&q.urls_arg())
        .generate(10)
        .deadline_ms(2000)
        .run();
    assert_exit(&out, 5, "is unsafe");
    assert_exit(&out, 5, "appendfsync");
    if let Ok(r) = ShardReader::open(&shard_db_path(tmp.path(), 0)) {
        assert_eq!(r.iter().count(), 0, "items written with an unsafe node");
    }
}

/// Exit code 4 when the sublist's disk is full, naming the error once; every batch before
/// it stays durable, and the same command finishes once space returns.
#[test]
fn a_full_disk_exits_4_and_resumes() {
    let q = quorum(3);
    let fs = testkit::tmpfs::Tmpfs::mount(8 << 20);
    let data = fs.dir.join("data");
    let args = Args::shard(0, &data)
        .nodes(&q.urls_arg())
        .generate(100_000)
        .payload_size(200)
        .batch(1000);
    let out = args.run();
    assert_exit(&out, 4, "No space left on device");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error_line = stderr
        .lines()
        .find(|l| l.contains("producer: error:"))
        .expect("an error line");
    // RocksDB names the error twice itself ("IO error: No space left on device: While
    // appending to file: F: No space left on device"); the producer adds no third copy.
    assert_eq!(
        error_line
            .matches("IO error: No space left on device")
            .count(),
        1,
        "{error_line}"
    );
    assert_eq!(error_line.matches("rocksdb:").count(), 1, "{error_line}");
    let durable = ShardReader::open(&shard_db_path(&data, 0))
        .ok()
        .and_then(|r| r.progress().ok().flatten())
        .map_or(0, |p| p.next_seq);
    // Space returns: move the sublist to a real disk and finish it there.
    let tmp = tempfile::tempdir().expect("tempdir");
    let moved = tmp.path().join("data");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&data)
        .arg(&moved)
        .status()
        .expect("run cp");
    assert!(cp.success(), "cp -a the sublist off the tmpfs");
    let out = args.with("--data-dir", dir_arg(&moved)).run();
    assert_exit(&out, 0, "");
    if durable > 0 {
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("resumed after {durable}")),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    check_sublist(&items(&moved, 0), 0, &generated(0, 100_000, 200));
}

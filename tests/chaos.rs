//! Chaos test of the whole pipeline with real processes: a local 5-node quorum, two
//! idbrokers, four producers (two direct, two through the brokers) and two `idctl bench
//! --history` side loads (direct and through the brokers), while a seeded fault schedule
//! kill -9s and restarts a minority of Redis nodes, SIGSTOPs and SIGCONTs a node and a
//! broker, kill -9s a broker (restarted on its port) and kill -9s producers (restarted
//! with the same arguments: they resume). Then: `merger --out` and `merger verify` pass,
//! list.bin holds every generated item exactly once, each shard's items in input order,
//! the recorded ID histories pass the checker, and no ID of list.bin appears in them.
//!
//! - `QLIST_CHAOS_SEED=S` replays the fault schedule of seed S (printed at the start).
//!   The schedule (which fault, when, on whom) is replayed exactly; the processes'
//!   interleaving is the kernel's.
//! - `QLIST_CHAOS_SECS=N` runs the faults for N seconds (default [`DEFAULT_SECS`]); the
//!   producers' work grows with it.
//!
//! Needs the workspace binaries: `cargo build --release --workspace --bins`.

mod common;

use common::{bin, check_output, read_history, Proc};
use idtools::cluster::{free_port, LocalQuorum};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Default length of the fault window: the whole test stays well under a minute.
const DEFAULT_SECS: u64 = 20;
/// Items each producer generates per second of fault window: enough that producers are
/// still working when the faults stop (measured ~1500 items/s per producer at batch 5
/// on 2 cores under this load), so every fault hits live traffic.
const ITEMS_PER_SEC: u64 = 1500;
const BATCH: &str = "5";
const PAYLOAD_SIZE: usize = 32;
/// Once faults stop, everything must finish within this.
const FINISH_TIMEOUT: Duration = Duration::from_secs(120);
/// At most this many of the 5 nodes are down or paused at once: a minority.
const MAX_NODES_DOWN: usize = 2;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
    )
}

fn log_file(dir: &Path, name: &str) -> (File, File) {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .expect("open log file");
    let g = f.try_clone().expect("clone log file handle");
    (f, g)
}

fn tail(dir: &Path, name: &str) -> String {
    let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

struct Broker {
    port: u16,
    proc: Proc,
    paused: bool,
}

fn start_broker(port: u16, urls: &str, logs: &Path, b: usize) -> Proc {
    let spawn = || {
        let (out, err) = log_file(logs, &format!("broker-{b}"));
        Proc::spawn(
            format!("idbroker {b}"),
            Command::new(bin("idbroker"))
                .args(["--listen", &format!("127.0.0.1:{port}"), "--nodes", urls])
                .stdout(out)
                .stderr(err),
        )
    };
    let mut p = spawn();
    // The port can linger for a moment after a kill -9: retry the start a few times.
    let limit = Duration::from_secs(15);
    let until = Instant::now() + limit;
    testkit::wait_for(
        &format!("idbroker {b} listens on port {port}"),
        limit,
        || {
            // Our child must be alive and hold the listening socket itself: a connect
            // alone could reach whoever else took the port.
            if let Some(status) = p.try_wait() {
                assert!(
                    Instant::now() < until,
                    "idbroker {b} keeps failing to start ({status}):\n{}",
                    tail(logs, &format!("broker-{b}"))
                );
                std::thread::sleep(Duration::from_millis(200));
                p = spawn();
            }
            p.pid().is_some_and(|pid| common::listens_on(pid, port))
        },
    );
    p
}

struct Producer {
    shard: u32,
    args: Vec<String>,
    proc: Proc,
    done: bool,
    restarts: u32,
}

impl Producer {
    fn spawn(shard: u32, args: &[String], logs: &Path) -> Proc {
        let (out, err) = log_file(logs, &format!("producer-{shard}"));
        Proc::spawn(
            format!("producer {shard}"),
            Command::new(bin("producer"))
                .args(args)
                .stdout(out)
                .stderr(err),
        )
    }

    /// Reaps an exited producer: done on success; restarted (same arguments) when the ID
    /// generator was unavailable (exit 5: expected under faults); anything else fails.
    fn poll(&mut self, logs: &Path) {
        if self.done {
            return;
        }
        let Some(status) = self.proc.try_wait() else {
            return;
        };
        match status.code() {
            Some(0) => self.done = true,
            Some(5) => {
                self.restarts += 1;
                self.proc = Producer::spawn(self.shard, &self.args, logs);
            }
            _ => panic!(
                "producer {} failed ({status}):\n{}",
                self.shard,
                tail(logs, &format!("producer-{}", self.shard))
            ),
        }
    }
}

#[derive(Default, Debug)]
struct Tally(BTreeMap<&'static str, u32>);

impl Tally {
    fn add(&mut self, what: &'static str) {
        *self.0.entry(what).or_default() += 1;
    }
}

#[test]
fn chaos_pipeline() {
    let seed = env_u64("QLIST_CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let secs = env_u64("QLIST_CHAOS_SECS").unwrap_or(DEFAULT_SECS).max(1);
    eprintln!("chaos seed {seed}, {secs} s of faults (replay: QLIST_CHAOS_SEED={seed} QLIST_CHAOS_SECS={secs} cargo test --release --test chaos)");
    let mut rng = StdRng::seed_from_u64(seed);

    let tmp = tempfile::tempdir().expect("tempdir");
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).expect("log dir");
    let data = tmp.path().join("data");
    let mut quorum = LocalQuorum::temp(5)
        .expect("start a local 5-node redis quorum (is redis-server installed?)");
    let urls = quorum.urls_arg();

    let mut brokers: Vec<Broker> = (0..2)
        .map(|b| {
            let port = free_port().expect("free port");
            Broker {
                port,
                proc: start_broker(port, &urls, &logs, b),
                paused: false,
            }
        })
        .collect();
    let addrs: Vec<String> = brokers
        .iter()
        .map(|b| format!("127.0.0.1:{}", b.port))
        .collect();

    let items = secs * ITEMS_PER_SEC;
    let mut producers: Vec<Producer> = (0..4u32)
        .map(|shard| {
            let source = match shard {
                0 | 1 => vec!["--nodes".to_string(), urls.clone()],
                // Each broker producer prefers a different broker; both fail over.
                2 => vec!["--broker".to_string(), format!("{},{}", addrs[0], addrs[1])],
                _ => vec!["--broker".to_string(), format!("{},{}", addrs[1], addrs[0])],
            };
            let mut args = vec![
                "--shard".to_string(),
                shard.to_string(),
                "--data-dir".to_string(),
                data.display().to_string(),
            ];
            args.extend(source);
            args.extend(
                [
                    "--generate",
                    &items.to_string(),
                    "--payload-size",
                    &PAYLOAD_SIZE.to_string(),
                    "--batch",
                    BATCH,
                    "--no-progress-bar",
                ]
                .map(String::from),
            );
            let proc = Producer::spawn(shard, &args, &logs);
            Producer {
                shard,
                args,
                proc,
                done: false,
                restarts: 0,
            }
        })
        .collect();

    // Side loads recording every request for the history checker.
    let histories = [
        tmp.path().join("history-direct.txt"),
        tmp.path().join("history-broker.txt"),
    ];
    let bench_secs = secs.to_string();
    let mut benches: Vec<(Proc, PathBuf)> = Vec::new();
    for (i, (flag, target)) in [("--nodes", urls.clone()), ("--broker", addrs.join(","))]
        .into_iter()
        .enumerate()
    {
        let (out, err) = log_file(&logs, &format!("bench-{i}"));
        let p = Proc::spawn(
            format!("idctl bench {flag}"),
            Command::new(bin("idctl"))
                .args([
                    "bench",
                    flag,
                    &target,
                    "--clients",
                    "2",
                    "--seconds",
                    &bench_secs,
                    "--count",
                    "3",
                    "--deadline-ms",
                    "3000",
                    "--history",
                ])
                .arg(&histories[i])
                .stdout(out)
                .stderr(err),
        );
        benches.push((p, histories[i].clone()));
    }

    // The fault schedule.
    let mut killed_nodes: Vec<usize> = Vec::new();
    let mut paused_nodes: Vec<(usize, Instant)> = Vec::new();
    let mut dead_brokers: Vec<(usize, Instant)> = Vec::new();
    let mut tally = Tally::default();
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(rng.gen_range(100..=600)));
        let now = Instant::now();
        for p in &mut producers {
            p.poll(&logs);
        }
        // Undo faults whose time is up.
        paused_nodes.retain(|&(i, until)| {
            if now >= until {
                quorum.resume(i);
                false
            } else {
                true
            }
        });
        for b in &mut brokers {
            if b.paused && rng.gen_bool(0.5) {
                b.proc.signal(libc::SIGCONT);
                b.paused = false;
            }
        }
        let mut still_dead = Vec::new();
        for (b, until) in dead_brokers.drain(..) {
            if now >= until {
                brokers[b].proc = start_broker(brokers[b].port, &urls, &logs, b);
                tally.add("broker restarted");
            } else {
                still_dead.push((b, until));
            }
        }
        dead_brokers = still_dead;

        let down = killed_nodes.len() + paused_nodes.len();
        match rng.gen_range(0..7) {
            0 | 1 if down < MAX_NODES_DOWN => {
                let i = rng.gen_range(0..5);
                if !killed_nodes.contains(&i) && !paused_nodes.iter().any(|&(p, _)| p == i) {
                    quorum.kill(i);
                    killed_nodes.push(i);
                    tally.add("node kill -9");
                }
            }
            0..=2 if !killed_nodes.is_empty() => {
                let i = killed_nodes.remove(rng.gen_range(0..killed_nodes.len()));
                quorum
                    .restart(i)
                    .expect("restart a redis node on its port and data dir");
                tally.add("node restart");
            }
            3 if down < MAX_NODES_DOWN => {
                let i = rng.gen_range(0..5);
                if !killed_nodes.contains(&i) && !paused_nodes.iter().any(|&(p, _)| p == i) {
                    quorum.pause(i);
                    paused_nodes.push((i, now + Duration::from_millis(rng.gen_range(200..=1500))));
                    tally.add("node SIGSTOP");
                }
            }
            4 => {
                let b = rng.gen_range(0..2);
                let other_ok =
                    !brokers[1 - b].paused && !dead_brokers.iter().any(|&(d, _)| d == 1 - b);
                if other_ok && !brokers[b].paused && !dead_brokers.iter().any(|&(d, _)| d == b) {
                    if rng.gen_bool(0.5) {
                        brokers[b].proc.signal(libc::SIGSTOP);
                        brokers[b].paused = true;
                        tally.add("broker SIGSTOP");
                    } else {
                        brokers[b].proc.kill();
                        dead_brokers
                            .push((b, now + Duration::from_millis(rng.gen_range(100..=1000))));
                        tally.add("broker kill -9");
                    }
                }
            }
            5 => {
                let p = &mut producers[rng.gen_range(0..4)];
                if !p.done {
                    p.proc.kill();
                    p.restarts += 1;
                    p.proc = Producer::spawn(p.shard, &p.args, &logs);
                    tally.add("producer kill -9 + restart");
                }
            }
            _ => {}
        }
    }

    // Heal everything, then let the work finish.
    for (i, _) in paused_nodes.drain(..) {
        quorum.resume(i);
    }
    for i in killed_nodes.drain(..) {
        quorum.restart(i).expect("restart a redis node");
    }
    for b in &mut brokers {
        if b.paused {
            b.proc.signal(libc::SIGCONT);
            b.paused = false;
        }
    }
    for (b, _) in dead_brokers.drain(..) {
        brokers[b].proc = start_broker(brokers[b].port, &urls, &logs, b);
    }
    eprintln!("faults: {:?}", tally.0);
    let finish_by = Instant::now() + FINISH_TIMEOUT;
    while producers.iter().any(|p| !p.done) {
        for p in &mut producers {
            p.poll(&logs);
        }
        if Instant::now() > finish_by {
            let stuck: Vec<String> = producers
                .iter()
                .filter(|p| !p.done)
                .map(|p| {
                    format!(
                        "producer {}:\n{}",
                        p.shard,
                        tail(&logs, &format!("producer-{}", p.shard))
                    )
                })
                .collect();
            panic!("seed {seed}: producers did not finish within {FINISH_TIMEOUT:?} after the faults stopped:\n{}", stuck.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let restarts: Vec<u32> = producers.iter().map(|p| p.restarts).collect();
    eprintln!("producer restarts per shard: {restarts:?}");
    for (i, (p, path)) in benches.iter_mut().enumerate() {
        let mut status = None;
        testkit::wait_for(&format!("{} finishes", p.name()), FINISH_TIMEOUT, || {
            status = p.try_wait();
            status.is_some()
        });
        let status = status.expect("waited for");
        assert!(
            status.success(),
            "{} failed ({status}):\n{}",
            p.name(),
            tail(&logs, &format!("bench-{i}"))
        );
        assert!(path.exists(), "{} wrote no history", p.name());
    }

    // Merge and verify.
    let list = tmp.path().join("list.bin");
    let merger = bin("merger");
    let out = Command::new(&merger)
        .arg("--out")
        .arg(&list)
        .arg("--data-dir")
        .arg(&data)
        .stdout(Stdio::piped())
        .output()
        .expect("run merger");
    check_output(&out, &format!("seed {seed}: merger --out"));
    let out = Command::new(&merger)
        .arg("verify")
        .arg(&list)
        .output()
        .expect("run merger verify");
    check_output(&out, &format!("seed {seed}: merger verify"));

    let mut seen: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut list_ids = Vec::new();
    for r in qformat::read_list(&list).expect("open list.bin") {
        let r = r.unwrap_or_else(|e| panic!("seed {seed}: bad record in list.bin: {e}"));
        assert!(
            r.shard < 4,
            "seed {seed}: record {} from unknown shard {}",
            r.id,
            r.shard
        );
        assert_eq!(
            r.payload,
            producer::generate_payload(r.shard, r.seq, PAYLOAD_SIZE),
            "seed {seed}: payload of shard {} seq {}",
            r.shard,
            r.seq
        );
        seen.entry(r.shard).or_default().push(r.seq);
        list_ids.push(r.id);
    }
    for shard in 0..4u32 {
        let seqs = seen.remove(&shard).unwrap_or_default();
        // In ID order, each shard's items come in input order, each exactly once.
        assert!(
            seqs.iter().copied().eq(0..items),
            "seed {seed}: shard {shard}: {} items, not exactly seqs 0..{items} in order",
            seqs.len()
        );
    }

    // The histories: linearizable together (one clock for all processes), and disjoint
    // from the IDs the producers got.
    let mut events = Vec::new();
    for (_, path) in &benches {
        events.extend(read_history(path));
    }
    let ok = events.iter().filter(|e| e.outcome.is_some()).count();
    eprintln!(
        "history: {} requests, {ok} with IDs; list.bin: {} items",
        events.len(),
        list_ids.len()
    );
    assert!(ok > 0, "seed {seed}: the side loads got no IDs at all");
    if let Err(v) = idtools::history::check(&events) {
        panic!("seed {seed}: history violation: {v}");
    }
    let mut ranges: Vec<(u64, u64)> = events
        .iter()
        .filter_map(|e| e.outcome)
        .map(|r| (r.lo, r.hi))
        .collect();
    ranges.extend(list_ids.iter().map(|&id| (id, id)));
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(w[1].0 > w[0].1, "seed {seed}: ID ranges {:?} and {:?} overlap (a duplicate across producers and side loads)", w[0], w[1]);
    }
}

/// The harness's own check that a restarted broker holds its port: a listener another
/// process took must not pass for it.
#[test]
fn a_port_held_by_another_process_is_not_our_broker() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = listener.local_addr().expect("local addr").port();
    let mut other = Proc::spawn("sleep", Command::new("sleep").arg("30"));
    let pid = other.pid().expect("sleep runs");
    assert!(!common::listens_on(pid, port), "sleep does not listen");
    assert!(common::listens_on(std::process::id(), port));
    drop(listener);
    assert!(!common::listens_on(std::process::id(), port));
    other.kill();
}

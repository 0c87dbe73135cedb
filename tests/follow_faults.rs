//! Following a list while it grows, through faults, with real processes (issue 45): a
//! local 5-node quorum, two idbrokers, four `producer --publish-every` processes writing
//! to a real S3 server (SeaweedFS), and `merger follow` writing parts, while a fixed
//! schedule kill -9s and restarts producers, SIGSTOPs one and resumes it, kill -9s and
//! restarts the follower, kill -9s the leading broker and restarts the S3 server.
//!
//! Checked: every snapshot of the follower's complete parts, taken all along, is a prefix
//! of the final list; when everything has finished, the parts hold exactly the records of
//! `merger --runs SRC --out list.bin` (the batch merge of the same destination), which holds
//! every generated item of every shard exactly once. Nothing lost, nothing repeated.
//!
//! Needs the workspace binaries: `cargo build --release --workspace --bins`.

mod common;

use common::{bin, check_output, Proc};
use idtools::cluster::test_quorum;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use testkit::broker::TestBroker;
use testkit::s3::TestS3;

const SHARDS: u32 = 4;
/// Items per producer: enough that each is still publishing while the faults happen.
const ITEMS: u64 = 30_000;
const BATCH: &str = "20";
/// Everything must have finished within this once the faults are over.
const FINISH: Duration = Duration::from_secs(180);

/// One producer (or follower) process and how to start it again, with its log.
struct Restartable {
    name: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    proc: Option<Proc>,
    starts: u32,
}

impl Restartable {
    fn new(name: &str, args: Vec<String>, env: Vec<(String, String)>, logs: &Path) -> Self {
        let mut r = Restartable {
            name: name.to_string(),
            log: logs.join(format!("{name}.log")),
            args,
            env,
            proc: None,
            starts: 0,
        };
        r.start();
        r
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open log");
        let err = log.try_clone().expect("clone log");
        let exe = if self.name.starts_with("producer") {
            "producer"
        } else {
            "merger"
        };
        let mut cmd = Command::new(bin(exe));
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(log)
            .stderr(err);
        self.proc = Some(Proc::spawn(self.name.clone(), &mut cmd));
        self.starts += 1;
    }

    fn kill9(&mut self) {
        if let Some(p) = self.proc.as_mut() {
            p.kill();
        }
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(p) = self.proc.as_ref() {
            p.signal(sig);
        }
    }

    /// Exited with success; restarts it if it exited otherwise (a producer whose broker
    /// was killed mid-request gives up after its deadline: an operator runs it again).
    fn done_or_restart(&mut self) -> bool {
        let Some(status) = self.proc.as_mut().and_then(Proc::try_wait) else {
            return false;
        };
        if status.success() {
            return true;
        }
        assert!(
            self.starts < 20,
            "{} keeps failing ({status}): {}",
            self.name,
            tail(&self.log)
        );
        self.start();
        false
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// The records `merger cat` prints of `files`, one string each.
fn cat(files: &[PathBuf], env: &[(String, String)]) -> Vec<String> {
    if files.is_empty() {
        return Vec::new();
    }
    let out = Command::new(bin("merger"))
        .arg("cat")
        .args(files)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("run merger cat");
    check_output(&out, "merger cat");
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_string)
        .collect()
}

/// The follower's complete parts, in order (temporary files are hidden).
fn parts(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("part-") && n.ends_with(".bin"))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The leading broker of `brokers`, by `idctl broker-stats`.
fn leader(brokers: &[TestBroker]) -> Option<usize> {
    brokers.iter().position(|b| {
        let out = Command::new(bin("idctl"))
            .args(["broker-stats", &b.addr])
            .output()
            .expect("run idctl");
        let last = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        serde_json::from_str::<serde_json::Value>(&last)
            .map(|j| j["role"] == "leader")
            .unwrap_or(false)
    })
}

#[test]
fn follow_keeps_a_prefix_through_kills_pauses_failover_and_s3_restart() {
    let quorum = test_quorum(5);
    let idbroker = bin("idbroker").display().to_string();
    let mut brokers: Vec<TestBroker> = (0..2)
        .map(|_| TestBroker::on(&idbroker, &quorum, &[] as &[&str]))
        .collect();
    let broker_list = brokers
        .iter()
        .map(|b| b.addr.clone())
        .collect::<Vec<_>>()
        .join(",");
    let mut s3 = TestS3::start("follow-faults");
    let env: Vec<(String, String)> = s3.env();
    let src = s3.url("runs");
    let tmp = tempfile::tempdir().expect("tempdir");
    let logs = tmp.path().join("logs");
    let out_dir = tmp.path().join("follow");
    std::fs::create_dir_all(&logs).expect("mkdir logs");

    let mut producers: Vec<Restartable> = (0..SHARDS)
        .map(|shard| {
            let args = [
                "--shard",
                &shard.to_string(),
                "--data-dir",
                &tmp.path().join("data").display().to_string(),
                "--broker",
                &broker_list,
                "--generate",
                &ITEMS.to_string(),
                "--batch",
                BATCH,
                "--no-progress-bar",
                "--seal-to",
                &src,
                "--publish-every",
                "0.2",
            ]
            .map(str::to_string)
            .to_vec();
            Restartable::new(&format!("producer{shard}"), args, env.clone(), &logs)
        })
        .collect();
    let follow_args = [
        "follow",
        "--runs",
        &src,
        "--expect-shards",
        &SHARDS.to_string(),
        "--out-dir",
        &out_dir.display().to_string(),
        "--poll-ms",
        "50",
        "--part-every",
        "0.3",
    ]
    .map(str::to_string)
    .to_vec();
    let mut follower = Restartable::new("follower", follow_args, env.clone(), &logs);

    // The fault schedule: one fault every 0.6 s, snapshots of the parts in between.
    let mut snapshots: Vec<Vec<String>> = Vec::new();
    let snap = |snapshots: &mut Vec<Vec<String>>| {
        snapshots.push(cat(&parts(&out_dir), &env));
    };
    let step = Duration::from_millis(600);
    for fault in 0..8 {
        std::thread::sleep(step);
        snap(&mut snapshots);
        match fault {
            0 => {
                producers[0].kill9();
                producers[0].start();
            }
            1 => producers[1].signal(libc::SIGSTOP),
            2 => {
                producers[1].signal(libc::SIGCONT);
                follower.kill9();
                follower.start();
            }
            3 => {
                if let Some(i) = leader(&brokers) {
                    let mut dead = brokers.remove(i);
                    dead.proc.kill();
                }
            }
            4 => s3.restart(),
            5 => {
                producers[2].kill9();
                producers[2].start();
            }
            6 => {
                follower.kill9();
                producers[3].kill9();
                follower.start();
                producers[3].start();
            }
            _ => snap(&mut snapshots),
        }
    }

    // Then everything runs to its end.
    let start = Instant::now();
    loop {
        // Every producer is looked at (and restarted if it failed), not just up to the
        // first one still running.
        let done: Vec<bool> = producers
            .iter_mut()
            .map(Restartable::done_or_restart)
            .collect();
        let producers_done = done.iter().all(|&d| d);
        let follower_done = follower.done_or_restart();
        if producers_done && follower_done {
            break;
        }
        assert!(
            start.elapsed() < FINISH,
            "not finished within {FINISH:?}; follower: {}\nproducer0: {}",
            tail(&follower.log),
            tail(&producers[0].log)
        );
        snap(&mut snapshots);
        std::thread::sleep(Duration::from_millis(200));
    }

    let list = tmp.path().join("list.bin");
    let merged = Command::new(bin("merger"))
        .args([
            "--runs",
            &src,
            "--expect-shards",
            &SHARDS.to_string(),
            "--out",
        ])
        .arg(&list)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("run merger");
    check_output(&merged, "merger --runs (the batch merge)");
    let fin = cat(&[list], &env);
    assert_eq!(
        fin.len() as u64,
        u64::from(SHARDS) * ITEMS,
        "items in list.bin"
    );
    let followed = cat(&parts(&out_dir), &env);
    assert!(
        followed == fin,
        "the follower's parts ({} records) differ from the batch merge ({} records)",
        followed.len(),
        fin.len()
    );
    let verify = Command::new(bin("merger"))
        .arg("verify")
        .args(parts(&out_dir))
        .output()
        .expect("run merger verify");
    check_output(&verify, "merger verify of the follower's parts");

    // Every (shard, seq) once: the JSON lines say which.
    let json = Command::new(bin("merger"))
        .args(["cat", "--json"])
        .args(parts(&out_dir))
        .output()
        .expect("run merger cat --json");
    check_output(&json, "merger cat --json");
    let mut seen = BTreeSet::new();
    for line in String::from_utf8_lossy(&json.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let key = (v["shard"].as_u64(), v["seq"].as_u64());
        assert!(seen.insert(key), "{key:?} twice");
    }
    assert_eq!(seen.len() as u64, u64::from(SHARDS) * ITEMS);

    let emitted = snapshots.iter().filter(|s| !s.is_empty()).count();
    assert!(
        emitted >= 3,
        "the follower emitted parts in only {emitted} of {} snapshots taken while producers ran",
        snapshots.len()
    );
    for (i, s) in snapshots.iter().enumerate() {
        assert!(
            s.len() <= fin.len() && s[..] == fin[..s.len()],
            "snapshot {i} ({} records) is not a prefix of the final list",
            s.len()
        );
    }
    eprintln!(
        "{} snapshots, {} with parts; producers restarted {:?} times, follower {}",
        snapshots.len(),
        emitted,
        producers.iter().map(|p| p.starts).collect::<Vec<_>>(),
        follower.starts
    );
}

//! Disk full, on a small tmpfs mounted by the test (needs root, as CI has; the test fails
//! with a clear message otherwise, it never skips):
//! - Redis nodes whose data dir fills up exit rather than acknowledge a write they could
//!   not persist (`appendfsync always`): the generator becomes unavailable, never wrong;
//!   once space returns and the nodes restart, IDs continue above every earlier one.
//! - A producer whose RocksDB dir fills up exits non-zero naming the error; once space
//!   returns, the same command resumes, and the merged list holds every item once.
//!
//! Needs the workspace binaries: `cargo build --release --workspace --bins`.

mod common;

use common::{bin, check_output, Tmpfs};
use idclient::{ClientConfig, IdError, IdRange, IdSource, QuorumClient};
use idtools::cluster::{free_port, ping, ClusterError, LocalQuorum};
use idtools::history::{check, monotonic_ns, Event};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Requests tried after the disk filled before giving up on seeing it fail: each write
/// appends ~100 bytes to every node's AOF, and a node can fill at most the rest of its
/// AOF's last page (4 KiB) before a write fails.
const MAX_REQUESTS_WHILE_FULL: usize = 2000;

/// Starts 5 durable nodes with their data dirs under `dir` on consecutive free ports.
fn quorum_in(dir: &Path) -> LocalQuorum {
    for attempt in 0..20 {
        let base = free_port().expect("free port");
        if usize::from(base) + 5 > 65535 {
            continue;
        }
        match LocalQuorum::start(&dir.join(format!("q{attempt}")), 5, base) {
            Ok(q) => return q,
            Err(ClusterError::PortInUse { .. }) => continue,
            Err(e) => panic!("start a 5-node redis quorum on the tmpfs: {e}"),
        }
    }
    panic!("found no 5 consecutive free ports in 20 attempts");
}

async fn record(events: &mut Vec<Event>, c: &impl IdSource, n: u64) -> Result<IdRange, IdError> {
    let invoke_ns = monotonic_ns();
    let r = c.next_ids(n).await;
    events.push(Event {
        invoke_ns,
        return_ns: monotonic_ns(),
        outcome: r.as_ref().ok().copied(),
    });
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_nodes_on_a_full_disk_are_unavailable_never_wrong() {
    let fs = Tmpfs::mount(32 << 20);
    let mut quorum = quorum_in(&fs.dir);
    let mut config = ClientConfig::new(quorum.urls());
    config.deadline = Duration::from_millis(1500);
    config.reply_timeout = Duration::from_millis(300);
    config.connect_timeout = Duration::from_millis(300);
    let client = QuorumClient::connect(config).await.expect("connect");
    let mut events = Vec::new();
    for n in [1, 50, 1, 1000] {
        record(&mut events, &client, n)
            .await
            .expect("room on the disk");
    }

    let filler = fs.fill();
    let mut failed = None;
    for _ in 0..MAX_REQUESTS_WHILE_FULL {
        if let Err(e) = record(&mut events, &client, 1).await {
            failed = Some(e);
            break;
        }
    }
    let err = failed.expect("the nodes kept acknowledging writes on a full disk");
    eprintln!("first error on the full disk: {err}");
    // Once a majority is gone, nothing succeeds any more.
    for _ in 0..3 {
        let e = record(&mut events, &client, 1)
            .await
            .expect_err("a majority of nodes cannot persist: no IDs");
        assert!(
            matches!(e, IdError::NoQuorum { .. } | IdError::Deadline { .. }),
            "unexpected error: {e}"
        );
    }
    let dead = quorum.ports().into_iter().filter(|&p| !ping(p)).count();
    assert!(
        dead >= 3,
        "only {dead} nodes stopped on the full disk; expected a majority"
    );

    // Space returns; the nodes restart from what they fsynced.
    std::fs::remove_file(&filler).expect("remove the filler");
    for i in 0..quorum.len() {
        quorum
            .restart(i)
            .expect("restart a node after space returned");
    }
    let before = events
        .iter()
        .filter_map(|e| e.outcome)
        .map(|r| r.hi)
        .max()
        .unwrap_or(0);
    // The client reconnects lazily: allow a few failures while it does.
    let mut first = None;
    for _ in 0..20 {
        if let Ok(r) = record(&mut events, &client, 1).await {
            first = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first = first.expect("IDs after space returned and the nodes restarted");
    assert!(
        first.lo > before,
        "{first:?} is not above {before}, returned before the disk filled"
    );
    for n in [1, 10, 1] {
        record(&mut events, &client, n)
            .await
            .expect("IDs after recovery");
    }
    if let Err(v) = check(&events) {
        panic!("history violation: {v}");
    }
}

#[test]
fn producer_on_a_full_disk_exits_with_a_clear_error_then_resumes() {
    const ITEMS: u64 = 20_000;
    const PAYLOAD: usize = 1000;
    let quorum = LocalQuorum::temp(3)
        .expect("start a local 3-node redis quorum (is redis-server installed?)");
    // 4 MiB for ~20 MB of items: the WAL fills it part-way through.
    let fs = Tmpfs::mount(4 << 20);
    let data = fs.dir.join("data");
    let producer = || {
        let mut c = Command::new(bin("producer"));
        c.args(["--shard", "7", "--data-dir"]).arg(&data).args([
            "--nodes",
            &quorum.urls_arg(),
            "--generate",
            &ITEMS.to_string(),
            "--payload-size",
            &PAYLOAD.to_string(),
            "--batch",
            "100",
            "--no-progress-bar",
        ]);
        c
    };
    let out = producer().output().expect("run producer");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the producer succeeded on a 4 MiB disk with {ITEMS} x {PAYLOAD} bytes"
    );
    assert!(
        stderr.contains("No space left on device"),
        "the error does not say the disk is full:\n{stderr}"
    );

    fs.resize(256 << 20);
    let out = producer().output().expect("run producer again");
    check_output(&out, "producer after space returned");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("resumed"),
        "the second run did not resume: {out:?}"
    );

    let tmp = tempfile::tempdir().expect("tempdir");
    let list = tmp.path().join("list.bin");
    let out = Command::new(bin("merger"))
        .arg("--out")
        .arg(&list)
        .arg("--data-dir")
        .arg(&data)
        .output()
        .expect("run merger");
    check_output(&out, "merger --out");
    let out = Command::new(bin("merger"))
        .arg("verify")
        .arg(&list)
        .output()
        .expect("run merger verify");
    check_output(&out, "merger verify");
    let mut seqs = Vec::new();
    for r in qformat::read_list(&list).expect("open list.bin") {
        let r = r.expect("valid record");
        assert_eq!(
            r.payload,
            producer::generate_payload(7, r.seq, PAYLOAD),
            "payload of seq {}",
            r.seq
        );
        seqs.push(r.seq);
    }
    assert!(
        seqs.iter().copied().eq(0..ITEMS),
        "{} items, not exactly seqs 0..{ITEMS} in order",
        seqs.len()
    );
}

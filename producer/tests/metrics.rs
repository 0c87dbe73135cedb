//! `producer --metrics-listen`: a real producer process (real redis-server quorum, real
//! RocksDB) serves its progress as Prometheus metrics while it runs. The run is stalled
//! at a known point (`QLIST_PRODUCER_TEST_STALL_AFTER`) so the scrape sees exact state.

use idtools::cluster::test_quorum;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const STALL_ENV: &str = "QLIST_PRODUCER_TEST_STALL_AFTER";

/// The value of the sample line `name value` in `exposition`.
fn value(exposition: &str, name: &str) -> u64 {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{exposition}"))
}

#[test]
fn a_running_producer_serves_items_batches_and_id_wait() {
    let quorum = test_quorum(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().to_str().expect("utf-8 temp path");
    let mut child = Command::new(env!("CARGO_BIN_EXE_producer"))
        .args([
            "--shard",
            "2",
            "--data-dir",
            data,
            "--nodes",
            &quorum.urls_arg(),
        ])
        .args(["--generate", "1000", "--batch", "100", "--no-progress-bar"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .env(STALL_ENV, "300")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn producer");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let (mut addr, mut log) = (None, Vec::new());
    loop {
        let line = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(l) => l,
            Err(e) => {
                let _ = child.kill();
                panic!("no stall within 120 s ({e}); stderr:\n{}", log.join("\n"));
            }
        };
        if let Some((_, rest)) = line.split_once("metrics listening on ") {
            addr = rest.split_whitespace().next().map(str::to_string);
        }
        let stalled = line.contains(producer::STALL_ANNOUNCE);
        log.push(line);
        if stalled {
            break;
        }
    }
    let addr = addr.unwrap_or_else(|| panic!("no metrics address logged:\n{}", log.join("\n")));

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (status, exposition) = rt
        .block_on(qmetrics::get(&addr, "/metrics", Duration::from_secs(10)))
        .expect("scrape the producer");
    assert_eq!(status, 200);
    // Stalled once at least 300 items are durable: 3 batches of 100, and the 4th batch's
    // IDs already fetched (the stall comes after the fetch).
    assert_eq!(
        value(&exposition, "qlist_producer_items_written_total"),
        300
    );
    assert_eq!(
        value(&exposition, "qlist_producer_batches_written_total"),
        3
    );
    assert_eq!(
        value(&exposition, "qlist_producer_id_wait_seconds_count"),
        4
    );
    assert_eq!(value(&exposition, "qlist_producer_id_errors_total"), 0);
    assert_eq!(value(&exposition, "qlist_producer_shard"), 2);
    let health = rt.block_on(qmetrics::get(&addr, "/healthz", Duration::from_secs(10)));
    assert_eq!(health.expect("healthz").0, 200);

    if let Err(e) = qmetrics::promtool_check(&exposition) {
        panic!("{e}");
    }

    drop(child.stdin.take()); // lets the producer go on
    let status = child.wait().expect("wait for the producer");
    assert!(
        status.success(),
        "producer exit {status}; stderr:\n{}",
        log.join("\n")
    );
}

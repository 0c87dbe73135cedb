//! The direct client under load and faults, on real redis-server processes: concurrent
//! clients across OS processes, kill -9 of minorities, majorities and all nodes, SIGSTOP.
//! Every run is checked with the history checker.

use idclient::{ClientConfig, IdError, IdSource, Protocol, QuorumClient};
use idtools::bench::{self, BenchConfig, BenchReport};
use idtools::cluster::{test_quorum, LocalQuorum};
use idtools::history::{self, assert_linearizable, monotonic_ns, Event};
use std::sync::Arc;
use std::time::Duration;

/// Per-request deadline of [`load`]: idctl bench's default.
const LOAD_DEADLINE: Duration = Duration::from_secs(5);

fn config(q: &LocalQuorum, protocol: Protocol, deadline: Duration) -> ClientConfig {
    let mut c = ClientConfig::new(q.urls());
    c.protocol = protocol;
    c.deadline = deadline;
    c.reply_timeout = Duration::from_millis(200);
    c.connect_timeout = Duration::from_millis(200);
    c
}

/// Starts `clients` independent clients (half fast, half classic) running for `secs`.
///
/// Each request gets [`LOAD_DEADLINE`], longer than any run here plus its fault: classic
/// clients never combine, and under contention a classic client can lose round after
/// round (the algorithm is obstruction-free, not wait-free). Once the run's duration is
/// over no new request starts, contention ends and the stragglers win their rounds well
/// within the deadline, so `errors == 0` holds on a slow machine too.
async fn load(
    q: &LocalQuorum,
    clients: usize,
    secs: f64,
    count: u64,
) -> tokio::task::JoinHandle<BenchReport> {
    assert!(secs * 2.0 <= LOAD_DEADLINE.as_secs_f64());
    let mut sources = Vec::new();
    for i in 0..clients {
        let protocol = if i % 2 == 0 {
            Protocol::Fast
        } else {
            Protocol::Classic
        };
        sources.push(Arc::new(
            QuorumClient::connect(config(q, protocol, LOAD_DEADLINE))
                .await
                .expect("connect"),
        ));
    }
    let cfg = BenchConfig::quiet(clients, Duration::from_secs_f64(secs), count);
    tokio::spawn(async move { bench::run(&cfg, &sources).await })
}

/// A run on a quorum with a live majority throughout: no request may fail, every range
/// holds the count asked for, and the history is linearizable.
#[track_caller]
fn assert_healthy_run(report: &BenchReport) {
    assert_eq!(
        report.errors,
        0,
        "requests failed while a majority was up: {}",
        report.summary_line()
    );
    assert_eq!(report.requests_started, report.events.len() as u64);
    report.assert_checked();
}

fn max_id(events: &[Event]) -> u64 {
    events
        .iter()
        .filter_map(|e| e.outcome)
        .map(|r| r.hi)
        .max()
        .unwrap_or(0)
}

fn succeeded_after(events: &[Event], t: u64) -> usize {
    events
        .iter()
        .filter(|e| e.invoke_ns > t && e.outcome.is_some())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_clients_in_two_processes_are_linearizable() {
    let q = test_quorum(5);
    let dir = tempfile::tempdir().expect("tempdir");
    let idctl = env!("CARGO_BIN_EXE_idctl");
    let mut children = Vec::new();
    for (i, extra) in [["--count", "1"], ["--count", "3"]].iter().enumerate() {
        let path = dir.path().join(format!("h{i}.txt"));
        let mut cmd = std::process::Command::new(idctl);
        cmd.args([
            "bench",
            "--nodes",
            &q.urls_arg(),
            "--clients",
            "16",
            "--seconds",
            "2",
            "--history",
        ])
        .arg(&path)
        .args(extra.iter())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        if i == 1 {
            cmd.arg("--classic");
        }
        children.push((cmd.spawn().expect("spawn idctl bench"), path));
    }
    // Mixed in: ranges from this process too.
    let local = load(&q, 4, 2.0, 7).await.await.expect("local load");
    assert_healthy_run(&local);
    let mut events = local.events;
    for ((child, path), count) in children.into_iter().zip([1, 3]) {
        let out = child.wait_with_output().expect("idctl bench");
        assert!(
            out.status.success(),
            "idctl bench failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let json = bench::summary_json(&stdout);
        assert_eq!(
            json["errors"], 0,
            "requests failed on a healthy quorum: {stdout}"
        );
        let recorded = history::read_events(&path).expect("history file");
        assert_eq!(json["requests_started"], recorded.len(), "{stdout}");
        for e in &recorded {
            if let Err(v) = history::check_count(e, count) {
                panic!("idctl bench --count {count}: {v}");
            }
        }
        events.extend(recorded);
    }
    let ok = events.iter().filter(|e| e.outcome.is_some()).count();
    assert!(ok > 100, "only {ok} successful requests");
    assert_linearizable(&events);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_minority_mid_run_keeps_generating() {
    let mut q = test_quorum(5);
    let run = load(&q, 8, 2.5, 1).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let killed_at = monotonic_ns();
    q.kill(0);
    q.kill(3);
    let report = run.await.expect("load");
    assert_healthy_run(&report);
    let after = succeeded_after(&report.events, killed_at + 300_000_000);
    assert!(
        after > 0,
        "no request succeeded after two of five nodes died"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_majority_requests_fail_and_recover_after_restart() {
    let mut q = test_quorum(5);
    let deadline = Duration::from_millis(800);
    let c = QuorumClient::connect(config(&q, Protocol::Fast, deadline))
        .await
        .expect("connect");
    let classic = QuorumClient::connect(config(&q, Protocol::Classic, deadline))
        .await
        .expect("connect");
    let before = c.next_ids(10).await.expect("ids").hi;
    let dead_ports: Vec<u16> = [1, 2, 4].iter().map(|&i| q.ports()[i]).collect();
    for i in [1, 2, 4] {
        q.kill(i);
    }
    for client in [&c, &classic] {
        let started = std::time::Instant::now();
        let err = client
            .next_id()
            .await
            .expect_err("no quorum must mean no ID");
        let took = started.elapsed();
        let msg = err.to_string();
        // At most the two live nodes answered (fewer if the deadline cut a slow round short),
        // and the error names each dead node.
        assert!(
            matches!(err, IdError::NoQuorum { reachable, needed: 3, total: 5, .. } if reachable <= 2),
            "{msg}"
        );
        for port in dead_ports.iter() {
            assert!(
                msg.contains(&format!(":{port}")),
                "{msg} does not name dead node :{port}"
            );
        }
        // Fails by its deadline (plus one reply timeout of slack), not never.
        assert!(took < deadline + Duration::from_secs(2), "took {took:?}");
    }
    for i in [1, 2, 4] {
        q.restart(i).expect("restart");
    }
    for client in [&c, &classic] {
        let id = client.next_id().await.expect("quorum is back");
        assert!(id > before, "{id} after restart is not above {before}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_minority_causes_no_duplicate() {
    let q = test_quorum(5);
    let run = load(&q, 8, 2.5, 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Longer than the 200 ms reply timeout: replies arrive late, after the client moved on.
    q.pause(1);
    q.pause(2);
    let paused_at = monotonic_ns();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    q.resume(1);
    q.resume(2);
    let report = run.await.expect("load");
    assert_healthy_run(&report);
    let during = report
        .events
        .iter()
        .filter(|e| {
            e.invoke_ns > paused_at && e.return_ns < paused_at + 900_000_000 && e.outcome.is_some()
        })
        .count();
    assert!(during > 0, "a paused minority must not stop generation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_and_restart_all_nodes_repeats_nothing() {
    let mut q = test_quorum(5);
    let first = load(&q, 6, 1.0, 3).await.await.expect("load");
    assert_healthy_run(&first);
    let first = first.events;
    let before = max_id(&first);
    assert!(before > 0);
    for i in 0..5 {
        q.kill(i);
    }
    for i in 0..5 {
        q.restart(i).expect("restart");
    }
    let second = load(&q, 6, 1.0, 3).await.await.expect("load");
    assert_healthy_run(&second);
    let second = second.events;
    let mut all = first;
    all.extend(second.iter().copied());
    assert!(
        second
            .iter()
            .filter_map(|e| e.outcome)
            .all(|r| r.lo > before),
        "an ID after the restart is not above {before}"
    );
    assert_linearizable(&all);
}

/// `idctl bench` counts every request it started: failures that return after the timed
/// window (here: every request in flight when a majority dies) are errors too.
#[test]
fn idctl_bench_counts_failures_that_return_after_the_window() {
    use std::io::BufRead;
    let mut q = test_quorum(5);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("h.txt");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idctl"))
        .args(["bench", "--nodes", &q.urls_arg(), "--clients", "8"])
        .args(["--seconds", "3", "--deadline-ms", "1500", "--history"])
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn idctl bench");
    // The first progress line: the timed window is running, 2 s of it left.
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = std::io::BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.starts_with("bench: 1s") => break,
            Some(Ok(line)) => seen.push(line),
            _ => panic!("idctl bench ended before its first progress line: {seen:?}"),
        }
    }
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    for i in [0, 1, 2] {
        q.kill(i);
    }
    let out = child.wait_with_output().expect("idctl bench");
    let rest = drain.join().expect("stderr reader");
    assert!(out.status.success(), "idctl bench failed: {rest:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = bench::summary_json(&stdout);
    let recorded = history::read_events(&path).expect("history file");
    let failed = recorded.iter().filter(|e| e.outcome.is_none()).count();
    // Requests running when the majority died, and every one started after, fail.
    assert!(failed > 0, "no failed request recorded: {stdout}");
    assert_eq!(json["errors"], failed, "{stdout}\n{rest:?}");
    assert_eq!(json["requests_started"], recorded.len(), "{stdout}");
    assert_linearizable(&recorded);
}

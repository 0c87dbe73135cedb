//! `idctl` in broker mode as a user runs it: `next --broker`, `bench --broker` and
//! `broker-stats` against a real idbroker process on a real local quorum, and their errors.

mod common;

use common::{bin, check_output, Proc};
use idtools::cluster::{free_port, test_quorum, LocalQuorum};
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

fn idctl(args: &[&str]) -> Output {
    Command::new(bin("idctl"))
        .args(args)
        .output()
        .expect("run idctl")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Starts idbroker on a free port; returns the process (stopped by its pid on drop) and
/// its address.
fn broker(q: &LocalQuorum) -> (Proc, String) {
    broker_with(q, &[])
}

/// [`broker`] with `extra` arguments.
fn broker_with(q: &LocalQuorum, extra: &[&str]) -> (Proc, String) {
    let mut cmd = Command::new(bin("idbroker"));
    cmd.args(["--listen", "127.0.0.1:0", "--nodes", &q.urls_arg()])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().expect("start idbroker");
    let stdout = child.stdout.take().expect("idbroker stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read idbroker stdout");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("idbroker did not start: {line:?}"))
        .to_string();
    (Proc::new("idbroker", child), addr)
}

#[test]
fn next_bench_and_stats_through_a_broker() {
    let q = test_quorum(5);
    let (_broker, addr) = broker(&q);

    let next = idctl(&["next", "--broker", &addr, "--count", "5"]);
    check_output(&next, "idctl next --broker");
    let fields: Vec<u64> = String::from_utf8_lossy(&next.stdout)
        .split_whitespace()
        .map(|s| s.parse().expect("a number"))
        .collect();
    assert_eq!(fields.len(), 2, "{}", text(&next));
    assert_eq!(fields[1], fields[0] + 4, "LO HI with HI = LO + COUNT - 1");

    // A later direct request is above it: broker and direct clients share the quorum.
    let direct = idctl(&["next", "--nodes", &q.urls_arg()]);
    check_output(&direct, "idctl next --nodes");
    let id: u64 = String::from_utf8_lossy(&direct.stdout)
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .expect("an ID");
    assert!(id > fields[1]);

    let bench = idctl(&[
        "bench",
        "--broker",
        &addr,
        "--clients",
        "8",
        "--seconds",
        "0.5",
    ]);
    check_output(&bench, "idctl bench --broker");
    let json = idtools::bench::summary_json(&String::from_utf8_lossy(&bench.stdout));
    assert_eq!(json["errors"], 0);

    let stats = idctl(&["broker-stats", &addr]);
    check_output(&stats, "idctl broker-stats");
    let last = String::from_utf8_lossy(&stats.stdout)
        .lines()
        .last()
        .expect("a JSON line")
        .to_string();
    let json: serde_json::Value = serde_json::from_str(&last).expect("JSON");
    assert!(json["requests"].as_u64().expect("requests") > 1, "{last}");
    assert!(json["rounds"].as_u64().expect("rounds") >= 1, "{last}");
    // Every counter the broker sends, not a hand-picked few (BrokerStats serialized).
    for key in [
        "uptime_ms",
        "connections_open",
        "requests_ok",
        "batch_histogram",
        "max_batch",
        "mean_round_us",
        "holes",
    ] {
        assert!(json.get(key).is_some(), "no {key} in {last}");
    }
}

#[test]
fn broker_mode_errors_are_clear() {
    let port = free_port().expect("port");
    let nobody = format!("127.0.0.1:{port}");
    for args in [
        vec!["next", "--broker", nobody.as_str(), "--deadline-ms", "300"],
        vec!["broker-stats", nobody.as_str()],
    ] {
        let out = idctl(&args);
        let t = text(&out);
        assert!(
            t.contains(&nobody) && !t.contains("panicked"),
            "{args:?}: {t}"
        );
        // No broker answers: the ID generator is unavailable (exit 5, qcli's table).
        testkit::assert_exit(&out, 5, &nobody);
    }
    let both = idctl(&[
        "next",
        "--broker",
        &nobody,
        "--nodes",
        "redis://127.0.0.1:1",
    ]);
    // A usage error (exit 2).
    testkit::assert_exit(&both, 2, "cannot be used with");
}

/// `idctl next --broker FOLLOWER`, one address and that a follower's,
/// is served (the client follows the redirect to the leader it was not given); with
/// `--broker-closed-list` it fails as before, saying how to allow it.
#[test]
fn next_through_a_follower_alone_reaches_the_leader() {
    let q = test_quorum(3);
    let timing = ["--election-timeout-ms", "200", "--heartbeat-ms", "50"];
    // The first window broker leads; the second announces itself once it follows it.
    let (_leader, leader) = broker_with(&q, &timing);
    let (_follower, follower) = broker_with(&q, &timing);

    let next = idctl(&["next", "--broker", &follower, "--count", "3"]);
    check_output(&next, "idctl next --broker FOLLOWER");
    let fields: Vec<u64> = String::from_utf8_lossy(&next.stdout)
        .split_whitespace()
        .map(|s| s.parse().expect("a number"))
        .collect();
    assert_eq!(fields.len(), 2, "{}", text(&next));
    assert_eq!(fields[1], fields[0] + 2, "LO HI with HI = LO + COUNT - 1");

    let closed = idctl(&[
        "next",
        "--broker",
        &follower,
        "--broker-closed-list",
        "--deadline-ms",
        "1000",
    ]);
    assert_eq!(closed.status.code(), Some(5), "{}", text(&closed));
    let t = text(&closed);
    assert!(
        t.contains(&format!(
            "the leader {leader} is not among the --broker addresses"
        )) && t.contains("--broker-closed-list"),
        "{t}"
    );
}

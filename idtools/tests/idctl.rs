//! The idctl binary as a user runs it: cluster up/down, check, next, bench, and its errors.

mod common;
use common::{idctl, text};
use idtools::cluster::{free_port, LocalQuorum};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

/// The exit codes of qcli's table that idctl's errors here end with (`qcli::Cause`).
const OTHER: i32 = 1;
const USAGE: i32 = 2;
const IDS: i32 = 5;

/// A base port with `n` free ports after it.
fn free_base(n: u16) -> u16 {
    for _ in 0..50 {
        let base = free_port().expect("port");
        if base < 60000 && (0..n).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
    panic!("no run of {n} free ports found");
}

fn alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// `idctl cluster up` of three nodes in `dir` on the ports from `base`, to run.
fn up_command(dir: &str, base: u16) -> Command {
    let mut up = Command::new(env!("CARGO_BIN_EXE_idctl"));
    up.args(["cluster", "up", "--dir", dir, "--nodes", "3", "--base-port"])
        .arg(base.to_string());
    up
}

/// Runs `idctl cluster up` of three nodes in `dir` on the ports from `base`.
fn cluster_up(dir: &str, base: u16) -> Output {
    up_command(dir, base).output().expect("run idctl")
}

/// Asserts that `out` printed `want` (on stdout or stderr).
#[track_caller]
fn assert_says(out: &Output, want: &str) {
    let text = text(out);
    assert!(text.contains(want), "want {want:?} in {text}");
}

/// Asserts that the command failed with exit code `code` (qcli's table: 1 other, 2 usage,
/// 5 ID generator unavailable or unsafe), without a panic, saying `want` (on stdout, where
/// `idctl check` prints its verdicts, or on stderr).
#[track_caller]
fn assert_fails_saying(out: &Output, code: i32, want: &str) {
    testkit::assert_exit(out, code, "");
    assert_says(out, want);
}

#[track_caller]
fn assert_ok(out: &Output) {
    assert!(out.status.success(), "{}", text(out));
}

/// What the command printed on stdout, trimmed.
fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Stops a cluster left behind by a failing test, by the pids it recorded.
struct Down<'a>(&'a Path);
impl Drop for Down<'_> {
    fn drop(&mut self) {
        let _ = idtools::cluster::down(self.0);
    }
}

#[test]
fn cluster_up_next_check_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8 path");
    let base = free_base(3);
    let up = cluster_up(d, base);
    let _guard = Down(dir.path());
    assert_ok(&up);
    let urls = stdout(&up);
    assert_eq!(
        urls,
        format!(
            "redis://127.0.0.1:{},redis://127.0.0.1:{},redis://127.0.0.1:{}",
            base,
            base + 1,
            base + 2
        )
    );

    // A second `up` on the same dir refuses.
    let again = cluster_up(d, base);
    assert_fails_saying(&again, OTHER, "already running");

    let check = idctl(&["check", "--nodes", &urls]);
    assert_ok(&check);
    assert_eq!(
        String::from_utf8_lossy(&check.stdout)
            .matches(": ok")
            .count(),
        3
    );

    let next = idctl(&["next", "--nodes", &urls, "--count", "10"]);
    assert_ok(&next);
    assert_eq!(stdout(&next), "1 10");
    let next = idctl(&["next", "--nodes", &urls, "--classic"]);
    assert_eq!(stdout(&next), "11 11", "{}", text(&next));

    let bench = idctl(&[
        "bench",
        "--nodes",
        &urls,
        "--clients",
        "2",
        "--seconds",
        "0.5",
    ]);
    assert_ok(&bench);
    let last = String::from_utf8_lossy(&bench.stdout)
        .lines()
        .last()
        .expect("json line")
        .to_string();
    let json: serde_json::Value = serde_json::from_str(&last).expect("JSON");
    assert!(json["ids_per_sec"].as_f64().expect("number") > 0.0);
    assert_eq!(json["errors"], 0);

    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("cluster.json")).expect("state"))
            .expect("json");
    let pids: Vec<u64> = state["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["pid"].as_u64().expect("pid"))
        .collect();
    assert_eq!(pids.len(), 3);
    assert!(pids.iter().all(|&p| alive(p)));
    let down = idctl(&["cluster", "down", "--dir", d]);
    assert_ok(&down);
    assert_says(&down, "stopped 3 node(s)");
    assert!(
        pids.iter().all(|&p| !alive(p)),
        "a node survived cluster down"
    );
    // Data is kept: a new cluster on the same dir resumes above the old IDs.
    let up = cluster_up(d, base);
    assert_ok(&up);
    let next = idctl(&["next", "--nodes", &urls]);
    assert!(
        stdout(&next)
            .split(' ')
            .next()
            .and_then(|s| s.parse::<u64>().ok())
            .is_some_and(|id| id > 11),
        "{}",
        text(&next)
    );
}

#[test]
fn cluster_up_refuses_a_taken_port_and_missing_redis() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8 path");
    let base = free_base(3);
    let _holder = TcpListener::bind(("127.0.0.1", base + 1)).expect("hold a port");
    let up = cluster_up(d, base);
    assert_fails_saying(
        &up,
        OTHER,
        &format!("port {} on 127.0.0.1 is already in use", base + 1),
    );

    let up = up_command(d, free_base(3))
        .env("PATH", "/nonexistent")
        .output()
        .expect("run idctl");
    assert_fails_saying(&up, OTHER, "redis-server not found");
    assert_says(&up, "apt-get install redis-server");

    let even = idctl(&["cluster", "up", "--dir", d, "--nodes", "4"]);
    assert_fails_saying(&even, USAGE, "odd");

    let down = idctl(&["cluster", "down", "--dir", d]);
    assert_fails_saying(&down, OTHER, "no cluster state found");
}

#[test]
fn cluster_up_refuses_a_redis_older_than_7() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir");
    let fake = bin.join("redis-server");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'Redis server v=6.2.6 sha=00000000:0 malloc=jemalloc-5.1.0 bits=64 build=1'\n",
    )
    .expect("write fake redis-server");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let d = dir.path().join("q");
    let up = up_command(d.to_str().expect("utf-8 path"), free_base(3))
        .env("PATH", &bin)
        .output()
        .expect("run idctl");
    assert_fails_saying(&up, OTHER, "redis-server 6.2.6 is too old");
    assert_says(&up, "Redis 7 or newer");
    assert!(
        !d.join("cluster.json").exists(),
        "nothing was started: {}",
        text(&up)
    );
}

#[test]
fn check_refuses_an_unsafe_node() {
    let safe = LocalQuorum::temp(1).expect("start redis-server");
    let unsafe_node = LocalQuorum::temp_with_args(1, &["--appendfsync".into(), "everysec".into()])
        .expect("start redis-server");
    let urls = format!("{},{}", safe.urls_arg(), unsafe_node.urls_arg());
    let check = idctl(&["check", "--nodes", &urls]);
    assert_fails_saying(
        &check,
        IDS,
        "UNSAFE: appendfsync is \"everysec\", must be \"always\"",
    );
    assert_says(&check, &format!("{}: ok", safe.urls_arg()));

    let next = idctl(&["next", "--nodes", &unsafe_node.urls_arg()]);
    assert_fails_saying(&next, IDS, "is unsafe");
    let next = idctl(&[
        "next",
        "--nodes",
        &unsafe_node.urls_arg(),
        "--unsafe-skip-durability-check",
    ]);
    assert_ok(&next);
}

#[test]
fn bad_arguments_are_clear_errors() {
    let port = free_port().expect("port");
    let nobody = format!("redis://127.0.0.1:{port}");
    let cases: [(&[&str], &str, i32); 6] = [
        (
            &["next", "--nodes", &nobody, "--deadline-ms", "200"],
            "no quorum",
            5,
        ),
        (
            &["next", "--nodes", "localhost:6379"],
            "not a redis:// URL",
            2,
        ),
        (
            &["next", "--nodes", "redis://127.0.0.1:1", "--count", "x"],
            "invalid value 'x'",
            2,
        ),
        (&["next"], "required", 2),
        (
            &["bench", "--nodes", "redis://127.0.0.1:1", "--clients", "0"],
            "--clients must be at least 1",
            2,
        ),
        (&["check", "--nodes", &nobody], "UNREACHABLE", 5),
    ];
    for (args, want, code) in cases {
        // Which case a failure is about (the output is shown when the test fails).
        eprintln!("idctl {args:?}");
        let out = idctl(args);
        // The exit-code convention (README, "Command-line conventions").
        assert_fails_saying(&out, code, want);
    }
}

#[test]
fn chart_draws_runs_and_names_a_bad_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runs = dir.path().join("runs.jsonl");
    std::fs::write(
        &runs,
        "{\"series\":\"direct fast\",\"callers\":1,\"count\":1,\"ids_per_sec\":2000}\n\
         {\"series\":\"direct fast\",\"callers\":64,\"count\":1,\"ids_per_sec\":20000}\n\
         {\"series\":\"broker window\",\"callers\":64,\"count\":1,\"ids_per_sec\":90000}\n",
    )
    .expect("write runs");
    let svg = dir.path().join("ids.svg");
    let (runs_arg, svg_arg) = (runs.to_str().expect("utf-8"), svg.to_str().expect("utf-8"));
    let out = idctl(&[
        "chart", "--in", runs_arg, "--out", svg_arg, "--title", "T-1",
    ]);
    assert_ok(&out);
    let doc = std::fs::read_to_string(&svg).expect("svg written");
    assert!(doc.starts_with("<svg") && doc.trim_end().ends_with("</svg>"));
    for s in ["T-1", "direct fast", "broker window"] {
        assert!(doc.contains(s), "no {s} in the chart");
    }

    // A broken line is bad input (3), named by its number; an unwritable output is 4.
    std::fs::write(
        &runs,
        "{\"series\":\"a\",\"callers\":1,\"count\":1,\"ids_per_sec\":1}\n{oops\n",
    )
    .expect("write runs");
    let out = idctl(&["chart", "--in", runs_arg, "--out", svg_arg]);
    assert_fails_saying(&out, 3, "line 2");
    let nowhere = "/nonexistent-dir/ids.svg";
    let out = idctl(&["chart", "--in", runs_arg, "--out", nowhere, "--count", "1"]);
    testkit::assert_exit(&out, 3, "");
    std::fs::write(
        &runs,
        "{\"series\":\"a\",\"callers\":1,\"count\":1,\"ids_per_sec\":1}\n",
    )
    .expect("write runs");
    let out = idctl(&["chart", "--in", runs_arg, "--out", nowhere]);
    assert_fails_saying(&out, 4, "cannot write");
}

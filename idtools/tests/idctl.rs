//! The idctl binary as a user runs it: cluster up/down, check, next, bench, and its errors.

mod common;
use common::{idctl, text};
use idtools::cluster::{free_port, LocalQuorum};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

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
    let up = idctl(&[
        "cluster",
        "up",
        "--dir",
        d,
        "--nodes",
        "3",
        "--base-port",
        &base.to_string(),
    ]);
    let _guard = Down(dir.path());
    assert!(up.status.success(), "{}", text(&up));
    let urls = String::from_utf8_lossy(&up.stdout).trim().to_string();
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
    let again = idctl(&[
        "cluster",
        "up",
        "--dir",
        d,
        "--nodes",
        "3",
        "--base-port",
        &base.to_string(),
    ]);
    assert!(!again.status.success());
    assert!(text(&again).contains("already running"), "{}", text(&again));

    let check = idctl(&["check", "--nodes", &urls]);
    assert!(check.status.success(), "{}", text(&check));
    assert_eq!(
        String::from_utf8_lossy(&check.stdout)
            .matches(": ok")
            .count(),
        3
    );

    let next = idctl(&["next", "--nodes", &urls, "--count", "10"]);
    assert!(next.status.success(), "{}", text(&next));
    assert_eq!(String::from_utf8_lossy(&next.stdout).trim(), "1 10");
    let next = idctl(&["next", "--nodes", &urls, "--classic"]);
    assert_eq!(
        String::from_utf8_lossy(&next.stdout).trim(),
        "11 11",
        "{}",
        text(&next)
    );

    let bench = idctl(&[
        "bench",
        "--nodes",
        &urls,
        "--clients",
        "2",
        "--seconds",
        "0.5",
    ]);
    assert!(bench.status.success(), "{}", text(&bench));
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
    assert!(down.status.success(), "{}", text(&down));
    assert!(text(&down).contains("stopped 3 node(s)"), "{}", text(&down));
    assert!(
        pids.iter().all(|&p| !alive(p)),
        "a node survived cluster down"
    );
    // Data is kept: a new cluster on the same dir resumes above the old IDs.
    let up = idctl(&[
        "cluster",
        "up",
        "--dir",
        d,
        "--nodes",
        "3",
        "--base-port",
        &base.to_string(),
    ]);
    assert!(up.status.success(), "{}", text(&up));
    let next = idctl(&["next", "--nodes", &urls]);
    assert!(
        String::from_utf8_lossy(&next.stdout)
            .trim()
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
    let up = idctl(&[
        "cluster",
        "up",
        "--dir",
        d,
        "--nodes",
        "3",
        "--base-port",
        &base.to_string(),
    ]);
    assert!(!up.status.success());
    assert!(
        text(&up).contains(&format!("port {} on 127.0.0.1 is already in use", base + 1)),
        "{}",
        text(&up)
    );

    let up = Command::new(env!("CARGO_BIN_EXE_idctl"))
        .args([
            "cluster",
            "up",
            "--dir",
            d,
            "--nodes",
            "3",
            "--base-port",
            &free_base(3).to_string(),
        ])
        .env("PATH", "/nonexistent")
        .output()
        .expect("run idctl");
    assert!(!up.status.success());
    assert!(
        text(&up).contains("redis-server not found")
            && text(&up).contains("apt-get install redis-server"),
        "{}",
        text(&up)
    );

    let even = idctl(&["cluster", "up", "--dir", d, "--nodes", "4"]);
    assert!(!even.status.success());
    assert!(text(&even).contains("odd"), "{}", text(&even));

    let down = idctl(&["cluster", "down", "--dir", d]);
    assert!(!down.status.success());
    assert!(
        text(&down).contains("no cluster state found"),
        "{}",
        text(&down)
    );
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
    let up = Command::new(env!("CARGO_BIN_EXE_idctl"))
        .args(["cluster", "up", "--dir", d.to_str().expect("utf-8 path")])
        .args(["--nodes", "3", "--base-port", &free_base(3).to_string()])
        .env("PATH", &bin)
        .output()
        .expect("run idctl");
    assert!(!up.status.success());
    let out = text(&up);
    assert!(
        out.contains("redis-server 6.2.6 is too old") && out.contains("Redis 7 or newer"),
        "{out}"
    );
    assert!(
        !d.join("cluster.json").exists(),
        "nothing was started: {out}"
    );
}

#[test]
fn check_refuses_an_unsafe_node() {
    let safe = LocalQuorum::temp(1).expect("start redis-server");
    let unsafe_node = LocalQuorum::temp_with_args(1, &["--appendfsync".into(), "everysec".into()])
        .expect("start redis-server");
    let urls = format!("{},{}", safe.urls_arg(), unsafe_node.urls_arg());
    let check = idctl(&["check", "--nodes", &urls]);
    assert!(!check.status.success());
    let out = text(&check);
    assert!(
        out.contains("UNSAFE: appendfsync is \"everysec\", must be \"always\""),
        "{out}"
    );
    assert!(out.contains(&format!("{}: ok", safe.urls_arg())), "{out}");

    let next = idctl(&["next", "--nodes", &unsafe_node.urls_arg()]);
    assert!(!next.status.success());
    assert!(text(&next).contains("is unsafe"), "{}", text(&next));
    let next = idctl(&[
        "next",
        "--nodes",
        &unsafe_node.urls_arg(),
        "--unsafe-skip-durability-check",
    ]);
    assert!(next.status.success(), "{}", text(&next));
}

#[test]
fn bad_arguments_are_clear_errors() {
    let port = free_port().expect("port");
    let cases: Vec<(Vec<String>, &str, i32)> = vec![
        (
            vec![
                "next".into(),
                "--nodes".into(),
                format!("redis://127.0.0.1:{port}"),
                "--deadline-ms".into(),
                "200".into(),
            ],
            "no quorum",
            5,
        ),
        (
            vec!["next".into(), "--nodes".into(), "localhost:6379".into()],
            "not a redis:// URL",
            2,
        ),
        (
            vec![
                "next".into(),
                "--nodes".into(),
                "redis://127.0.0.1:1".into(),
                "--count".into(),
                "x".into(),
            ],
            "invalid value 'x'",
            2,
        ),
        (vec!["next".into()], "required", 2),
        (
            vec![
                "bench".into(),
                "--nodes".into(),
                "redis://127.0.0.1:1".into(),
                "--clients".into(),
                "0".into(),
            ],
            "--clients must be at least 1",
            2,
        ),
        (
            vec![
                "check".into(),
                "--nodes".into(),
                format!("redis://127.0.0.1:{port}"),
            ],
            "UNREACHABLE",
            5,
        ),
    ];
    for (args, want, code) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = idctl(&args);
        assert!(!out.status.success(), "{args:?} should fail");
        // The exit-code convention (README, "Command-line conventions").
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains(want),
            "{args:?}: want {want:?} in {}",
            text(&out)
        );
        assert!(
            !text(&out).contains("panicked"),
            "{args:?} panicked: {}",
            text(&out)
        );
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
    assert!(out.status.success(), "{}", text(&out));
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
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("line 2"), "{}", text(&out));
    let out = idctl(&[
        "chart",
        "--in",
        runs_arg,
        "--out",
        "/nonexistent-dir/ids.svg",
        "--count",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    std::fs::write(
        &runs,
        "{\"series\":\"a\",\"callers\":1,\"count\":1,\"ids_per_sec\":1}\n",
    )
    .expect("write runs");
    let out = idctl(&[
        "chart",
        "--in",
        runs_arg,
        "--out",
        "/nonexistent-dir/ids.svg",
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(text(&out).contains("cannot write"), "{}", text(&out));
}

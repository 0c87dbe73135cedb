//! The deployment recipe in examples/deploy/ (README.md, "Running it for real") is what it
//! says: the systemd units parse and carry the settings the README promises, their
//! ExecStart binaries and flags exist, the five Redis conf files start real redis-servers
//! that `idctl check` accepts, the brokers' environment files start a real idbroker that
//! serves IDs and its metrics (every metric the alert rules use among them), promtool
//! accepts the alert rules and passes their unit tests, and, where `systemd-analyze`
//! exists, `systemd-analyze verify` accepts the units. Build idbroker first:
//! `cargo build --release -p broker --bins`. Needs `promtool` (Debian package
//! prometheus, installed by scripts/deps.sh).

mod common;
use common::{idbroker_bin, idctl, text};
use idtools::announced::{Announced, START_TIMEOUT};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/deploy")
}

fn read(name: &str) -> String {
    let path = deploy_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A unit file: section -> key -> values (a key may repeat).
type Unit = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// Parses a systemd unit file strictly: comments, blank lines, `[Section]` headers and
/// `Key=Value` lines only, every key inside a known section.
fn parse_unit(name: &str) -> Unit {
    let mut unit = Unit::new();
    let mut section: Option<String> = None;
    for (i, line) in read(name).lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            assert!(
                ["Unit", "Service", "Install"].contains(&s),
                "{name}:{}: unknown section [{s}]",
                i + 1
            );
            assert!(!unit.contains_key(s), "{name}:{}: [{s}] twice", i + 1);
            unit.insert(s.to_string(), BTreeMap::new());
            section = Some(s.to_string());
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{name}:{}: not Key=Value: {line}", i + 1));
        let key = key.trim();
        assert!(
            !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric()),
            "{name}:{}: bad key {key:?}",
            i + 1
        );
        let section = section
            .as_ref()
            .unwrap_or_else(|| panic!("{name}:{}: key outside a section", i + 1));
        unit.get_mut(section)
            .expect("section")
            .entry(key.to_string())
            .or_default()
            .push(value.trim().to_string());
    }
    for s in ["Unit", "Service", "Install"] {
        assert!(unit.contains_key(s), "{name}: no [{s}]");
    }
    unit
}

#[track_caller]
fn one<'a>(unit: &'a Unit, section: &str, key: &str) -> &'a str {
    match unit
        .get(section)
        .and_then(|s| s.get(key))
        .map(Vec::as_slice)
    {
        Some([v]) => v,
        other => panic!("[{section}] {key}: expected one value, got {other:?}"),
    }
}

/// The settings both kinds of unit must have (README: durable, restarted, enough files).
fn check_common(name: &str, unit: &Unit) {
    assert!(!one(unit, "Unit", "Description").is_empty(), "{name}");
    assert_eq!(one(unit, "Service", "Restart"), "always", "{name}");
    let nofile: u64 = one(unit, "Service", "LimitNOFILE")
        .parse()
        .unwrap_or_else(|e| panic!("{name}: LimitNOFILE: {e}"));
    assert!(nofile >= 65536, "{name}: LimitNOFILE {nofile}");
    assert_eq!(one(unit, "Service", "User"), "qlist", "{name}: not root");
    assert_eq!(
        one(unit, "Install", "WantedBy"),
        "multi-user.target",
        "{name}"
    );
}

/// `Key value` lines of a redis.conf (comments and blank lines skipped).
fn parse_conf(name: &str) -> BTreeMap<String, String> {
    read(name)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap_or((l, ""));
            (k.to_string(), v.trim().to_string())
        })
        .collect()
}

/// Loopback or a private (RFC 1918 / unique local) address: never a public one.
fn private(addr: &str) -> bool {
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => a.is_loopback() || a.is_private(),
        Ok(std::net::IpAddr::V6(a)) => a.is_loopback() || (a.segments()[0] & 0xfe00) == 0xfc00,
        Err(_) => false,
    }
}

/// redis-server processes, stopped by their own pids on drop (testkit's guard).
struct Nodes(Vec<testkit::ChildGuard>);

#[test]
fn redis_units_and_confs_make_a_durable_quorum() {
    let unit = parse_unit("qlist-redis@.service");
    check_common("qlist-redis@.service", &unit);
    let exec = one(&unit, "Service", "ExecStart");
    assert_eq!(
        exec, "/usr/bin/redis-server /etc/qlist/redis-%i.conf --daemonize no",
        "the conf per instance, supervised by systemd"
    );
    assert_eq!(
        one(&unit, "Service", "ReadWritePaths"),
        "/var/lib/qlist/redis-%i"
    );

    // Five confs: durable, distinct ports and directories, never a public address.
    let mut ports = Vec::new();
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut nodes = Nodes(Vec::new());
    let mut urls = Vec::new();
    for i in 1..=5 {
        let name = format!("redis-{i}.conf");
        let conf = parse_conf(&name);
        for (k, v) in [
            ("appendonly", "yes"),
            ("appendfsync", "always"),
            ("no-appendfsync-on-rewrite", "no"),
            ("maxmemory-policy", "noeviction"),
            ("save", "\"\""),
            ("protected-mode", "yes"),
        ] {
            assert_eq!(conf.get(k).map(String::as_str), Some(v), "{name}: {k}");
        }
        assert_eq!(conf["dir"], format!("/var/lib/qlist/redis-{i}"), "{name}");
        for addr in conf["bind"].split_whitespace() {
            assert!(
                private(addr.trim_start_matches('-')),
                "{name}: binds {addr}"
            );
        }
        ports.push(conf["port"].clone());

        // The conf as it is, with only its directory (which Redis enters while reading
        // the conf) and port moved to this test's.
        let dir = tmp.path().join(format!("redis-{i}"));
        std::fs::create_dir(&dir).expect("data dir");
        let moved = read(&name).replace(
            &format!("dir /var/lib/qlist/redis-{i}"),
            &format!("dir {}", dir.display()),
        );
        let conf_path = tmp.path().join(&name);
        std::fs::write(&conf_path, moved).expect("write conf");
        let port = idtools::cluster::free_port().expect("port");
        let child = testkit::ChildGuard::spawn(
            "redis-server (Debian package redis-server)",
            Command::new("redis-server")
                .arg(&conf_path)
                .args(["--port", &port.to_string()])
                .stdout(Stdio::null()),
        );
        nodes.0.push(child);
        let node = nodes.0.last_mut().expect("node");
        testkit::wait_for(&name, testkit::WAIT_LIMIT, || {
            if let Some(status) = node.try_wait() {
                panic!("{name}: redis-server exited {status}");
            }
            idtools::cluster::ping(port)
        });
        urls.push(format!("redis://127.0.0.1:{port}"));
    }
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), 5, "five distinct ports");

    // qlist's own durability check accepts every node.
    let urls = urls.join(",");
    let check = idctl(&["check", "--nodes", &urls]);
    assert!(check.status.success(), "{}", text(&check));
    assert_eq!(text(&check).matches(": ok").count(), 5, "{}", text(&check));

    // And the brokers' environment files serve IDs from it.
    for b in ["a", "b"] {
        broker_env_file_serves(b, &urls);
    }
}

/// `KEY=VALUE` lines of an EnvironmentFile.
fn parse_env(name: &str) -> Vec<(String, String)> {
    read(name)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("{name}: not KEY=VALUE: {l}"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn idbroker_help() -> String {
    let out = Command::new(idbroker_bin())
        .arg("--help")
        .output()
        .expect("run idbroker --help");
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// idbroker-`b`.env names only variables idbroker reads, and with only its node list and
/// address moved to the test's, it starts a broker that serves IDs.
fn broker_env_file_serves(b: &str, urls: &str) {
    let name = format!("idbroker-{b}.env");
    let vars = parse_env(&name);
    let help = idbroker_help();
    for (k, _) in &vars {
        assert!(
            k == "RUST_LOG" || help.contains(&format!("[env: {k}]")),
            "{name}: idbroker reads no {k}"
        );
    }
    for k in ["QLIST_NODES", "IDBROKER_LISTEN", "IDBROKER_METRICS_LISTEN"] {
        assert!(vars.iter().any(|(v, _)| v == k), "{name}: no {k}");
    }
    for k in ["IDBROKER_LISTEN", "IDBROKER_METRICS_LISTEN"] {
        let listen = &vars.iter().find(|(v, _)| v == k).expect("listen").1;
        let host = listen.rsplit_once(':').map(|(h, _)| h).unwrap_or("");
        assert!(
            private(host.trim_matches(['[', ']'])),
            "{name}: {k} is {listen}, not a private address"
        );
    }

    let mut cmd = Command::new(idbroker_bin());
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    let broker = Announced::start(
        cmd.env("QLIST_NODES", urls)
            .env("IDBROKER_LISTEN", "127.0.0.1:0")
            .env("IDBROKER_METRICS_LISTEN", "127.0.0.1:0")
            .stderr(Stdio::inherit()),
        &["listening on ", "metrics listening on "],
        START_TIMEOUT,
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    let addr = broker.addr();
    let next = idctl(&["next", "--broker", addr]);
    assert!(next.status.success(), "{name}: {}", text(&next));

    // Its metrics endpoint is on, healthy and ready, and serves every metric the alert
    // rules use.
    let metrics = broker.value(1);
    assert_eq!(
        http_get(metrics, "/healthz"),
        (200, "ok\n".into()),
        "{name}"
    );
    assert_eq!(
        http_get(metrics, "/readyz"),
        (200, "ready\n".into()),
        "{name}"
    );
    let (status, exposition) = http_get(metrics, "/metrics");
    assert_eq!(status, 200, "{name}: {exposition}");
    if let Err(e) = qmetrics::promtool_check(&exposition) {
        panic!("{name}: {e}");
    }
    for metric in alert_rule_metrics() {
        assert!(
            exposition.contains(&format!("\n{metric}{{"))
                || exposition.contains(&format!("\n{metric} "))
                || exposition.contains(&format!("# TYPE {metric} ")),
            "qlist-alerts.yml uses {metric}, which idbroker does not export:\n{exposition}"
        );
    }
}

/// `GET http://{addr}{path}` with qmetrics' client: status and body.
fn http_get(addr: &str, path: &str) -> (u16, String) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime
        .block_on(qmetrics::get(addr, path, Duration::from_secs(10)))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The qlist metric names qlist-alerts.yml uses (in rules and recording-rule names;
/// comments skipped).
fn alert_rule_metrics() -> std::collections::BTreeSet<String> {
    let rules = read("qlist-alerts.yml");
    let mut names = std::collections::BTreeSet::new();
    for line in rules.lines().filter(|l| !l.trim_start().starts_with('#')) {
        for (i, _) in line.match_indices("qlist_") {
            let name: String = line[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    for expected in [
        "qlist_broker_requests_total",
        "qlist_broker_round_duration_seconds_bucket",
        "qlist_metrics_connections_refused_total",
    ] {
        assert!(names.contains(expected), "{expected} not found: {names:?}");
    }
    names
}

/// promtool (Debian package prometheus) with `args`, run in examples/deploy; panics with
/// what it said unless it succeeds.
fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(deploy_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool (Debian package prometheus; run scripts/deps.sh): {e}")
        });
    assert!(
        out.status.success(),
        "promtool {}: {}",
        args.join(" "),
        text(&out)
    );
}

/// The alert rules are valid, and their unit tests (each alert firing on its bad series,
/// quiet on the healthy one) pass.
#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    promtool(&["check", "rules", "qlist-alerts.yml"]);
    promtool(&["test", "rules", "qlist-alerts.test.yml"]);
}

#[test]
fn broker_unit_runs_idbroker_from_its_environment_file() {
    let unit = parse_unit("qlist-idbroker@.service");
    check_common("qlist-idbroker@.service", &unit);
    assert_eq!(
        one(&unit, "Service", "EnvironmentFile"),
        "/etc/qlist/idbroker-%i.env"
    );
    let exec = one(&unit, "Service", "ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/idbroker"), "{exec}");
    let help = idbroker_help();
    for flag in words.filter(|w| w.starts_with("--")) {
        let flag = flag.split('=').next().unwrap_or(flag);
        assert!(
            help.contains(flag),
            "ExecStart flag {flag} unknown to idbroker"
        );
    }
    for b in ["a", "b"] {
        assert!(
            deploy_dir().join(format!("idbroker-{b}.env")).exists(),
            "idbroker-{b}.env missing"
        );
    }
    systemd_analyze_verify();
}

/// systemd's own verifier accepts both units (with the binaries pointed at this build's
/// idbroker and the redis-server on PATH). `scripts/deps.sh` installs it (Debian's
/// systemd); a machine without it fails here rather than skip the check quietly.
fn systemd_analyze_verify() {
    let out = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .expect(
            "systemd-analyze (Debian package systemd) is not installed: run `bash scripts/deps.sh`",
        );
    assert!(out.status.success(), "{}", text(&out));
    let redis = Command::new("sh")
        .args(["-c", "command -v redis-server"])
        .output()
        .expect("sh");
    let redis = String::from_utf8_lossy(&redis.stdout).trim().to_string();
    assert!(!redis.is_empty(), "redis-server not on PATH");
    let tmp = tempfile::tempdir().expect("tempdir");
    for name in ["qlist-redis@.service", "qlist-idbroker@.service"] {
        let unit = read(name)
            .replace(
                "/usr/local/bin/idbroker",
                &idbroker_bin().display().to_string(),
            )
            .replace("/usr/bin/redis-server", &redis);
        std::fs::write(tmp.path().join(name), unit).expect("write unit");
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(tmp.path().join("qlist-redis@.service"))
        .arg(tmp.path().join("qlist-idbroker@.service"))
        .output()
        .expect("run systemd-analyze verify");
    let said = text(&out);
    assert!(out.status.success(), "systemd-analyze verify: {said}");
    assert!(
        !said.contains("qlist-"),
        "systemd-analyze verify warned: {said}"
    );
}

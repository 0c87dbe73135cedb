//! Configuration from the environment and JSON logs, as a user meets them: the real
//! idctl and idbroker binaries (build idbroker first: `cargo build --release -p broker
//! --bins`) with variables set, against real redis-server quorums.

mod common;
use common::{idbroker_bin, text};
use idtools::announced::{Announced, START_TIMEOUT};
use idtools::cluster::{test_quorum, LocalQuorum};
use std::path::Path;
use std::process::{Command, Output, Stdio};

const PASSWORD: &str = "Env-Pw-51d0-never-print";

/// `bin` with `args` and exactly the qlist variables `vars` (any the test runner has are
/// removed, so the test sees only its own).
fn command(bin: &Path, args: &[&str], vars: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    for (name, _) in std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v))) {
        if ["QLIST_", "IDCTL_", "IDBROKER_", "RUST_LOG"]
            .iter()
            .any(|p| name.starts_with(p))
        {
            cmd.env_remove(name);
        }
    }
    cmd.envs(vars.iter().copied());
    cmd
}

fn idctl_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_idctl"))
}

fn run(bin: &Path, args: &[&str], vars: &[(&str, &str)]) -> Output {
    command(bin, args, vars)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()))
}

/// "LO HI" from `idctl next`, as the number of IDs it reserved.
fn reserved(out: &Output) -> u64 {
    assert!(out.status.success(), "{}", text(out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut words = stdout.split_whitespace().map(|w| w.parse::<u64>());
    match (words.next(), words.next()) {
        (Some(Ok(lo)), Some(Ok(hi))) => hi - lo + 1,
        _ => panic!("not 'LO HI': {stdout:?}"),
    }
}

/// Whether the register `key` exists on the first node of `q`.
fn has_key(q: &LocalQuorum, key: &str) -> bool {
    let out = Command::new("redis-cli")
        .args(["-p", &q.ports()[0].to_string(), "EXISTS", key])
        .output()
        .expect("run redis-cli (Debian package redis-tools)");
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).trim() == "1"
}

/// A port nothing listens on (bound, then released).
fn dead_port() -> u16 {
    idtools::cluster::free_port().expect("free port")
}

#[test]
fn variables_set_values_and_flags_win() {
    let q = test_quorum(3);
    let urls = q.urls_arg();
    let idctl = idctl_bin();

    // Everything from the environment: nodes, key, count (a subcommand's own flag).
    let out = run(
        idctl,
        &["next"],
        &[
            ("QLIST_NODES", &urls),
            ("QLIST_KEY", "env-key"),
            ("IDCTL_COUNT", "5"),
        ],
    );
    assert_eq!(reserved(&out), 5);
    assert!(has_key(&q, "env-key"));

    // Flags win over the variables.
    let dead = format!("redis://127.0.0.1:{}", dead_port());
    let out = run(
        idctl,
        &[
            "next", "--nodes", &urls, "--count", "2", "--key", "flag-key",
        ],
        &[
            ("QLIST_NODES", &dead),
            ("QLIST_KEY", "env-key-2"),
            ("IDCTL_COUNT", "5"),
        ],
    );
    assert_eq!(reserved(&out), 2);
    assert!(has_key(&q, "flag-key"));
    assert!(!has_key(&q, "env-key-2"));

    // `--nodes` on the command line silences QLIST_BROKERS (they exclude each other) ...
    let out = run(
        idctl,
        &["next", "--nodes", &urls],
        &[("QLIST_BROKERS", "127.0.0.1:1")],
    );
    assert_eq!(reserved(&out), 1);
    // ... and an on/off flag takes yes/no from its variable (the classic protocol works
    // on the same register).
    let out = run(
        idctl,
        &["next", "--nodes", &urls],
        &[("QLIST_CLASSIC", "yes")],
    );
    assert_eq!(reserved(&out), 1);
}

#[test]
fn help_names_the_variables_and_never_their_values() {
    let secret_nodes = format!("redis://:{PASSWORD}@127.0.0.1:{}", dead_port());
    let vars = [
        ("QLIST_NODES", secret_nodes.as_str()),
        ("QLIST_BROKERS", "127.0.0.1:9"),
        ("IDBROKER_LISTEN", "127.0.0.1:0"),
    ];
    for (bin, args, names) in [
        (
            idctl_bin().to_path_buf(),
            &["next", "--help"][..],
            &[
                "[env: QLIST_NODES]",
                "[env: QLIST_BROKERS]",
                "[env: QLIST_KEY]",
                "[env: QLIST_DEADLINE_MS]",
                "[env: QLIST_CONNECT_TIMEOUT_MS]",
                "[env: QLIST_LOG_FORMAT]",
                "[env: IDCTL_COUNT]",
            ][..],
        ),
        (
            idctl_bin().to_path_buf(),
            &["cluster", "up", "--help"][..],
            &["[env: IDCTL_DIR]", "[env: IDCTL_CLUSTER_UP_NODES]"][..],
        ),
        (
            idbroker_bin(),
            &["--help"][..],
            &[
                "[env: IDBROKER_LISTEN]",
                "[env: IDBROKER_SERVE]",
                "[env: IDBROKER_MAX_CONNECTIONS]",
                "[env: QLIST_NODES]",
                "[env: QLIST_DEADLINE_MS]",
            ][..],
        ),
    ] {
        let out = run(&bin, args, &vars);
        let help = text(&out);
        assert!(out.status.success(), "{args:?}: {help}");
        for name in names {
            assert!(help.contains(name), "{args:?}: no {name} in\n{help}");
        }
        assert!(
            !help.contains(PASSWORD),
            "{args:?} showed the password:\n{help}"
        );
        assert!(
            !help.contains("127.0.0.1:9"),
            "{args:?} showed a value:\n{help}"
        );
    }
}

#[test]
fn a_bad_variable_is_named_without_its_value() {
    let secret_nodes = format!("redis://:{PASSWORD}@127.0.0.1:{}", dead_port());
    for (bin, args, var, value) in [
        (
            idctl_bin().to_path_buf(),
            &["next"][..],
            "QLIST_DEADLINE_MS",
            "ten-seconds",
        ),
        (
            idctl_bin().to_path_buf(),
            &["next"][..],
            "IDCTL_COUNT",
            "many",
        ),
        (
            idctl_bin().to_path_buf(),
            &["next"][..],
            "QLIST_COMBINE",
            "sometimes",
        ),
        (
            idctl_bin().to_path_buf(),
            &["next"][..],
            "QLIST_LOG_FORMAT",
            "xml",
        ),
        (
            idbroker_bin(),
            &["--listen", "127.0.0.1:0"][..],
            "IDBROKER_MAX_COUNT",
            "lots",
        ),
    ] {
        let out = run(&bin, args, &[("QLIST_NODES", &secret_nodes), (var, value)]);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(2), "{var}: {said}");
        assert!(
            said.contains(&format!("environment variable {var}")),
            "{var} not named: {said}"
        );
        assert!(!said.contains(value), "{var}'s value shown: {said}");
        assert!(!said.contains(PASSWORD), "{var}: password shown: {said}");
    }

    // The same flag with a bad value on the command line is clap's usual error.
    let out = run(
        idctl_bin(),
        &["next", "--deadline-ms", "ten-seconds"],
        &[("QLIST_NODES", &secret_nodes)],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        !text(&out).contains("environment variable"),
        "{}",
        text(&out)
    );

    // Both sources in the environment: a usage error naming the flags, no password.
    let out = run(
        idctl_bin(),
        &["next"],
        &[
            ("QLIST_NODES", &secret_nodes),
            ("QLIST_BROKERS", "127.0.0.1:9"),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--nodes"), "{}", text(&out));
    assert!(!text(&out).contains(PASSWORD), "{}", text(&out));

    // A password-bearing QLIST_NODES that cannot be reached: the error, not the password.
    let out = run(
        idctl_bin(),
        &[
            "next",
            "--deadline-ms",
            "300",
            "--connect-timeout-ms",
            "100",
        ],
        &[("QLIST_NODES", &secret_nodes)],
    );
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    assert!(text(&out).contains(":***@127.0.0.1:"), "{}", text(&out));
    assert!(!text(&out).contains(PASSWORD), "{}", text(&out));
}

/// Every line of `stderr` as a JSON object; panics on one that is not.
fn json_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}\nin:\n{stderr}"));
            assert!(v.is_object(), "not an object: {line:?}");
            v
        })
        .collect()
}

fn message(v: &serde_json::Value) -> &str {
    v["fields"]["message"].as_str().unwrap_or("")
}

#[test]
fn log_format_json_makes_every_stderr_line_json() {
    let q = test_quorum(3);
    // The flag: a broker that serves, then stops on SIGTERM.
    let mut broker = Announced::start(
        command(
            &idbroker_bin(),
            &["--log-format", "json", "--listen", "127.0.0.1:0"],
            &[("QLIST_NODES", &q.urls_arg()), ("RUST_LOG", "info")],
        )
        .stderr(Stdio::piped()),
        &["listening on "],
        START_TIMEOUT,
    )
    .expect("idbroker starts");
    let next = run(idctl_bin(), &["next", "--broker", broker.addr()], &[]);
    assert_eq!(reserved(&next), 1);
    broker.signal(libc::SIGTERM);
    let status = broker.wait();
    assert!(status.success(), "idbroker exited {status}");
    let logs = broker.read_stderr();
    let lines = json_lines(&logs);
    assert!(
        lines.iter().any(|v| message(v) == "SIGTERM received"
            && v["level"] == "INFO"
            && v["timestamp"].is_string()),
        "no SIGTERM line in:\n{logs}"
    );
    assert!(
        lines.iter().any(|v| message(v) == "broker stopped"),
        "no 'broker stopped' line in:\n{logs}"
    );

    // The variable, and a failing run: its final error is a JSON line too.
    let dead = format!("redis://:{PASSWORD}@127.0.0.1:{}", dead_port());
    let out = run(
        idctl_bin(),
        &[
            "next",
            "--deadline-ms",
            "300",
            "--connect-timeout-ms",
            "100",
        ],
        &[
            ("QLIST_NODES", &dead),
            ("QLIST_LOG_FORMAT", "json"),
            ("RUST_LOG", "debug"),
        ],
    );
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines = json_lines(&stderr);
    let last = lines.last().expect("an error line");
    assert_eq!(last["level"], "ERROR", "{stderr}");
    assert_eq!(last["fields"]["exit_code"], 5, "{stderr}");
    assert!(message(last).contains("no quorum"), "{stderr}");
    assert!(!stderr.contains(PASSWORD), "{stderr}");

    // The flag after a subcommand (it is global), and it wins over the variable.
    let out = run(
        idctl_bin(),
        &["next", "--deadline-ms", "300", "--log-format", "json"],
        &[("QLIST_NODES", &dead), ("QLIST_LOG_FORMAT", "text")],
    );
    assert_eq!(out.status.code(), Some(5), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        json_lines(&stderr).last().expect("a line")["level"],
        "ERROR"
    );
}

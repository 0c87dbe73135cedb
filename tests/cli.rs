//! The command-line conventions (README, "Command-line conventions") hold for all four
//! binaries: a bad flag is exit code 2, a shared flag has one name, unit and meaning, an
//! unavailable ID generator is exit code 5. Needs neither Redis nor a sublist: the nodes
//! and brokers here are closed ports, so every case fails fast and the same way each run.

mod common;

use common::bin;
use std::process::{Command, Output};

/// The binaries and the arguments that reach their ID-source flags.
const ID_CLIENTS: [(&str, &[&str]); 4] = [
    ("idctl", &["next"]),
    ("idctl", &["bench"]),
    ("idbroker", &["--listen", "127.0.0.1:0"]),
    (
        "producer",
        &["--shard", "0", "--data-dir", "unused", "--generate", "1"],
    ),
];

/// The quorum flags every binary that talks to the quorum accepts (qcli::QuorumArgs).
const QUORUM_FLAGS: [&str; 9] = [
    "--nodes",
    "--key",
    "--connect-timeout-ms",
    "--reply-timeout-ms",
    "--classic",
    "--combine",
    "--backoff-cap-ms",
    "--unsafe-skip-durability-check",
    "--deadline-ms",
];

fn run(name: &str, args: &[&str]) -> Output {
    Command::new(bin(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {name}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// testkit's exit assertion, and `needle` in what it printed on either stream (`--help`
/// prints on stdout); `what` names the command in the failure.
#[track_caller]
fn assert_exit(out: &Output, code: i32, needle: &str, what: &str) {
    testkit::assert_exit(out, code, "");
    assert!(
        text(out).contains(needle),
        "{what}: lacks {needle:?}: {}",
        text(out)
    );
}

/// The help paragraph of `flag` in `help` (long help: the flag's line and its text up to
/// the next flag), whitespace-normalised.
fn paragraph(help: &str, flag: &str) -> String {
    let mut lines = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with(flag));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("{flag} not in:\n{help}"));
    let rest = lines.take_while(|l| !l.trim_start().starts_with('-'));
    std::iter::once(first)
        .chain(rest)
        .flat_map(str::split_whitespace)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local address").port()
}

#[test]
fn every_binary_exits_2_on_a_bad_flag() {
    for (name, args) in [
        ("idctl", &["next", "--nodes", "redis://127.0.0.1:1"][..]),
        ("idctl", &[][..]),
        (
            "idbroker",
            &["--listen", "127.0.0.1:0", "--nodes", "redis://127.0.0.1:1"][..],
        ),
        ("producer", ID_CLIENTS[3].1),
        ("merger", &["--out", "x.bin", "--data-dir", "d"][..]),
        ("merger", &["verify", "x.bin"][..]),
    ] {
        let mut all = args.to_vec();
        all.push("--no-such-flag");
        let out = run(name, &all);
        assert_exit(&out, 2, "--no-such-flag", &format!("{name} {all:?}"));
    }
}

#[test]
fn shared_flags_have_the_same_name_and_help_everywhere() {
    let mut seen: Vec<(String, String, String)> = Vec::new();
    for (name, args) in ID_CLIENTS {
        let mut all = args.to_vec();
        all.push("--help");
        let out = run(name, &all);
        assert_exit(&out, 0, "Exit codes: 0 ok", &format!("{name} {all:?}"));
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        for flag in QUORUM_FLAGS {
            let p = paragraph(&help, flag);
            // idbroker's deadline is the one for requests that do not send their own.
            if flag == "--deadline-ms" {
                assert!(p.contains("milliseconds"), "{name}: {p}");
                continue;
            }
            for (other, other_flag, other_p) in &seen {
                if other_flag == flag {
                    assert_eq!(&p, other_p, "{flag}: {name} and {other} differ");
                }
            }
            seen.push((name.to_string(), flag.to_string(), p));
        }
        if name != "idbroker" {
            for flag in ["--broker", "--connections"] {
                paragraph(&help, flag);
            }
        }
    }
    let merger = run("merger", &["--help"]);
    assert_exit(&merger, 0, "Exit codes: 0 ok", "merger --help");
}

#[test]
fn a_bad_value_of_a_shared_flag_is_exit_2_everywhere() {
    for (name, args) in ID_CLIENTS {
        for bad in [
            &["--deadline-ms", "0"][..],
            &["--connect-timeout-ms", "0"][..],
            &["--combine", "sometimes"][..],
        ] {
            let mut all = args.to_vec();
            all.extend(["--nodes", "redis://127.0.0.1:1"]);
            all.extend(bad);
            let out = run(name, &all);
            assert_exit(&out, 2, bad[0], &format!("{name} {all:?}"));
        }
    }
}

#[test]
fn old_spellings_still_mean_what_they_meant() {
    let nodes = ["--nodes", "redis://127.0.0.1:1"];
    // idctl's --timeout-ms set both timeouts; idbroker's --node-*-timeout-ms and
    // --default-deadline-ms are aliases. A 0 is refused naming the flag: proof they map.
    let cases: [(&str, Vec<&str>, &str); 4] = [
        ("idctl", vec!["next", "--timeout-ms", "0"], "--timeout-ms"),
        (
            "idbroker",
            vec!["--listen", "127.0.0.1:0", "--node-connect-timeout-ms", "0"],
            "--connect-timeout-ms",
        ),
        (
            "idbroker",
            vec!["--listen", "127.0.0.1:0", "--node-reply-timeout-ms", "0"],
            "--reply-timeout-ms",
        ),
        (
            "idbroker",
            vec!["--listen", "127.0.0.1:0", "--default-deadline-ms", "0"],
            "--deadline-ms",
        ),
    ];
    for (name, mut args, needle) in cases {
        args.extend(nodes);
        assert_exit(&run(name, &args), 2, needle, &format!("{name} {args:?}"));
    }
    // producer's --deadline kept its unit (seconds): hidden, it may not meet --deadline-ms.
    let mut args = ID_CLIENTS[3].1.to_vec();
    args.extend(nodes);
    args.extend(["--deadline", "0"]);
    assert_exit(
        &run("producer", &args),
        2,
        "--deadline must be a positive number of seconds",
        "producer --deadline 0",
    );
    args.extend(["--deadline-ms", "100"]);
    assert_exit(
        &run("producer", &args),
        2,
        "cannot be used with",
        "producer --deadline --deadline-ms",
    );
}

#[test]
fn no_quorum_and_no_broker_are_exit_5_everywhere() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    let data = data.to_str().expect("utf-8 temp path");
    let node = format!("redis://127.0.0.1:{}", closed_port());
    let broker = format!("127.0.0.1:{}", closed_port());
    let fast = ["--deadline-ms", "300", "--connect-timeout-ms", "100"];
    let producer = ["--shard", "0", "--data-dir", data, "--generate", "1"];
    let cases: [(&str, Vec<&str>, &str); 6] = [
        ("idctl", vec!["next", "--nodes", &node], "no quorum"),
        (
            "idctl",
            vec!["next", "--broker", &broker],
            "no broker reachable",
        ),
        ("idctl", vec!["check", "--nodes", &node], "unusable"),
        (
            "idbroker",
            vec!["--listen", "127.0.0.1:0", "--nodes", &node],
            "no quorum",
        ),
        (
            "producer",
            [&producer[..], &["--nodes", &node]].concat(),
            "no quorum",
        ),
        (
            "producer",
            [&producer[..], &["--broker", &broker]].concat(),
            "no broker reachable",
        ),
    ];
    for (name, mut args, needle) in cases {
        if args[0] != "check" {
            args.extend(fast);
        }
        assert_exit(&run(name, &args), 5, needle, &format!("{name} {args:?}"));
    }
}

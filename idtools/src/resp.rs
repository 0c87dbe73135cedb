//! Talking RESP to an `idbroker` as its tests do: `redis-cli` runs, a `QLIST.NEXT`
//! reply read back as a range, and the Python that has redis-py.

use idproto::IdRange;
use std::io::Write;
use std::process::{Command, Stdio};

/// The two decimal strings of a `QLIST.NEXT` reply (surrounding white space allowed).
///
/// # Panics
/// If either is not a decimal u64.
#[track_caller]
pub fn parse_range(lo: &str, hi: &str) -> IdRange {
    let lo = lo.trim().parse().expect("lo is a decimal u64");
    let hi = hi.trim().parse().expect("hi is a decimal u64");
    IdRange { lo, hi }
}

/// Runs `redis-cli` against `resp` (`host:port`) with `args`, writing `stdin` to it;
/// its stdout.
///
/// # Panics
/// If `redis-cli` cannot run (Debian package redis-tools) or exits unsuccessfully.
pub fn redis_cli(resp: &str, args: &[&str], stdin: &[u8]) -> String {
    let (host, port) = resp.rsplit_once(':').expect("host:port");
    let mut child = Command::new("redis-cli")
        .args(["-h", host, "-p", port])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run redis-cli (Debian package redis-tools; scripts/deps.sh installs it)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write redis-cli stdin");
    let out = child.wait_with_output().expect("redis-cli output");
    assert!(out.status.success(), "redis-cli {args:?}: {:?}", out.status);
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// The interpreter with Debian's python3-redis: the system one (a python3 first on the
/// PATH may be another installation without it).
pub fn python() -> &'static str {
    if std::path::Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

//! Talking RESP to an `idbroker` as its tests do: `redis-cli` runs, a `QLIST.NEXT`
//! reply read back as a range (or off a raw connection), and the Python that has
//! redis-py.

use idproto::IdRange;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

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

/// Reads one `QLIST.NEXT` reply off a raw connection within `limit`: `*2` and two bulk
/// strings (five lines: `*2`, `$n`, lo, `$n`, hi), or one error line. `buf` holds what
/// was read past the previous reply and keeps what is read past this one, so pipelined
/// replies come one a call.
///
/// # Errors
/// The connection ended, a read failed, or no whole reply came within `limit`.
pub async fn read_reply(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    limit: Duration,
) -> Result<Vec<String>, String> {
    let end = Instant::now() + limit;
    loop {
        let text = String::from_utf8_lossy(buf).into_owned();
        let lines: Vec<&str> = text.split("\r\n").collect();
        let complete = lines.len().saturating_sub(1);
        let need = if text.starts_with('*') { 5 } else { 1 };
        if complete >= need {
            let used: usize = lines[..need].iter().map(|l| l.len() + 2).sum();
            let reply = lines[..need].iter().map(|l| l.to_string()).collect();
            buf.drain(..used);
            return Ok(reply);
        }
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout_at(end, s.read(&mut chunk)).await {
            Err(_) => return Err(format!("no reply within {limit:?}")),
            Ok(Err(e)) => return Err(format!("read: {e}")),
            Ok(Ok(0)) => return Err("closed".into()),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

//! `idbroker --auth-token-file` end to end: a real idbroker process over a real Redis
//! quorum, the real `BrokerClient`, raw old-version Hellos, `redis-cli` and the `redis`
//! crate on the RESP port; and the token never shows in the broker's stderr, in client
//! errors or in the stats.

use idclient::broker_client::{fetch_stats_with_token, BrokerClient, BrokerClientConfig};
use idclient::{IdSource, Token};
use idproto::framed::FrameReader;
use idproto::wire::{self, ServerMsg};
use idtools::announced::{Announced, START_TIMEOUT};
use idtools::cluster::{test_quorum, LocalQuorum};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use testkit::broker::TestBroker;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const SECRET: &str = "tok-7f3a9c2e-do-not-log";

/// A `--serve rounds` broker whose token file holds the token with blanks around it.
fn token_broker(quorum: &LocalQuorum) -> TestBroker {
    TestBroker::start(
        env!("CARGO_BIN_EXE_idbroker"),
        &quorum.urls_arg(),
        Some(&format!("  {SECRET}\n")),
        &["--serve", "rounds"],
    )
}

/// Starts idbroker on the wildcard address with `extra` flags until it announces its
/// listener, then stops it: its stderr.
fn wildcard_broker_log(q: &LocalQuorum, stderr: &Path, extra: &[&std::ffi::OsStr]) -> String {
    let started = Announced::start(
        Command::new(env!("CARGO_BIN_EXE_idbroker"))
            .args(["--listen", "0.0.0.0:0", "--nodes", &q.urls_arg()])
            .args(["--serve", "rounds"])
            .args(extra)
            .stderr(std::fs::File::create(stderr).expect("stderr file")),
        &["listening on "],
        START_TIMEOUT,
    );
    // Stopped before its log is read: everything it wrote is in the file.
    let started = started.map(|mut p| p.kill());
    let log = std::fs::read_to_string(stderr).expect("stderr");
    if let Err(e) = started {
        panic!("idbroker did not start: {e}: {log}");
    }
    log
}

fn write_token(dir: &Path, content: &str, mode: u32) -> PathBuf {
    let path = dir.join("token");
    std::fs::write(&path, content).expect("write token file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

fn config(token: Option<&str>) -> BrokerClientConfig {
    BrokerClientConfig {
        deadline: Duration::from_secs(2),
        token: token.map(|t| Token::new(t).expect("token")),
        ..Default::default()
    }
}

/// idbroker with `args` and the token file must exit 2 before serving; its stderr.
fn refused_at_startup(args: &[&str], token_file: &Path) -> String {
    let token_file = token_file.to_str().expect("utf-8 temp path");
    let args = [args, &["--auth-token-file", token_file]].concat();
    testkit::broker::refused_at_startup(env!("CARGO_BIN_EXE_idbroker"), &args)
}

#[test]
fn unreadable_or_empty_token_files_are_usage_errors_naming_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let empty = write_token(dir.path(), " \n", 0o600);
    let e = refused_at_startup(&[], &empty);
    assert!(
        e.contains("is empty") && e.contains(&empty.display().to_string()),
        "{e}"
    );
    let missing = dir.path().join("missing");
    let e = refused_at_startup(&[], &missing);
    assert!(e.contains(&missing.display().to_string()), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_clients_need_the_token() {
    let q = test_quorum(3);
    let b = token_broker(&q);

    // Without a token, and with a wrong one: refused, with an error that says so, after
    // ONE connection (no retrying until the deadline: no retry changes the token).
    let right = Token::new(SECRET).expect("token");
    let connections = || async {
        fetch_stats_with_token(&b.addr, Some(&right))
            .await
            .expect("stats with the token")
            .connections_total
    };
    for token in [None, Some("wrong-token")] {
        let before = connections().await;
        let e = match BrokerClient::connect(vec![b.addr.clone()], config(token)).await {
            Ok(c) => c.next_ids(1).await.expect_err("served without the token"),
            Err(e) => e,
        };
        // The stats connection counts itself.
        assert_eq!(
            connections().await - before,
            2,
            "one connection was refused"
        );
        let e = e.to_string();
        assert!(
            e.contains(&format!("broker {} refused the token", b.addr)),
            "{e}"
        );
        assert!(!e.contains(SECRET) && !e.contains("wrong-token"), "{e}");
    }

    // The right token: IDs, and stats.
    let c = BrokerClient::connect(vec![b.addr.clone()], config(Some(SECRET)))
        .await
        .expect("connect with the token");
    let r = c.next_ids(3).await.expect("IDs with the token");
    assert!(r.holds_exactly(3), "{r:?}");
    let token = Token::new(SECRET).expect("token");
    let stats = fetch_stats_with_token(&b.addr, Some(&token))
        .await
        .expect("stats with the token");
    assert!(stats.requests_ok >= 1, "{stats:?}");
    assert!(!format!("{stats:?}").contains(SECRET));
    assert!(!format!("{:?}", config(Some(SECRET))).contains(SECRET));
    let e = fetch_stats_with_token(&b.addr, None)
        .await
        .expect_err("stats without the token");
    assert!(e.to_string().contains("refused the token"), "{e}");

    // A version 2 client (no token field) hears that its version is not supported.
    let mut s = TcpStream::connect(&b.addr).await.expect("connect");
    let mut v2 = vec![12, 0, 0, 0, 0, 0, 0, 0];
    v2.extend_from_slice(&wire::MAGIC);
    v2.extend_from_slice(&2u32.to_le_bytes());
    s.write_all(&v2).await.expect("send v2 hello");
    let (rd, _wr) = s.into_split();
    let mut rd = FrameReader::new(rd, Duration::from_secs(5));
    match rd.read_msg::<ServerMsg>().await {
        Ok(Some(ServerMsg::Refused { reason })) => {
            assert!(reason.contains("version 2 not supported"), "{reason}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }

    // RESP: NOAUTH before AUTH, WRONGPASS for a wrong token, then served.
    let (host, port) = b.resp.rsplit_once(':').expect("host:port");
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-h", host, "-p", port])
            .args(args)
            .output()
            .expect("run redis-cli (Debian package redis-tools; scripts/deps.sh installs it)");
        assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
        // redis-cli reports a failed AUTH on stderr, then runs the command anyway.
        let err = String::from_utf8_lossy(&out.stderr);
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            err.into_owned(),
        )
    };
    let (out, _) = cli(&["QLIST.NEXT"]);
    assert!(out.contains("NOAUTH Authentication required."), "{out}");
    let (out, err) = cli(&["--no-auth-warning", "-a", "wrong-token", "QLIST.NEXT"]);
    assert!(err.contains("WRONGPASS"), "{err}");
    assert!(out.contains("NOAUTH"), "{out}");
    assert!(!err.contains("wrong-token"), "{err}");
    let (out, _) = cli(&["--no-auth-warning", "--pass", SECRET, "QLIST.NEXT", "2"]);
    let lines: Vec<u64> = out
        .lines()
        .map(|l| l.trim().parse().expect("an ID"))
        .collect();
    assert!(lines.len() == 2 && lines[1] == lines[0] + 1, "{out}");
    let (out, _) = cli(&[
        "--no-auth-warning",
        "--user",
        "default",
        "--pass",
        SECRET,
        "PING",
    ]);
    assert_eq!(out.trim(), "PONG");

    // The redis crate, password in the URL (AUTH, or HELLO 3 AUTH for RESP3).
    for protocol in ["resp2", "resp3"] {
        let url = format!("redis://:{SECRET}@{}/?protocol={protocol}", b.resp);
        let client = redis::Client::open(url).expect("redis URL");
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis crate connects with the token");
        let (lo, hi): (String, String) = redis::cmd("QLIST.NEXT")
            .arg(4)
            .query_async(&mut con)
            .await
            .expect("QLIST.NEXT 4");
        let (lo, hi): (u64, u64) = (lo.parse().expect("lo"), hi.parse().expect("hi"));
        assert_eq!(hi - lo, 3);
        let bad = format!("redis://:nope@{}/?protocol={protocol}", b.resp);
        let e = match redis::Client::open(bad)
            .expect("redis URL")
            .get_multiplexed_async_connection()
            .await
        {
            Ok(_) => panic!("connected with a wrong password"),
            Err(e) => e.to_string(),
        };
        // RESP2 (AUTH): the redis crate's AuthenticationFailed; RESP3 (HELLO 3 AUTH):
        // our WRONGPASS as is.
        assert!(
            e.contains("AuthenticationFailed") || e.contains("WRONGPASS"),
            "{e}"
        );
        assert!(!e.contains("nope") && !e.contains(SECRET), "{e}");
    }

    // Nothing above put the token in the broker's logs.
    let log = b.stderr();
    assert!(!log.contains(SECRET), "token in stderr:\n{log}");
    assert!(!log.contains("readable by group"), "{log}");
}

#[test]
fn shared_token_files_and_open_listeners_are_warned_about() {
    let q = test_quorum(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let token = write_token(dir.path(), SECRET, 0o644);
    let stderr = dir.path().join("stderr");
    let log = wildcard_broker_log(
        &q,
        &stderr,
        &["--auth-token-file".as_ref(), token.as_os_str()],
    );
    assert!(log.contains("readable by group or others"), "{log}");
    // With a token, a wildcard listener is not warned about.
    assert!(!log.contains("no --auth-token-file"), "{log}");
    assert!(!log.contains(SECRET), "{log}");

    // Without a token on a wildcard address: warned.
    let log = wildcard_broker_log(&q, &stderr, &[]);
    assert!(log.contains("no --auth-token-file is set"), "{log}");
}

//! `idbroker --listen-tls-cert/--listen-tls-key` end to end: a real idbroker process
//! over a real Redis quorum, TLS on both listeners with throwaway certificates
//! ([`testkit::pki`]), and real clients: the Rust `BrokerClient`, `redis-cli --tls` and
//! redis-py with `ssl=True`. Plain-TCP clients, clients trusting the wrong CA and clients
//! that send nothing fail clearly, each costing only its own connection.

use idclient::broker_client::{fetch_stats_with, BrokerClient, BrokerClientConfig};
use idclient::{BrokerTls, ClientCert, IdError, IdSource, Token};
use idtools::announced::{Announced, START_TIMEOUT};
use idtools::cluster::{test_quorum, LocalQuorum};
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use testkit::broker::TestBroker;
use testkit::pki::Pki;
use testkit::resp::python;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const SECRET: &str = "tls-tok-5b1d0e-never-logged";

/// A `--serve rounds` broker with TLS (`pki`'s server certificate), the token, and
/// `extra` arguments.
fn rounds_broker(quorum: &LocalQuorum, pki: &Pki, extra: &[&str]) -> TestBroker {
    tls_broker(quorum, pki, &[&["--serve", "rounds"], extra].concat())
}

/// A `--serve window` broker (it takes part in the election) with TLS, the token,
/// `--peer-tls-ca` (the CA of the other brokers' certificates: the same one) and
/// `extra` arguments.
fn window_broker(quorum: &LocalQuorum, pki: &Pki, extra: &[&str]) -> TestBroker {
    let ca = pki.ca.to_str().expect("utf-8 path");
    let timing = ["--election-timeout-ms", "200", "--heartbeat-ms", "50"];
    tls_broker(
        quorum,
        pki,
        &[&timing, &["--peer-tls-ca", ca][..], extra].concat(),
    )
}

/// An idbroker with TLS on both listeners and the token, and `extra` arguments.
fn tls_broker(quorum: &LocalQuorum, pki: &Pki, extra: &[&str]) -> TestBroker {
    let tls = [
        OsStr::new("--listen-tls-cert"),
        pki.server_cert.as_os_str(),
        OsStr::new("--listen-tls-key"),
        pki.server_key.as_os_str(),
    ];
    let args: Vec<&OsStr> = tls
        .into_iter()
        .chain(extra.iter().map(OsStr::new))
        .collect();
    TestBroker::start(
        env!("CARGO_BIN_EXE_idbroker"),
        &quorum.urls_arg(),
        Some(SECRET),
        &args,
    )
}

/// The port of the broker's RESP listener.
fn resp_port(b: &TestBroker) -> &str {
    b.resp.rsplit_once(':').expect("host:port").1
}

fn pki() -> Pki {
    Pki::new().expect("make the test certificates")
}

fn trusting(ca: &Path) -> BrokerTls {
    BrokerTls::new(ca, None, None).expect("load the CA")
}

fn config(tls: Option<BrokerTls>) -> BrokerClientConfig {
    BrokerClientConfig {
        deadline: Duration::from_secs(2),
        token: Some(Token::new(SECRET).expect("token")),
        tls,
        ..Default::default()
    }
}

async fn next_ids(addr: &str, config: BrokerClientConfig, n: u64) -> Result<(u64, u64), IdError> {
    let client = BrokerClient::connect(vec![addr.to_string()], config).await?;
    let r = client.next_ids(n).await?;
    Ok((r.lo, r.hi))
}

/// `redis-cli` on the broker's RESP port with `args`; its stdout and stderr.
fn redis_cli(b: &TestBroker, args: &[&str]) -> (String, String) {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", resp_port(b)])
        .args(args)
        .output()
        .expect("run redis-cli (Debian package redis-tools; scripts/deps.sh installs it)");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_client_gets_ids_over_tls_with_the_token() {
    let (q, pki) = (test_quorum(3), pki());
    let b = rounds_broker(&q, &pki, &[]);
    let ca = pki.ca.to_str().expect("utf-8 path");

    // The Rust client, by IP address (the certificate names 127.0.0.1)...
    let (lo, hi) = next_ids(&b.addr, config(Some(trusting(&pki.ca))), 5)
        .await
        .expect("IDs over TLS");
    assert_eq!(hi, lo + 4);
    // ...and by a name the certificate is issued to, given explicitly.
    let named = BrokerTls::new(&pki.ca, Some("localhost".into()), None).expect("CA");
    let (lo2, _) = next_ids(&b.addr, config(Some(named)), 1)
        .await
        .expect("IDs over TLS with an explicit server name");
    assert!(lo2 > hi);
    let tls = trusting(&pki.ca);
    let token = Token::new(SECRET).expect("token");
    let stats = fetch_stats_with(&b.addr, Some(&token), Some(&tls))
        .await
        .expect("stats over TLS");
    assert!(stats.requests_ok >= 2, "{stats:?}");

    // redis-cli --tls.
    let (out, err) = redis_cli(
        &b,
        &[
            "--tls",
            "--cacert",
            ca,
            "--no-auth-warning",
            "--pass",
            SECRET,
            "QLIST.NEXT",
            "3",
        ],
    );
    let ids: Vec<u64> = out
        .lines()
        .map(|l| l.trim().parse().expect("an ID"))
        .collect();
    assert!(ids.len() == 2 && ids[1] == ids[0] + 2, "{out} {err}");
    assert!(ids[0] > lo2, "{out}");

    // redis-py, ssl=True.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/resp_tls_client.py");
    let out = Command::new(python())
        .args([script, "127.0.0.1", resp_port(&b), ca, SECRET])
        .output()
        .expect("run python3 (Debian packages python3, python3-redis)");
    assert!(
        out.status.success(),
        "redis-py client failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let ranges: Vec<(u64, u64)> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| {
            let (lo, hi) = l.split_once(' ').expect("LO HI");
            (lo.parse().expect("LO"), hi.parse().expect("HI"))
        })
        .collect();
    assert_eq!(ranges.len(), 11, "{ranges:?}");
    assert!(ranges[0].0 > ids[1], "{ranges:?}");
    assert!(ranges.windows(2).all(|w| w[1].0 > w[0].1), "{ranges:?}");

    // Clients that left (without a TLS close_notify, most of them) closed normally: once
    // only the stats connection is open, none counts as dropped.
    let mut stats = stats;
    for _ in 0..100 {
        stats = fetch_stats_with(&b.addr, Some(&token), Some(&tls))
            .await
            .expect("stats over TLS");
        if stats.connections_open == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(stats.connections_open, 1, "{stats:?}");
    assert_eq!(stats.connections_dropped, 0, "{stats:?}");

    // Loopback listeners with a token and TLS: no warning, and the token is never logged.
    let err = b.stderr();
    assert!(!err.contains("clear text"), "{err}");
    assert!(!err.contains(SECRET), "{err}");
}

/// Three window brokers listening with TLS: a follower forwards a Redis client's
/// `QLIST.NEXT` to the leader over TLS (`--peer-tls-ca`, presenting its own certificate
/// to a leader that requires client certificates).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_forwards_resp_requests_to_the_leader_over_tls() {
    let (q, pki) = (test_quorum(3), pki());
    let client_ca = pki.ca.to_str().expect("utf-8 path");
    let brokers: Vec<TestBroker> = (0..3)
        .map(|_| window_broker(&q, &pki, &["--listen-tls-client-ca", client_ca]))
        .collect();
    let tls = BrokerTls::new(
        &pki.ca,
        None,
        Some(ClientCert {
            cert_file: pki.client_cert.clone(),
            key_file: pki.client_key.clone(),
        }),
    )
    .expect("client TLS");
    let token = Token::new(SECRET).expect("token");
    // A follower that knows the leader (each announced itself only once it did).
    let mut follower = None;
    for b in &brokers {
        let s = fetch_stats_with(&b.addr, Some(&token), Some(&tls))
            .await
            .expect("stats over TLS");
        if s.role == "follower" && s.leader.is_some() {
            follower = Some(b);
            break;
        }
    }
    let f = follower.expect("two of three brokers follow");
    let (out, err) = redis_cli(
        f,
        &[
            "--tls",
            "--cacert",
            client_ca,
            "--cert",
            pki.client_cert.to_str().expect("utf-8 path"),
            "--key",
            pki.client_key.to_str().expect("utf-8 path"),
            "--no-auth-warning",
            "--pass",
            SECRET,
            "QLIST.NEXT",
            "3",
        ],
    );
    let ids: Vec<u64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert!(
        ids.len() == 2 && ids[1] == ids[0] + 2,
        "{out} {err} {}",
        f.stderr()
    );
    let s = fetch_stats_with(&f.addr, Some(&token), Some(&tls))
        .await
        .expect("stats over TLS");
    assert_eq!((s.forwarded, s.ids), (1, 0), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_clients_are_told_to_use_tls_and_others_are_served() {
    let (q, pki) = (test_quorum(3), pki());
    let b = rounds_broker(&q, &pki, &[]);

    let e = next_ids(&b.addr, config(None), 1)
        .await
        .expect_err("plain TCP to a TLS listener");
    let msg = e.to_string();
    assert!(msg.contains("listens with TLS only"), "{msg}");

    let (out, _) = redis_cli(&b, &["QLIST.NEXT"]);
    assert!(out.contains("listens with TLS only"), "{out}");

    // The broker still serves TLS clients, binary and RESP.
    next_ids(&b.addr, config(Some(trusting(&pki.ca))), 1)
        .await
        .expect("IDs over TLS after plain clients were refused");
    let ca = pki.ca.to_str().expect("utf-8 path");
    let (out, err) = redis_cli(
        &b,
        &[
            "--tls",
            "--cacert",
            ca,
            "--no-auth-warning",
            "--pass",
            SECRET,
            "PING",
        ],
    );
    assert_eq!(out.trim(), "PONG", "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_another_ca_fails_certificate_verification() {
    let (q, pki) = (test_quorum(3), pki());
    let b = rounds_broker(&q, &pki, &[]);

    let e = next_ids(&b.addr, config(Some(trusting(&pki.other_ca))), 1)
        .await
        .expect_err("the broker's certificate is not from other_ca");
    let msg = e.to_string();
    assert!(msg.contains("certificate verification failed"), "{msg}");
    let tls = trusting(&pki.other_ca);
    let e = fetch_stats_with(&b.addr, None, Some(&tls))
        .await
        .expect_err("stats from a broker whose certificate does not verify");
    assert!(
        e.to_string().contains("certificate verification failed"),
        "{e}"
    );

    // A name the certificate is not issued to fails the same way.
    let misnamed = BrokerTls::new(&pki.ca, Some("broker.example".into()), None).expect("CA");
    let msg = next_ids(&b.addr, config(Some(misnamed)), 1)
        .await
        .expect_err("wrong server name")
        .to_string();
    assert!(msg.contains("certificate verification failed"), "{msg}");

    // redis-cli with the wrong CA.
    let other = pki.other_ca.to_str().expect("utf-8 path");
    let (out, err) = redis_cli(&b, &["--tls", "--cacert", other, "PING"]);
    assert!(!out.contains("PONG"), "{out}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
}

/// Reads from `stream` until the broker closes it (EOF or reset), polling at most `tries`
/// times for a second each: whether it was closed.
async fn closed_by_broker(stream: &mut TcpStream, tries: usize) -> bool {
    let mut buf = [0u8; 64];
    for _ in 0..tries {
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => return false, // the broker said something: not a silent close
            Err(_) => {}
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_clients_are_dropped_after_the_handshake_timeout_while_others_are_served() {
    let (q, pki) = (test_quorum(3), pki());
    let b = rounds_broker(&q, &pki, &["--handshake-timeout-ms", "1500"]);

    // Connections that never send a ClientHello, on both listeners.
    let mut silent = Vec::new();
    for addr in [&b.addr, &b.resp].iter().cycle().take(20) {
        silent.push(TcpStream::connect(addr.as_str()).await.expect("connect"));
    }
    // They do not hold up anyone else.
    next_ids(&b.addr, config(Some(trusting(&pki.ca))), 1)
        .await
        .expect("IDs while silent connections are open");
    let ca = pki.ca.to_str().expect("utf-8 path");
    let (out, err) = redis_cli(
        &b,
        &[
            "--tls",
            "--cacert",
            ca,
            "--no-auth-warning",
            "--pass",
            SECRET,
            "PING",
        ],
    );
    assert_eq!(out.trim(), "PONG", "{err}");

    // Each is closed by the broker (the limit is 1.5 s; 30 s of polling is plenty).
    for s in &mut silent {
        assert!(
            closed_by_broker(s, 30).await,
            "a silent connection was kept"
        );
    }
    let log = b.stderr();
    assert!(log.contains("no TLS handshake within"), "{log}");
    next_ids(&b.addr, config(Some(trusting(&pki.ca))), 1)
        .await
        .expect("IDs after the silent connections were dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_client_certificate_is_checked() {
    let (q, pki) = (test_quorum(3), pki());
    let client_ca = pki.ca.to_str().expect("utf-8 path");
    let b = rounds_broker(&q, &pki, &["--listen-tls-client-ca", client_ca]);

    let e = next_ids(&b.addr, config(Some(trusting(&pki.ca))), 1)
        .await
        .expect_err("no client certificate");
    let msg = e.to_string();
    assert!(msg.contains("requires a client certificate"), "{msg}");

    let cert = ClientCert {
        cert_file: pki.client_cert.clone(),
        key_file: pki.client_key.clone(),
    };
    let tls = BrokerTls::new(&pki.ca, None, Some(cert)).expect("client TLS");
    next_ids(&b.addr, config(Some(tls)), 1)
        .await
        .expect("IDs with a client certificate");
    let dir = pki.dir.path();
    let (out, err) = redis_cli(
        &b,
        &[
            "--tls",
            "--cacert",
            client_ca,
            "--cert",
            dir.join("client.pem").to_str().expect("utf-8"),
            "--key",
            dir.join("client.key").to_str().expect("utf-8"),
            "--no-auth-warning",
            "--pass",
            SECRET,
            "PING",
        ],
    );
    assert_eq!(out.trim(), "PONG", "{err}");
}

/// idbroker with `args` must exit 2 before serving; its stderr.
fn refused_at_startup(args: &[&str]) -> String {
    testkit::broker::refused_at_startup(env!("CARGO_BIN_EXE_idbroker"), args)
}

#[test]
fn bad_tls_files_are_usage_errors_naming_the_file_never_the_key() {
    let pki = pki();
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let (cert, key) = (path(&pki.server_cert), path(&pki.server_key));

    let e = refused_at_startup(&["--listen-tls-cert", &cert]);
    assert!(e.contains("--listen-tls-key"), "{e}");
    let e = refused_at_startup(&["--listen-tls-key", &key]);
    assert!(e.contains("--listen-tls-cert"), "{e}");

    let missing = path(&pki.dir.path().join("missing.pem"));
    let e = refused_at_startup(&["--listen-tls-cert", &missing, "--listen-tls-key", &key]);
    assert!(e.contains(&missing) && e.contains("cannot read"), "{e}");

    // A key file holding a certificate: named, and no PEM content shown.
    let e = refused_at_startup(&["--listen-tls-cert", &cert, "--listen-tls-key", &cert]);
    assert!(e.contains(&cert) && e.contains("private key"), "{e}");
    assert!(!e.contains("-----BEGIN"), "{e}");

    // A key that is not the certificate's: named, and the key never shown.
    let other_key = path(&pki.client_key);
    let e = refused_at_startup(&["--listen-tls-cert", &cert, "--listen-tls-key", &other_key]);
    assert!(e.contains(&other_key), "{e}");
    let pem = std::fs::read_to_string(&pki.client_key).expect("key");
    let body = pem.lines().nth(1).expect("a base64 line");
    assert!(!e.contains(body) && !e.contains("-----BEGIN"), "{e}");
}

#[test]
fn a_token_without_tls_on_a_public_address_is_warned_about() {
    let q = test_quorum(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let token = dir.path().join("token");
    std::fs::write(&token, SECRET).expect("write token file");
    let stderr = dir.path().join("stderr");
    let started = Announced::start(
        Command::new(env!("CARGO_BIN_EXE_idbroker"))
            .args(["--listen", "0.0.0.0:0", "--nodes", &q.urls_arg()])
            .args(["--serve", "rounds", "--auth-token-file"])
            .arg(&token)
            .stderr(std::fs::File::create(&stderr).expect("stderr file")),
        &["listening on "],
        START_TIMEOUT,
    )
    .map(|mut p| p.kill());
    let log = std::fs::read_to_string(&stderr).expect("stderr");
    assert!(started.is_ok(), "{started:?} {log}");
    assert!(log.contains("token travels in clear text"), "{log}");
    assert!(!log.contains(SECRET), "{log}");
}

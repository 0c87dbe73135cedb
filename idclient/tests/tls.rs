//! `rediss://` nodes on real redis-server processes that speak TLS only (`--port 0
//! --tls-port`), with throwaway certificates ([`testkit::pki`]): a CA, a server certificate
//! for 127.0.0.1, a client certificate, and a second CA that signed none of them.

use idclient::{ClientCert, ClientConfig, IdError, IdSource, Protocol, QuorumClient, TlsConfig};
use idtools::bench;
use idtools::cluster::{test_quorum_tls, LocalQuorum};
use std::path::Path;
use std::time::Duration;
use testkit::pki::Pki;

/// A password in the nodes' URLs: it must never show in an error.
const PASSWORD: &str = "tls-test-s3cret";

fn pki() -> Pki {
    Pki::new().expect("make the test certificates")
}

fn config(urls: Vec<String>, tls: TlsConfig) -> ClientConfig {
    let mut c = ClientConfig::new(urls);
    c.tls = tls;
    c.connect_timeout = Duration::from_secs(2);
    c.reply_timeout = Duration::from_secs(2);
    c
}

fn trusting(ca: &Path) -> TlsConfig {
    TlsConfig {
        ca_file: Some(ca.to_path_buf()),
        client_cert: None,
    }
}

fn with_client_cert(pki: &Pki) -> TlsConfig {
    TlsConfig {
        ca_file: Some(pki.ca.clone()),
        client_cert: Some(ClientCert {
            cert_file: pki.client_cert.clone(),
            key_file: pki.client_key.clone(),
        }),
    }
}

/// The error of connecting with `config`; a client that connects is a test failure.
async fn connect_err(config: ClientConfig) -> IdError {
    match QuorumClient::connect(config).await {
        Ok(_) => panic!("connected, but must not"),
        Err(e) => e,
    }
}

/// Every node of `q`, named by its port, appears in `msg`.
#[track_caller]
fn names_every_node(q: &LocalQuorum, msg: &str) {
    for port in q.ports() {
        assert!(
            msg.contains(&format!("127.0.0.1:{port}")),
            "{msg}: node {port} not named"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_over_a_tls_quorum_in_every_protocol() {
    let pki = pki();
    let q = test_quorum_tls(3, pki.tls_nodes(false));
    assert!(q.urls().iter().all(|u| u.starts_with("rediss://")));
    let mut last = 0;
    for protocol in [Protocol::Fast, Protocol::Classic] {
        let mut c = config(q.urls(), trusting(&pki.ca));
        c.protocol = protocol;
        let client = QuorumClient::connect(c).await.expect("connect over TLS");
        for _ in 0..20 {
            let r = client.next_ids(3).await.expect("IDs over TLS");
            assert!(r.lo > last, "{r:?} after {last}");
            last = r.hi;
        }
    }
    // Combined rounds: the rendezvous script and the results subscription, both over TLS.
    let tls = config(q.urls(), trusting(&pki.ca));
    bench::assert_combining_run(&tls, 6, Duration::from_millis(800)).await;
}

#[tokio::test]
async fn a_restarted_tls_node_serves_again() {
    let pki = pki();
    let mut q = test_quorum_tls(3, pki.tls_nodes(false));
    let client = QuorumClient::connect(config(q.urls(), trusting(&pki.ca)))
        .await
        .expect("connect over TLS");
    let before = client.next_ids(1).await.expect("IDs");
    // Ready only once the new process says so: its old log already holds a "Ready" line.
    q.restart(0).expect("restart a TLS node");
    let timeout = Duration::from_secs(2);
    let checks = idclient::check_nodes(&q.urls()[..1], timeout, timeout, &trusting(&pki.ca))
        .await
        .expect("valid settings");
    assert_eq!(checks[0].verdict, Ok(Vec::new()), "{}", checks[0].addr);
    let after = client.next_ids(1).await.expect("IDs after the restart");
    assert!(after.lo > before.hi);
}

#[tokio::test]
async fn idctl_checks_tls_nodes() {
    let pki = pki();
    let q = test_quorum_tls(3, pki.tls_nodes(true));
    let timeout = Duration::from_secs(2);
    let checks = idclient::check_nodes(&q.urls(), timeout, timeout, &with_client_cert(&pki))
        .await
        .expect("valid settings");
    assert_eq!(checks.len(), 3);
    for c in &checks {
        assert_eq!(c.verdict, Ok(Vec::new()), "{}", c.addr);
    }
    let checks = idclient::check_nodes(&q.urls(), timeout, timeout, &trusting(&pki.other_ca))
        .await
        .expect("valid settings");
    for c in &checks {
        let reason = c.verdict.as_ref().expect_err("another CA");
        assert!(
            reason.contains("TLS handshake failed"),
            "{}: {reason}",
            c.addr
        );
    }
}

#[tokio::test]
async fn a_node_certificate_from_another_ca_is_a_clear_error() {
    let pki = pki();
    let q = test_quorum_tls(3, pki.tls_nodes(false));
    // A password in every URL: the error names the nodes, never it.
    let urls: Vec<String> = q
        .ports()
        .iter()
        .map(|p| format!("rediss://qlist:{PASSWORD}@127.0.0.1:{p}"))
        .collect();
    let e = connect_err(config(urls, trusting(&pki.other_ca))).await;
    let msg = e.to_string();
    assert!(matches!(e, IdError::NoQuorum { .. }), "{msg}");
    assert!(msg.contains("TLS handshake failed"), "{msg}");
    assert!(msg.contains("UnknownIssuer"), "{msg}");
    names_every_node(&q, &msg);
    assert!(!msg.contains(PASSWORD), "{msg} shows the password");
    assert!(
        !format!("{e:?}").contains(PASSWORD),
        "{e:?} shows the password"
    );
}

#[tokio::test]
async fn a_required_client_certificate_is_presented() {
    let pki = pki();
    let q = test_quorum_tls(3, pki.tls_nodes(true));
    let e = connect_err(config(q.urls(), trusting(&pki.ca))).await;
    let msg = e.to_string();
    assert!(matches!(e, IdError::NoQuorum { .. }), "{msg}");
    assert!(msg.contains("TLS handshake failed"), "{msg}");
    names_every_node(&q, &msg);

    let client = QuorumClient::connect(config(q.urls(), with_client_cert(&pki)))
        .await
        .expect("connect with a client certificate");
    let a = client.next_ids(1).await.expect("IDs");
    let b = client.next_ids(1).await.expect("IDs");
    assert!(b.lo > a.hi);
}

#[tokio::test]
async fn unreadable_tls_files_are_named() {
    let pki = pki();
    let urls = vec!["rediss://127.0.0.1:1".to_string()];
    let missing = pki.dir.path().join("no-such-ca.pem");
    let e = connect_err(config(urls.clone(), trusting(&missing))).await;
    let msg = e.to_string();
    assert!(matches!(e, IdError::Config(_)), "{msg}");
    assert!(msg.contains(&missing.display().to_string()), "{msg}");

    // A key where the CA should be: no certificate in it.
    let e = connect_err(config(urls.clone(), trusting(&pki.client_key))).await;
    let msg = e.to_string();
    assert!(
        msg.contains(&pki.client_key.display().to_string()) && msg.contains("no PEM certificate"),
        "{msg}"
    );

    // A certificate where the key should be.
    let mut tls = with_client_cert(&pki);
    if let Some(c) = tls.client_cert.as_mut() {
        c.key_file = pki.client_cert.clone();
    }
    let e = connect_err(config(urls, tls)).await;
    let msg = e.to_string();
    assert!(
        msg.contains(&pki.client_cert.display().to_string()) && msg.contains("private key"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_plain_node_with_tls_settings_is_refused() {
    let pki = pki();
    let urls = vec![
        "rediss://127.0.0.1:1".to_string(),
        format!("redis://:{PASSWORD}@127.0.0.1:2"),
        "rediss://127.0.0.1:3".to_string(),
    ];
    let e = connect_err(config(urls, trusting(&pki.ca))).await;
    let msg = e.to_string();
    assert!(matches!(e, IdError::Config(_)), "{msg}");
    assert!(
        msg.contains("127.0.0.1:2") && msg.contains("rediss://"),
        "{msg}"
    );
    assert!(!msg.contains(PASSWORD), "{msg} shows the password");
}

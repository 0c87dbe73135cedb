//! The broker client reaches the leader from any broker it is given: real `idbroker --serve window` processes on a real Redis quorum, the real
//! `BrokerClient`, and TCP proxies owned by the test standing where a load balancer, a
//! misadvertised address or another host name would.
//!
//! - Behind one address (a load balancer, round-robin or sticky to a follower), every
//!   request succeeds and each caller's IDs rise.
//! - A leader that advertises an address leading back to a follower makes every request
//!   end after a bounded number of redirects, counted at the proxy.
//! - Over TLS, a redirect target's certificate must verify for the redirect's host (or
//!   the pinned `--broker-tls-server-name`).

use idclient::broker_client::{fetch_stats, fetch_stats_with, BrokerClient, BrokerClientConfig};
use idclient::{BrokerTls, IdError, IdSource};
use idtools::cluster::{test_quorum, LocalQuorum};
use idtools::history::{assert_linearizable, Event, Recorder};
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;
use testkit::broker::TestBroker;
use testkit::pki::Pki;
use testkit::proxy::{Pick, Proxy};

/// Election timing of these tests (fast, as in tests/leader.rs).
const TIMING: [&str; 4] = ["--election-timeout-ms", "200", "--heartbeat-ms", "50"];

/// A window broker (no token) with the test timing and `extra` arguments.
fn broker<A: AsRef<OsStr>>(q: &LocalQuorum, extra: &[A]) -> TestBroker {
    let args: Vec<&OsStr> = TIMING
        .iter()
        .map(OsStr::new)
        .chain(extra.iter().map(AsRef::as_ref))
        .collect();
    TestBroker::start(env!("CARGO_BIN_EXE_idbroker"), &q.urls_arg(), None, &args)
}

/// Starts the leader (first, alone: it wins) then a follower that knows it; checks both
/// roles with `stats` (plain or TLS).
async fn leader_then_follower<A: AsRef<OsStr>>(
    q: &LocalQuorum,
    leader_args: &[A],
    follower_args: &[A],
    tls: Option<(&BrokerTls, &BrokerTls)>,
) -> (TestBroker, TestBroker) {
    let leader = broker(q, leader_args);
    let follower = broker(q, follower_args);
    let (lt, ft) = match tls {
        Some((l, f)) => (Some(l), Some(f)),
        None => (None, None),
    };
    let ls = fetch_stats_with(&leader.addr, None, lt)
        .await
        .expect("leader stats");
    let fs = fetch_stats_with(&follower.addr, None, ft)
        .await
        .expect("follower stats");
    assert_eq!(ls.role, "leader", "{ls:?}");
    assert_eq!(fs.role, "follower", "{fs:?}");
    (leader, follower)
}

fn config(deadline: Duration) -> BrokerClientConfig {
    BrokerClientConfig {
        deadline,
        ..Default::default()
    }
}

/// `callers` tasks of one client, each asking `per_caller` single IDs in turn: every
/// event, and each caller's IDs in order.
async fn run_callers(
    client: &Arc<BrokerClient>,
    callers: usize,
    per_caller: usize,
) -> (Vec<Event>, Vec<Vec<Result<u64, IdError>>>) {
    let history = Recorder::new();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (client, history) = (client.clone(), history.clone());
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for _ in 0..per_caller {
                    let r = history.record(client.next_ids(1)).await;
                    let failed = r.is_err();
                    ids.push(r.map(|r| r.lo));
                    if failed {
                        break; // Said by the test; the rest would fail the same way.
                    }
                }
                ids
            })
        })
        .collect();
    let mut per = Vec::new();
    for t in tasks {
        per.push(t.await.expect("caller task"));
    }
    (history.take(), per)
}

/// Finding 9: one address in front of a leader and a follower, as a load balancer (or a
/// DNS name, or a Kubernetes Service) stands. Round-robin, and sticky to the follower
/// (client-IP affinity: every connection of this host lands on it): every request
/// succeeds, each caller's IDs rise, the history checks; the client keeps its connections
/// to the leader it was redirected to (the follower redirects only a few times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_in_front_of_leader_and_follower_serves_every_request() {
    let q = test_quorum(3);
    let none: [&str; 0] = [];
    let (leader, follower) = leader_then_follower(&q, &none, &none, None).await;
    for pick in [Pick::RoundRobin, Pick::Sticky] {
        let lb = Proxy::start("127.0.0.1", pick);
        lb.route(&[&follower.addr, &leader.addr]);
        let before = fetch_stats(&follower.addr).await.expect("stats").redirects;
        let client = Arc::new(
            BrokerClient::connect(vec![lb.addr()], config(Duration::from_secs(5)))
                .await
                .expect("connect through the load balancer"),
        );
        let (events, per_caller) = run_callers(&client, 4, 100).await;
        for ids in &per_caller {
            let ids: Vec<u64> = ids
                .iter()
                .map(|r| match r {
                    Ok(id) => *id,
                    Err(e) => panic!("a request through {} ({pick:?}) failed: {e}", lb.addr()),
                })
                .collect();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "{pick:?}: {ids:?}");
        }
        assert_linearizable(&events);
        // Pooled: the connections go to the leader and stay there, instead of a redirect
        // per request.
        let redirects = fetch_stats(&follower.addr).await.expect("stats").redirects - before;
        assert!(
            redirects <= 4,
            "{pick:?}: {redirects} redirects for 400 requests"
        );
        drop(client);
    }
}

/// Finding 6, client side: the leader advertises an address that leads to the follower
/// (here the test's counting proxy). Each request ends after a bounded number of
/// redirects, with an error naming the addresses seen, whether the client was given the
/// follower or the misadvertised address; the connections counted at the proxy stay
/// within that bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_loop_ends_after_bounded_hops() {
    let q = test_quorum(3);
    let lie = Proxy::start("127.0.0.1", Pick::Sticky);
    let (_leader, follower) =
        leader_then_follower(&q, &["--advertise", lie.addr().as_str()], &[], None).await;
    lie.route(&[&follower.addr]);
    let fs = fetch_stats(&follower.addr).await.expect("stats");
    assert_eq!(fs.leader.as_deref(), Some(lie.addr().as_str()), "{fs:?}");

    for given in [lie.addr(), follower.addr.clone()] {
        let client = BrokerClient::connect(vec![given.clone()], config(Duration::from_secs(3)))
            .await
            .expect("connect");
        for _ in 0..3 {
            let before = lie.conns();
            let e = client
                .next_ids(1)
                .await
                .expect_err("no broker serves: the redirects loop");
            let msg = e.to_string();
            assert!(
                msg.contains("redirected") && msg.contains(&lie.addr()),
                "given {given}: {msg}"
            );
            // The first connection, then at most one per followed redirect (3), and the
            // second slot's.
            let opened = lie.conns() - before;
            assert!(
                opened <= 5,
                "given {given}: {opened} connections for one request: {msg}"
            );
        }
    }
}

/// Over TLS a redirect target is checked like a listed broker: its certificate must
/// verify for the redirect's host, or for `--broker-tls-server-name` when pinned. The
/// leader advertises 127.0.0.2 (a proxy in front of it), which its certificate (for
/// 127.0.0.1 and localhost) is not issued to: refused, saying so; pinned to 127.0.0.1,
/// the same redirect is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_redirect_target_must_verify() {
    let (q, pki) = (test_quorum(3), Pki::new().expect("certificates"));
    let other = Proxy::start("127.0.0.2", Pick::Sticky);
    let tls_args = vec![
        OsStr::new("--listen-tls-cert"),
        pki.server_cert.as_os_str(),
        OsStr::new("--listen-tls-key"),
        pki.server_key.as_os_str(),
    ];
    let other_addr = other.addr();
    let leader_args: Vec<&OsStr> = tls_args
        .iter()
        .copied()
        .chain([OsStr::new("--advertise"), OsStr::new(&other_addr)])
        .collect();
    let trusting = BrokerTls::new(&pki.ca, None, None).expect("CA");
    let pinned = BrokerTls::new(&pki.ca, Some("127.0.0.1".into()), None).expect("CA");
    let (leader, follower) =
        leader_then_follower(&q, &leader_args, &tls_args, Some((&trusting, &trusting))).await;
    other.route(&[&leader.addr]);

    let tls_config = |tls: BrokerTls| BrokerClientConfig {
        tls: Some(tls),
        ..config(Duration::from_secs(3))
    };
    let client = BrokerClient::connect(vec![follower.addr.clone()], tls_config(trusting))
        .await
        .expect("connect to the follower over TLS");
    let msg = client
        .next_ids(1)
        .await
        .expect_err("the leader's certificate is not issued to 127.0.0.2")
        .to_string();
    assert!(
        msg.contains(&other.addr()) && msg.contains("certificate verification failed"),
        "{msg}"
    );

    let client = BrokerClient::connect(vec![follower.addr.clone()], tls_config(pinned))
        .await
        .expect("connect to the follower over TLS");
    let r = client
        .next_ids(3)
        .await
        .unwrap_or_else(|e| panic!("pinned to 127.0.0.1, the redirect is served: {e}"));
    assert_eq!(r.hi, r.lo + 2);
}

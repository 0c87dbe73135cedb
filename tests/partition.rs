//! Partitions between a client and the nodes, made by a TCP proxy in front of each node
//! (tests/common): a client cut off from a majority gets "no quorum" within its
//! deadline and never an ID, while a client on the majority side keeps working; a client
//! cut off from a minority (or slowed down) still works; after the partition heals, IDs
//! continue above every earlier one. Every request goes into one history, checked at the
//! end. A leader broker partitioned from every node steps down and another takes over.

mod common;

use common::{Mode, Proxy};
use idclient::{ClientConfig, IdError, IdRange, IdSource, Protocol, QuorumClient};
use idtools::announced::{Announced, START_TIMEOUT};
use idtools::cluster::LocalQuorum;
use idtools::history::{check, monotonic_ns, Event};
use std::net::SocketAddr;
use std::time::Duration;
use testkit::wait_for_async;

/// The partitioned client's deadline: long enough for a few rounds of reply timeouts.
const DEADLINE: Duration = Duration::from_millis(1500);
const REPLY_TIMEOUT: Duration = Duration::from_millis(200);

struct Recorder {
    events: Vec<Event>,
}

impl Recorder {
    async fn call(&mut self, c: &impl IdSource, n: u64) -> Result<IdRange, IdError> {
        let invoke_ns = monotonic_ns();
        let r = c.next_ids(n).await;
        self.events.push(Event {
            invoke_ns,
            return_ns: monotonic_ns(),
            outcome: r.as_ref().ok().copied(),
        });
        r
    }

    fn max_hi(&self) -> u64 {
        self.events
            .iter()
            .filter_map(|e| e.outcome)
            .map(|r| r.hi)
            .max()
            .unwrap_or(0)
    }
}

fn proxied_client_config(proxies: &[Proxy], protocol: Protocol) -> ClientConfig {
    let mut config = ClientConfig::new(proxies.iter().map(Proxy::url).collect());
    config.protocol = protocol;
    config.deadline = DEADLINE;
    config.reply_timeout = REPLY_TIMEOUT;
    config.connect_timeout = REPLY_TIMEOUT;
    config
}

/// A local 5-node quorum and one proxy in front of each node.
fn proxied_quorum() -> (LocalQuorum, Vec<Proxy>) {
    let quorum = LocalQuorum::temp(5)
        .expect("start a local 5-node redis quorum (is redis-server installed?)");
    let proxies = quorum
        .ports()
        .into_iter()
        .map(|p| Proxy::to(SocketAddr::from(([127, 0, 0, 1], p))))
        .collect();
    (quorum, proxies)
}

async fn partition_run(protocol: Protocol) {
    let (quorum, proxies) = proxied_quorum();
    // The client under test goes through the proxies; the other one talks to the nodes
    // directly and stays on the majority side throughout.
    let cut = QuorumClient::connect(proxied_client_config(&proxies, protocol))
        .await
        .expect("connect through the proxies");
    let mut direct_config = ClientConfig::new(quorum.urls());
    direct_config.protocol = protocol;
    let direct = QuorumClient::connect(direct_config)
        .await
        .expect("connect directly");
    let mut h = Recorder { events: Vec::new() };

    // Healthy.
    for n in [1, 10, 1] {
        h.call(&cut, n).await.expect("healthy network");
        h.call(&direct, n).await.expect("healthy network");
    }

    // Cut off from a majority: unavailable, never wrong.
    for p in &proxies[..3] {
        p.set(Mode::Blackhole);
    }
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let err = h
            .call(&cut, 5)
            .await
            .expect_err("a client cut off from a majority must not get IDs");
        assert!(
            matches!(err, IdError::NoQuorum { .. }),
            "expected no quorum, got: {err}"
        );
        // Generous bound: the call must end by itself around its deadline, not hang.
        assert!(
            started.elapsed() < DEADLINE * 4,
            "no-quorum error took {:?}, deadline {DEADLINE:?}",
            started.elapsed()
        );
        // The majority side is unaffected.
        h.call(&direct, 3)
            .await
            .expect("the majority side keeps working");
    }

    // Heal the majority, cut a minority (and slow one of the majority down): works.
    for p in &proxies[..3] {
        p.set(Mode::Pass);
    }
    proxies[3].set(Mode::Blackhole);
    proxies[4].set(Mode::Blackhole);
    proxies[0].set(Mode::Delay(Duration::from_millis(20)));
    // The nodes healed a moment ago may still hold a connection broken by the timeouts:
    // the first call after healing may fail, later ones must not.
    let _ = h.call(&cut, 1).await;
    let before = h.max_hi();
    for n in [1, 100, 1, 7] {
        let r = h
            .call(&cut, n)
            .await
            .expect("a client cut off from a minority still works");
        assert!(
            r.lo > before,
            "range {r:?} not above {before}, returned before it"
        );
        h.call(&direct, n).await.expect("direct client");
    }

    // Heal everything: IDs continue above everything returned so far.
    for p in &proxies {
        p.set(Mode::Pass);
    }
    let _ = h.call(&cut, 1).await;
    let before = h.max_hi();
    for n in [1, 2, 3] {
        let r = h.call(&cut, n).await.expect("healed network");
        assert!(
            r.lo > before,
            "range {r:?} not above {before}, returned before it"
        );
    }
    // Let stale requests held by the blackhole land, then check they broke nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..5 {
        h.call(&cut, 1).await.expect("healed network");
        h.call(&direct, 1).await.expect("direct client");
    }
    if let Err(v) = check(&h.events) {
        panic!("history violation ({protocol:?}): {v}");
    }
    let ok = h.events.iter().filter(|e| e.outcome.is_some()).count();
    assert!(ok >= 30, "only {ok} successful requests");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_client_partitioned_from_majority_then_minority() {
    partition_run(Protocol::Fast).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_client_partitioned_from_majority_then_minority() {
    partition_run(Protocol::Classic).await;
}

/// A broker whose quorum links go through the proxies: cut off from a majority, its
/// clients get errors (never IDs); the other broker keeps serving; after healing, the
/// first broker serves IDs above everything returned so far.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_partitioned_from_majority() {
    use idclient::broker_client::{BrokerClient, BrokerClientConfig};
    let (quorum, proxies) = proxied_quorum();
    let mut brokers = Vec::new();
    let mut addrs = Vec::new();
    for urls in [
        proxies.iter().map(Proxy::url).collect::<Vec<_>>(),
        quorum.urls(),
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind broker port");
        addrs.push(listener.local_addr().expect("broker addr").to_string());
        let mut config = ClientConfig::new(urls);
        config.reply_timeout = REPLY_TIMEOUT;
        config.connect_timeout = REPLY_TIMEOUT;
        let source = std::sync::Arc::new(
            QuorumClient::connect(config)
                .await
                .expect("broker's quorum client"),
        );
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(broker::run(
            listener,
            source,
            broker::BrokerConfig::default(),
            async move {
                let _ = rx.await;
            },
        ));
        brokers.push((tx, task));
    }
    let bc_config = BrokerClientConfig {
        deadline: DEADLINE,
        ..Default::default()
    };
    let partitioned = BrokerClient::connect(vec![addrs[0].clone()], bc_config.clone())
        .await
        .expect("connect broker 0");
    let healthy = BrokerClient::connect(vec![addrs[1].clone()], bc_config)
        .await
        .expect("connect broker 1");
    let mut h = Recorder { events: Vec::new() };
    for n in [1, 5] {
        h.call(&partitioned, n).await.expect("healthy");
        h.call(&healthy, n).await.expect("healthy");
    }
    for p in &proxies[..3] {
        p.set(Mode::Blackhole);
    }
    for _ in 0..2 {
        let err = h
            .call(&partitioned, 2)
            .await
            .expect_err("a broker cut off from a majority must not hand out IDs");
        assert!(
            matches!(err, IdError::NoQuorum { .. } | IdError::Deadline { .. }),
            "unexpected error: {err}"
        );
        h.call(&healthy, 2)
            .await
            .expect("the other broker keeps working");
    }
    for p in &proxies {
        p.set(Mode::Pass);
    }
    let _ = h.call(&partitioned, 1).await;
    let before = h.max_hi();
    let r = h.call(&partitioned, 4).await.expect("healed broker");
    assert!(r.lo > before, "range {r:?} not above {before}");
    for _ in 0..5 {
        h.call(&partitioned, 1).await.expect("healed broker");
        h.call(&healthy, 1).await.expect("healthy broker");
    }
    if let Err(v) = check(&h.events) {
        panic!("history violation: {v}");
    }
    for (tx, task) in brokers {
        let _ = tx.send(());
        let _ = task.await;
    }
}

/// An `idbroker --serve window` process whose node links are `urls`, with the election
/// timing of the leader tests; killed (by its pid) on drop. Returns once it said
/// `listening on ADDR` (it leads or knows the leader).
struct Idbroker {
    _proc: Announced,
    addr: String,
}

impl Idbroker {
    fn start(urls: &[String]) -> Idbroker {
        let proc = Announced::start(
            std::process::Command::new(common::bin("idbroker"))
                .args(["--listen", "127.0.0.1:0", "--nodes", &urls.join(",")])
                .args(["--election-timeout-ms", "200", "--heartbeat-ms", "50"])
                .args(["--reply-timeout-ms", "200", "--connect-timeout-ms", "200"])
                .stderr(std::process::Stdio::inherit()),
            &["listening on "],
            START_TIMEOUT,
        )
        .expect("idbroker starts");
        Idbroker {
            addr: proc.addr().to_string(),
            _proc: proc,
        }
    }

    async fn role(&self) -> (String, u64) {
        match idclient::broker_client::fetch_stats(&self.addr).await {
            Ok(s) => (s.role, s.term),
            Err(e) => (format!("unreachable: {e}"), 0),
        }
    }
}

/// The leader broker partitioned from every node (its node links go through proxies
/// that stop forwarding): it cannot refresh its heartbeat on a majority, so it steps
/// down, and one of the two other brokers (direct links) takes over; clients of all three
/// (one BrokerClient, following redirects) get IDs again; after healing, the old leader
/// follows the new one. Every request of the run is checked as one history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_partitioned_from_the_nodes_is_replaced() {
    use idclient::broker_client::{BrokerClient, BrokerClientConfig};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    use std::sync::{Arc, Mutex};
    let (quorum, proxies) = proxied_quorum();
    // Alone on a fresh quorum, the proxied broker elects itself; the others follow it.
    let a = &Idbroker::start(&proxies.iter().map(Proxy::url).collect::<Vec<_>>());
    wait_for_async(
        "the proxied broker leads",
        Duration::from_secs(10),
        || async move { a.role().await.0 == "leader" },
    )
    .await;
    let others = &[
        Idbroker::start(&quorum.urls()),
        Idbroker::start(&quorum.urls()),
    ];
    let (_, term_a) = a.role().await;
    let addrs = [a, &others[0], &others[1]].map(|b| b.addr.clone()).to_vec();
    let config = BrokerClientConfig {
        deadline: Duration::from_secs(5),
        ..Default::default()
    };
    let client = Arc::new(BrokerClient::connect(addrs, config).await.expect("connect"));
    let events = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    // Return time of the first success invoked after the cut (u64::MAX: none yet).
    let (cut_at, first_after) = (
        Arc::new(AtomicU64::new(u64::MAX)),
        Arc::new(AtomicU64::new(u64::MAX)),
    );
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let (client, events, stop) = (client.clone(), events.clone(), stop.clone());
            let (cut_at, first_after) = (cut_at.clone(), first_after.clone());
            tokio::spawn(async move {
                while !stop.load(Relaxed) {
                    let invoke_ns = monotonic_ns();
                    let r = client.next_ids(1).await;
                    let return_ns = monotonic_ns();
                    if r.is_ok() && invoke_ns > cut_at.load(Relaxed) {
                        first_after.fetch_min(return_ns, Relaxed);
                    }
                    let event = Event {
                        invoke_ns,
                        return_ns,
                        outcome: r.ok(),
                    };
                    events.lock().expect("events").push(event);
                }
            })
        })
        .collect();
    let served = || {
        let events = events.lock().expect("events");
        events.iter().filter(|e| e.outcome.is_some()).count()
    };
    wait_for_async(
        "IDs before the cut",
        Duration::from_secs(10),
        || async move { served() > 20 },
    )
    .await;

    for p in &proxies {
        p.set(Mode::Blackhole);
    }
    cut_at.store(monotonic_ns(), Relaxed);
    wait_for_async(
        "another broker leads",
        Duration::from_secs(10),
        || async move {
            let mut led = false;
            for b in others {
                let (role, term) = b.role().await;
                led |= role == "leader" && term > term_a;
            }
            led
        },
    )
    .await;
    wait_for_async(
        "the cut-off leader steps down",
        Duration::from_secs(10),
        || async move { a.role().await.0 != "leader" },
    )
    .await;
    let first = &*first_after;
    wait_for_async(
        "IDs from the new leader",
        Duration::from_secs(10),
        || async move { first.load(Relaxed) != u64::MAX },
    )
    .await;

    for p in &proxies {
        p.set(Mode::Pass);
    }
    wait_for_async(
        "the healed broker follows",
        Duration::from_secs(10),
        || async move {
            let (role, term) = a.role().await;
            eprintln!("healed broker: {role}, term {term}");
            role == "follower"
        },
    )
    .await;
    let after_heal = served();
    wait_for_async(
        "IDs after healing",
        Duration::from_secs(10),
        || async move { served() > after_heal + 20 },
    )
    .await;
    stop.store(true, Relaxed);
    for c in callers {
        c.await.expect("caller task");
    }
    let events = events.lock().expect("events").clone();
    if let Err(v) = check(&events) {
        panic!("history violation: {v}");
    }
}

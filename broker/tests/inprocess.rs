//! The broker server and the broker client together, in one process, over real TCP,
//! with an in-process fake quorum (a counter). Fast checks of the protocol, pipelining,
//! failover and bad input; the same properties against real Redis and real idbroker
//! processes are in `tests/real.rs`.

use broker::{BrokerConfig, RoundSource};
use idclient::broker_client::{fetch_stats, BrokerClient, BrokerClientConfig};
use idclient::history::{check, monotonic_ns, Event};
use idclient::wire::{self, ClientMsg, ServerMsg};
use idclient::{IdError, IdRange, IdSource};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// The fake quorum: one counter shared by every broker of a test (like one register),
/// with a small per-round latency so batches form.
struct Counter {
    next: Arc<AtomicU64>,
    latency: Duration,
}

impl RoundSource for Counter {
    fn next_ids_until(
        &self,
        n: u64,
        _deadline: Instant,
    ) -> impl Future<Output = Result<IdRange, IdError>> + Send {
        let next = self.next.clone();
        let latency = self.latency;
        async move {
            tokio::time::sleep(latency).await;
            let lo = next.fetch_add(n, Relaxed) + 1;
            Ok(IdRange { lo, hi: lo + n - 1 })
        }
    }
}

struct TestBroker {
    addr: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<broker::BrokerStats, broker::BrokerError>>,
}

impl TestBroker {
    async fn start(counter: Arc<AtomicU64>, config: BrokerConfig) -> TestBroker {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (stop, stopped) = oneshot::channel::<()>();
        let source = Arc::new(Counter {
            next: counter,
            latency: Duration::from_micros(300),
        });
        let task = tokio::spawn(broker::run(listener, source, config, async move {
            let _ = stopped.await;
        }));
        TestBroker {
            addr,
            stop: Some(stop),
            task,
        }
    }

    async fn shutdown(mut self) -> broker::BrokerStats {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let stats = tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("broker stops in time");
        stats.expect("broker task").expect("broker result")
    }
}

/// `callers` tasks each calling `next_ids(count)` `per_caller` times; the history.
async fn hammer(
    client: Arc<BrokerClient>,
    callers: usize,
    per_caller: usize,
    count: u64,
) -> Vec<Event> {
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut events = Vec::with_capacity(per_caller);
            for _ in 0..per_caller {
                let invoke_ns = monotonic_ns();
                let outcome = client.next_ids(count).await.ok();
                events.push(Event {
                    invoke_ns,
                    return_ns: monotonic_ns(),
                    outcome,
                });
            }
            events
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("caller task"));
    }
    all
}

#[track_caller]
fn assert_history(events: &[Event], min_ok: usize) {
    if let Err(v) = check(events) {
        panic!("history check failed: {v}");
    }
    let ok = events.iter().filter(|e| e.outcome.is_some()).count();
    assert!(
        ok >= min_ok,
        "only {ok} of {} requests succeeded, wanted {min_ok}",
        events.len()
    );
}

async fn served(addrs: &[String]) {
    let client = BrokerClient::connect(addrs.to_vec(), BrokerClientConfig::default())
        .await
        .expect("normal client connects");
    let r = client.next_ids(3).await.expect("normal client is served");
    assert_eq!(r.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_one_broker_batches_and_checks() {
    let b = TestBroker::start(Arc::new(AtomicU64::new(0)), BrokerConfig::default()).await;
    let client = Arc::new(
        BrokerClient::connect(vec![b.addr.clone()], BrokerClientConfig::default())
            .await
            .expect("connect"),
    );
    let events = hammer(client.clone(), 256, 40, 1).await;
    assert_history(&events, events.len());
    let ranges = hammer(client, 16, 20, 1000).await;
    assert_history(&ranges, ranges.len());
    let stats = fetch_stats(&b.addr).await.expect("stats");
    assert_eq!(stats.requests, 256 * 40 + 16 * 20);
    assert_eq!(stats.ids, 256 * 40 + 16 * 20 * 1000);
    assert!(
        stats.batch_max > 1,
        "concurrent requests should share rounds: {stats:?}"
    );
    assert!(stats.rounds < stats.requests);
    let last = b.shutdown().await;
    assert_eq!(last.requests_failed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_between_brokers_on_graceful_shutdown() {
    let counter = Arc::new(AtomicU64::new(0));
    let b1 = TestBroker::start(counter.clone(), BrokerConfig::default()).await;
    let b2 = TestBroker::start(counter.clone(), BrokerConfig::default()).await;
    let client = Arc::new(
        BrokerClient::connect(
            vec![b1.addr.clone(), b2.addr.clone()],
            BrokerClientConfig::default(),
        )
        .await
        .expect("connect"),
    );
    let run = tokio::spawn(hammer(client.clone(), 64, 200, 1));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stats1 = b1.shutdown().await;
    let events = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("no caller hangs")
        .expect("callers");
    // Requests the stopping broker refused (never started) are resent to the other one,
    // so every request succeeds; a request cut off by the close may fail at worst.
    assert_history(&events, events.len() * 9 / 10);
    let stats2 = fetch_stats(&b2.addr).await.expect("stats");
    assert!(
        stats1.requests > 0 && stats2.requests > 0,
        "both brokers served: {stats1:?} {stats2:?}"
    );
    b2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_broker_reachable_is_a_typed_error_within_the_deadline() {
    // A port nobody listens on: bind, note, drop.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr")
        .to_string();
    let config = BrokerClientConfig {
        deadline: Duration::from_millis(300),
        ..Default::default()
    };
    let t0 = Instant::now();
    match BrokerClient::connect(vec![addr.clone()], config).await {
        Err(IdError::BrokersUnavailable { failures }) => assert_eq!(failures[0].addr, addr),
        other => panic!("expected BrokersUnavailable, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_count_is_a_bad_request() {
    let b = TestBroker::start(
        Arc::new(AtomicU64::new(0)),
        BrokerConfig {
            max_count: 10,
            max_round_ids: 100,
            ..Default::default()
        },
    )
    .await;
    let client = BrokerClient::connect(vec![b.addr.clone()], BrokerClientConfig::default())
        .await
        .expect("connect");
    assert!(matches!(
        client.next_ids(0).await,
        Err(IdError::BadRequest(_))
    ));
    assert!(matches!(
        client.next_ids(11).await,
        Err(IdError::BadRequest(_))
    ));
    // Past the client's own check, the broker says so too.
    let mut s = raw_connect(&b.addr).await;
    send(
        &mut s,
        &ClientMsg::NextIds {
            id: 5,
            count: 11,
            deadline_ms: 0,
        },
    )
    .await;
    match recv(&mut s).await {
        Some(ServerMsg::Failed {
            id: 5,
            error: IdError::BadRequest(_),
        }) => {}
        other => panic!("expected BadRequest, got {other:?}"),
    }
    assert_eq!(client.next_ids(10).await.expect("ok").len(), 10);
    b.shutdown().await;
}

async fn raw_connect(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    send(
        &mut s,
        &ClientMsg::Hello {
            magic: wire::MAGIC,
            version: wire::VERSION,
        },
    )
    .await;
    assert!(matches!(
        recv(&mut s).await,
        Some(ServerMsg::Welcome { .. })
    ));
    s
}

async fn send(s: &mut TcpStream, msg: &ClientMsg) {
    let mut buf = Vec::new();
    wire::encode(msg, &mut buf).expect("encode");
    s.write_all(&buf).await.expect("write");
}

async fn recv(s: &mut TcpStream) -> Option<ServerMsg> {
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), wire::read_msg(s, &mut buf))
        .await
        .expect("reply in time")
        .ok()
        .flatten()
}

/// Reads until the broker closes; returns what it said last (a Refused reason).
async fn closed_by_broker(s: &mut TcpStream) -> String {
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut all))
        .await
        .expect("broker closes the connection")
        .ok();
    String::from_utf8_lossy(&all).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_costs_only_that_connection() {
    let config = BrokerConfig {
        handshake_timeout: Duration::from_millis(300),
        write_timeout: Duration::from_millis(300),
        max_in_flight_per_conn: 16,
        ..Default::default()
    };
    let b = TestBroker::start(Arc::new(AtomicU64::new(0)), config).await;
    let addrs = vec![b.addr.clone()];

    // Garbage (an HTTP request): its "length" is far above the maximum.
    let mut s = TcpStream::connect(&b.addr).await.expect("connect");
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    assert!(closed_by_broker(&mut s)
        .await
        .contains("exceeds the maximum"));
    served(&addrs).await;

    // Small garbage frame: undecodable payload.
    let mut s = TcpStream::connect(&b.addr).await.expect("connect");
    s.write_all(&[3, 0, 0, 0, 0xde, 0xad, 0xbe])
        .await
        .expect("write");
    assert!(closed_by_broker(&mut s).await.contains("undecodable"));
    served(&addrs).await;

    // Wrong version.
    let mut s = TcpStream::connect(&b.addr).await.expect("connect");
    send(
        &mut s,
        &ClientMsg::Hello {
            magic: wire::MAGIC,
            version: 99,
        },
    )
    .await;
    match recv(&mut s).await {
        Some(ServerMsg::Refused { reason }) => assert!(reason.contains("version 99"), "{reason}"),
        other => panic!("expected Refused, got {other:?}"),
    }
    assert_eq!(closed_by_broker(&mut s).await, "");
    served(&addrs).await;

    // Oversized length after a good handshake.
    let mut s = raw_connect(&b.addr).await;
    s.write_all(&u32::MAX.to_le_bytes()).await.expect("write");
    assert!(closed_by_broker(&mut s)
        .await
        .contains("exceeds the maximum"));
    served(&addrs).await;

    // Half-sent frame: served around it, then closed at the frame timeout.
    let mut s = raw_connect(&b.addr).await;
    s.write_all(&[28, 0, 0, 0, 1, 0]).await.expect("write");
    served(&addrs).await;
    assert!(closed_by_broker(&mut s).await.contains("not completed"));
    served(&addrs).await;

    // A client that sends and never reads: the broker stops reading it at its in-flight
    // cap, drops it at the write timeout, and serves everyone else meanwhile.
    let before = fetch_stats(&b.addr)
        .await
        .expect("stats")
        .connections_dropped;
    let mut s = raw_connect(&b.addr).await;
    let _ = s.set_nodelay(true);
    let flood = tokio::spawn(async move {
        let mut buf = Vec::new();
        for id in 0..200_000 {
            wire::encode(&ClientMsg::Stats { id }, &mut buf).expect("encode");
        }
        // Stops with an error once the broker gives up on us, or blocks: either is fine.
        let _ = tokio::time::timeout(Duration::from_secs(20), s.write_all(&buf)).await;
        s
    });
    served(&addrs).await;
    let t0 = Instant::now();
    loop {
        let stats = fetch_stats(&b.addr).await.expect("stats while flooded");
        if stats.connections_dropped > before {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the non-reading client was never dropped: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    served(&addrs).await;
    drop(flood);
    b.shutdown().await;
}

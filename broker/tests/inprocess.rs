//! The broker server and the broker client together, in one process, over real TCP,
//! with an in-process fake quorum (a counter). Fast checks of the protocol, pipelining,
//! failover and bad input; the same properties against real Redis and real idbroker
//! processes are in `tests/real.rs`.

use broker::{BrokerConfig, RoundSource};
use idclient::broker_client::{fetch_stats, BrokerClient, BrokerClientConfig};
use idclient::{IdError, IdRange, IdSource};
use idproto::wire::{self, ClientMsg, ServerMsg};
use idtools::history::{assert_linearizable, Event, Recorder};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use testkit::raw::{closed_by_broker, connect as raw_connect, recv, send};
use tokio::io::AsyncWriteExt;
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

/// A quorum that never answers: every round runs into its deadline.
struct Hang;

impl RoundSource for Hang {
    fn next_ids_until(
        &self,
        _n: u64,
        _deadline: Instant,
    ) -> impl Future<Output = Result<IdRange, IdError>> + Send {
        std::future::pending()
    }
}

impl TestBroker {
    async fn start(counter: Arc<AtomicU64>, config: BrokerConfig) -> TestBroker {
        let source = Counter {
            next: counter,
            latency: Duration::from_micros(300),
        };
        TestBroker::with_source(source, config).await
    }

    async fn with_source<S: RoundSource>(source: S, config: BrokerConfig) -> TestBroker {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (stop, stopped) = oneshot::channel::<()>();
        let source = Arc::new(source);
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
    let history = Recorder::new();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (client, history) = (client.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            let client = &client;
            history
                .call_while(|i| i < per_caller, |_| client.next_ids(count))
                .await;
        }));
    }
    for t in tasks {
        t.await.expect("caller task");
    }
    history.take()
}

#[track_caller]
fn assert_history(events: &[Event], min_ok: usize) {
    assert_linearizable(events);
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
    // Four requests out at once (the default is one), so the broker batches too.
    let config = BrokerClientConfig {
        in_flight: 4,
        ..BrokerClientConfig::default()
    };
    let client = Arc::new(
        BrokerClient::connect(vec![b.addr.clone()], config)
            .await
            .expect("connect"),
    );
    let events = hammer(client.clone(), 256, 40, 1).await;
    assert_history(&events, events.len());
    let ranges = hammer(client.clone(), 16, 20, 1000).await;
    assert_history(&ranges, ranges.len());
    let stats = fetch_stats(&b.addr).await.expect("stats");
    // The client coalesces queued callers: fewer wire requests than calls, the same IDs.
    let coalesced = client.coalescing();
    assert_eq!(coalesced.callers, 256 * 40 + 16 * 20);
    assert_eq!(stats.requests, coalesced.requests);
    assert!(coalesced.requests < coalesced.callers, "{coalesced:?}");
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
    // The stopping broker answers the round in flight, refuses what is queued (never
    // started) and closes with unread requests: the client resends those to the other
    // broker, well within the 5 s deadline, so not one request fails.
    assert_history(&events, events.len());
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_costs_only_that_connection() {
    let config = BrokerConfig {
        handshake_timeout: Duration::from_millis(300),
        frame_timeout: Duration::from_millis(300),
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
            token: None,
        },
    )
    .await;
    match recv(&mut s).await {
        Some(ServerMsg::Refused { reason }) => assert!(reason.contains("version 99"), "{reason}"),
        other => panic!("expected Refused, got {other:?}"),
    }
    assert_eq!(closed_by_broker(&mut s).await, "");
    served(&addrs).await;

    // Wrong magic.
    let mut s = TcpStream::connect(&b.addr).await.expect("connect");
    send(
        &mut s,
        &ClientMsg::Hello {
            magic: *b"HTTP",
            version: wire::VERSION,
            token: None,
        },
    )
    .await;
    match recv(&mut s).await {
        Some(ServerMsg::Refused { reason }) => assert!(reason.contains("bad magic"), "{reason}"),
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

    // Half-sent frame: served around it, then closed at the frame timeout. Likewise a
    // half-sent header, and a half-sent Hello.
    for part in [&[28, 0, 0, 0, 1, 0][..], &[28], &[28, 0, 0]] {
        let mut s = raw_connect(&b.addr).await;
        s.write_all(part).await.expect("write");
        served(&addrs).await;
        assert!(closed_by_broker(&mut s).await.contains("not completed"));
        served(&addrs).await;
    }
    let mut s = TcpStream::connect(&b.addr).await.expect("connect");
    s.write_all(&[12, 0, 0, 0, 0]).await.expect("write");
    assert!(closed_by_broker(&mut s)
        .await
        .contains("no complete handshake"));
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

/// Connects and sends the first `n` bytes of a NextIds frame (never the rest).
async fn half_frame(addr: &str, n: usize) -> TcpStream {
    let mut s = raw_connect(addr).await;
    let mut frame = Vec::new();
    wire::encode(
        &ClientMsg::NextIds {
            id: 1,
            count: 1,
            deadline_ms: 0,
        },
        &mut frame,
    )
    .expect("encode");
    s.write_all(&frame[..n]).await.expect("write");
    s
}

/// Connections stuck in a half-sent frame header cannot lock clients out: each is
/// closed at the frame timeout (it used to wait for the rest of the header forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_headers_cannot_hold_every_slot() {
    let config = BrokerConfig {
        max_connections: 4,
        frame_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let b = TestBroker::start(Arc::new(AtomicU64::new(0)), config).await;
    let mut stuck = Vec::new();
    for _ in 0..4 {
        stuck.push(half_frame(&b.addr, 1).await);
    }
    served(std::slice::from_ref(&b.addr)).await;
    for mut s in stuck {
        assert!(closed_by_broker(&mut s).await.contains("not completed"));
    }
    let stats = b.shutdown().await;
    assert!(stats.connections_dropped >= 4, "{stats:?}");
}

/// A connection with nothing in flight is closed after the idle timeout, and told why;
/// one waiting for a reply is not idle, however long the round takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_but_waiting_ones_do_not() {
    let config = BrokerConfig {
        idle_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    let slow = Counter {
        next: Arc::new(AtomicU64::new(0)),
        latency: Duration::from_millis(1500),
    };
    let b = TestBroker::with_source(slow, config).await;
    let mut idle = raw_connect(&b.addr).await;
    let mut waiting = raw_connect(&b.addr).await;
    send(
        &mut waiting,
        &ClientMsg::NextIds {
            id: 3,
            count: 2,
            deadline_ms: 10_000,
        },
    )
    .await;
    match recv(&mut waiting).await {
        Some(ServerMsg::Ids {
            id: 3,
            lo: 1,
            hi: 2,
        }) => {}
        other => panic!("the waiting connection must get its IDs, got {other:?}"),
    }
    assert!(closed_by_broker(&mut idle).await.contains("idle for"));
    // Once answered, it is idle too.
    assert!(closed_by_broker(&mut waiting).await.contains("idle for"));
    // The client reconnects by itself after its connections idled out.
    let client = BrokerClient::connect(vec![b.addr.clone()], BrokerClientConfig::default())
        .await
        .expect("connect");
    client.next_ids(1).await.expect("first call");
    tokio::time::sleep(Duration::from_millis(800)).await;
    client
        .next_ids(1)
        .await
        .expect("call after the idle timeout");
    b.shutdown().await;
}

/// At the connection cap, idle connections give way to new ones (the longest-idle is
/// evicted, and told why); busy ones do not, and then the newcomer is refused with a
/// reason instead of waiting in the accept queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_idle_connections_are_evicted_busy_ones_are_not() {
    let config = BrokerConfig {
        max_connections: 3,
        evict_min_idle: Duration::from_millis(500),
        frame_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let b = TestBroker::start(Arc::new(AtomicU64::new(0)), config).await;
    let addrs = vec![b.addr.clone()];
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(raw_connect(&b.addr).await);
    }
    // The oldest-idle of three goes first: make the first one older still.
    tokio::time::sleep(Duration::from_millis(600)).await;
    send(&mut idle[1], &ClientMsg::Stats { id: 1 }).await;
    send(&mut idle[2], &ClientMsg::Stats { id: 1 }).await;
    assert!(matches!(
        recv(&mut idle[1]).await,
        Some(ServerMsg::Stats { .. })
    ));
    assert!(matches!(
        recv(&mut idle[2]).await,
        Some(ServerMsg::Stats { .. })
    ));
    served(&addrs).await;
    assert!(closed_by_broker(&mut idle[0]).await.contains("evicted"));

    // Three connections in the middle of a frame (busy, not idle): no room.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let busy: Vec<TcpStream> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            // Each takes a slot, evicting an idle connection if need be.
            v.push(half_frame(&b.addr, 5).await);
        }
        v
    };
    let config = BrokerClientConfig {
        deadline: Duration::from_millis(500),
        ..Default::default()
    };
    match BrokerClient::connect(addrs.clone(), config).await {
        Err(IdError::BrokersUnavailable { failures }) => assert!(
            failures
                .iter()
                .any(|f| f.reason.contains("connection cap (3)")),
            "{failures:?}"
        ),
        other => panic!("expected a refusal at the cap, got {other:?}"),
    }
    drop(busy);
    served(&addrs).await;
    b.shutdown().await;
}

/// `deadline_ms: 0` means the broker's default deadline, and a longer deadline than the
/// broker's maximum is capped to it: the `Deadline` answer names the deadline applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_zero_is_the_default_and_long_deadlines_are_capped() {
    let config = BrokerConfig {
        default_deadline: Duration::from_millis(200),
        max_deadline: Duration::from_millis(400),
        ..Default::default()
    };
    let b = TestBroker::with_source(Hang, config).await;
    let mut s = raw_connect(&b.addr).await;
    for (id, deadline_ms, applied) in [(1, 0, 200), (2, 3_600_000, 400), (3, 300, 300)] {
        send(
            &mut s,
            &ClientMsg::NextIds {
                id,
                count: 1,
                deadline_ms,
            },
        )
        .await;
        match recv(&mut s).await {
            Some(ServerMsg::Failed {
                id: got,
                error: IdError::Deadline { deadline, .. },
            }) if got == id => assert_eq!(
                deadline,
                Duration::from_millis(applied),
                "deadline_ms {deadline_ms}"
            ),
            other => panic!("expected Deadline for request {id}, got {other:?}"),
        }
    }
    b.shutdown().await;
}

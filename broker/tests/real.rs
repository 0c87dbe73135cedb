//! End to end: real `redis-server` quorums (`LocalQuorum::temp(5)`), real `idbroker`
//! processes, the real `BrokerClient`, and the history checker.

use idclient::broker_client::{fetch_stats, BrokerClient, BrokerClientConfig};
use idclient::{IdError, IdSource};
use idproto::wire::{self, ClientMsg};
use idtools::cluster::{test_quorum, LocalQuorum};
use idtools::history::{assert_linearizable, monotonic_ns, Event, Recorder};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use testkit::broker::{refused_at_startup, TestBroker};
use testkit::raw::{closed_by_broker, connect as raw_connect, send};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// An idbroker on `quorum` with `extra` flags.
fn broker(quorum: &LocalQuorum, extra: &[&str]) -> TestBroker {
    TestBroker::on(env!("CARGO_BIN_EXE_idbroker"), quorum, extra)
}

async fn client(addrs: &[&String], deadline: Duration) -> Arc<BrokerClient> {
    let config = BrokerClientConfig {
        deadline,
        ..Default::default()
    };
    let addrs = addrs.iter().map(|a| a.to_string()).collect();
    Arc::new(
        BrokerClient::connect(addrs, config)
            .await
            .expect("connect to broker"),
    )
}

/// `callers` tasks calling `next_ids(count)` in a loop until `stop`; each one's history.
fn spawn_callers(
    client: &Arc<BrokerClient>,
    callers: usize,
    count: u64,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Event>>> {
    (0..callers)
        .map(|_| {
            let client = client.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let (client, history) = (&client, Recorder::new());
                history
                    .call_while(|_| !stop.load(Relaxed), |_| client.next_ids(count))
                    .await;
                history.take()
            })
        })
        .collect()
}

/// Joins callers (none may hang): their histories together.
async fn history(tasks: Vec<tokio::task::JoinHandle<Vec<Event>>>) -> Vec<Event> {
    join(tasks).await.into_iter().flatten().collect()
}

/// Joins callers; none may hang.
async fn join(tasks: Vec<tokio::task::JoinHandle<Vec<Event>>>) -> Vec<Vec<Event>> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(
            tokio::time::timeout(Duration::from_secs(20), t)
                .await
                .expect("a caller hung")
                .expect("caller task"),
        );
    }
    out
}

fn ok_count(events: &[Event]) -> usize {
    events.iter().filter(|e| e.outcome.is_some()).count()
}

async fn served(addr: &str) {
    let c = BrokerClient::connect(vec![addr.to_string()], BrokerClientConfig::default())
        .await
        .expect("normal client connects");
    assert_eq!(
        c.next_ids(2).await.expect("normal client is served").len(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_broker_many_callers_is_linearizable() {
    let q = test_quorum(5);
    let b = broker(&q, &[]);
    // Four requests out at once (the default is one), so the broker batches too.
    let config = BrokerClientConfig {
        deadline: Duration::from_secs(5),
        in_flight: 4,
        ..Default::default()
    };
    let c = Arc::new(
        BrokerClient::connect(vec![b.addr.clone()], config)
            .await
            .expect("connect to broker"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = spawn_callers(&c, 96, 1, &stop);
    tasks.extend(spawn_callers(&c, 4, 1000, &stop));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Relaxed);
    let events = history(tasks).await;
    assert_linearizable(&events);
    assert_eq!(
        ok_count(&events),
        events.len(),
        "no errors with a healthy quorum"
    );
    let stats = fetch_stats(&b.addr).await.expect("stats");
    assert!(
        stats.batch_max > 1,
        "96 callers must share rounds: {stats:?}"
    );
    // Each answered wire request carried one or more coalesced callers.
    let coalesced = c.coalescing();
    assert_eq!(coalesced.callers, events.len() as u64);
    assert_eq!(stats.requests_ok, coalesced.requests);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_callers_split_is_linearizable() {
    let q = test_quorum(5);
    let b1 = broker(&q, &[]);
    let b2 = broker(&q, &[]);
    let c1 = client(&[&b1.addr, &b2.addr], Duration::from_secs(5)).await;
    let c2 = client(&[&b2.addr, &b1.addr], Duration::from_secs(5)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = spawn_callers(&c1, 40, 1, &stop);
    tasks.extend(spawn_callers(&c2, 40, 1, &stop));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Relaxed);
    let events = history(tasks).await;
    assert_linearizable(&events);
    assert_eq!(ok_count(&events), events.len());
    // One leader serves; the follower redirected the callers that started with it.
    let s1 = fetch_stats(&b1.addr).await.expect("stats");
    let s2 = fetch_stats(&b2.addr).await.expect("stats");
    let (lead, follow) = if s1.role == "leader" {
        (s1, s2)
    } else {
        (s2, s1)
    };
    assert_eq!(
        (lead.role.as_str(), follow.role.as_str()),
        ("leader", "follower")
    );
    assert!(lead.requests_ok > 0, "the leader served nothing");
    assert!(follow.redirects > 0, "the follower redirected nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_one_of_two_brokers_mid_run() {
    let q = test_quorum(5);
    let mut b1 = broker(&q, &[]);
    let b2 = broker(&q, &[]);
    let c1 = client(&[&b1.addr, &b2.addr], Duration::from_secs(5)).await;
    let c2 = client(&[&b2.addr, &b1.addr], Duration::from_secs(5)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let t1 = spawn_callers(&c1, 40, 1, &stop);
    let t2 = spawn_callers(&c2, 40, 1, &stop);
    tokio::time::sleep(Duration::from_millis(700)).await;
    b1.proc.kill();
    let killed_ns = monotonic_ns();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Relaxed);
    let per_caller = join(t1).await;
    // Every caller of the killed broker failed over and got IDs after the kill.
    for (i, events) in per_caller.iter().enumerate() {
        assert!(
            events
                .iter()
                .any(|e| e.invoke_ns > killed_ns && e.outcome.is_some()),
            "caller {i} of the killed broker never recovered"
        );
    }
    let events: Vec<Event> = per_caller
        .into_iter()
        .chain(join(t2).await)
        .flatten()
        .collect();
    assert_linearizable(&events);
    // Only requests in flight at the kill may fail (they may not even do that: they are
    // resent to the other broker).
    let failed = events.len() - ok_count(&events);
    assert!(failed <= 40, "{failed} requests failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_minority_down_continues_majority_down_fails_in_time_then_resumes() {
    let mut q = test_quorum(5);
    let b = broker(
        &q,
        &["--connect-timeout-ms", "200", "--reply-timeout-ms", "200"],
    );
    let deadline = Duration::from_millis(1500);
    let c = client(&[&b.addr], deadline).await;

    // Minority down: service continues.
    q.kill(0);
    q.kill(1);
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = spawn_callers(&c, 64, 1, &stop);
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, Relaxed);
    let mut history = history(tasks).await;
    let minority_ok = ok_count(&history);
    assert!(
        minority_ok > 64,
        "with 3 of 5 nodes up, service continues ({minority_ok} ok)"
    );

    // Majority down: every waiting caller gets an error within its deadline.
    q.kill(2);
    let majority_down = Recorder::new();
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (c, majority_down) = (c.clone(), majority_down.clone());
        tasks.push(tokio::spawn(async move {
            let t0 = Instant::now();
            let result = majority_down.record(c.next_ids(1)).await;
            (t0.elapsed(), result)
        }));
    }
    for t in tasks {
        let (took, result) = tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("a caller hung")
            .expect("task");
        match result {
            Err(
                IdError::NoQuorum { .. }
                | IdError::Deadline { .. }
                | IdError::BrokersUnavailable { .. },
            ) => {}
            other => panic!("expected an error without a majority, got {other:?}"),
        }
        // What this claims: the caller gets its error at about its deadline, rather
        // than waiting for a majority to come back (it never does before the restart
        // below). Two 5-node tests may share the 2 cores, so scheduling alone can add
        // seconds: the bound is generous, and far below a wait for the restart.
        assert!(
            took <= deadline + Duration::from_secs(5),
            "error after {took:?}, deadline {deadline:?}"
        );
    }
    history.extend(majority_down.take());

    // Restart: service resumes, with IDs above everything handed out before.
    let max_before = history
        .iter()
        .filter_map(|e| e.outcome)
        .map(|r| r.hi)
        .max()
        .expect("some IDs before");
    for i in 0..3 {
        q.restart(i).expect("restart node");
    }
    let restarted = Recorder::new();
    let t0 = Instant::now();
    let range = loop {
        match restarted.record(c.next_ids(1)).await {
            Ok(r) => break r,
            Err(e) => assert!(
                t0.elapsed() < Duration::from_secs(20),
                "service did not resume after restart: {e}"
            ),
        }
    };
    history.extend(restarted.take());
    assert!(range.lo > max_before, "{range:?} not above {max_before}");
    assert_linearizable(&history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_costs_only_that_connection() {
    let q = test_quorum(5);
    let b = broker(
        &q,
        &[
            "--handshake-timeout-ms",
            "500",
            "--frame-timeout-ms",
            "500",
            "--write-timeout-ms",
            "500",
            "--max-in-flight",
            "16",
        ],
    );
    let addr = b.addr.clone();

    // Garbage bytes.
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    s.write_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage")
        .await
        .expect("write");
    assert!(closed_by_broker(&mut s)
        .await
        .contains("exceeds the maximum"));
    served(&addr).await;

    // Wrong version.
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    send(
        &mut s,
        &ClientMsg::Hello {
            magic: wire::MAGIC,
            version: 1,
            token: None,
        },
    )
    .await;
    assert!(closed_by_broker(&mut s)
        .await
        .contains("version 1 not supported"));
    served(&addr).await;

    // Wrong magic.
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    send(
        &mut s,
        &ClientMsg::Hello {
            magic: *b"RESP",
            version: wire::VERSION,
            token: None,
        },
    )
    .await;
    assert!(closed_by_broker(&mut s).await.contains("bad magic"));
    served(&addr).await;

    // Oversized length.
    let mut s = raw_connect(&addr).await;
    s.write_all(&(wire::MAX_FRAME_LEN + 1).to_le_bytes())
        .await
        .expect("write");
    assert!(closed_by_broker(&mut s)
        .await
        .contains("exceeds the maximum"));
    served(&addr).await;

    // Half-sent frame, or header: others are served while it hangs; it is closed at
    // the frame timeout.
    for part in [&[28, 0, 0, 0, 1, 0, 0][..], &[28]] {
        let mut s = raw_connect(&addr).await;
        s.write_all(part).await.expect("write");
        served(&addr).await;
        assert!(closed_by_broker(&mut s).await.contains("not completed"));
        served(&addr).await;
    }

    // Connects and never reads: cut off by the write timeout, nobody else waits.
    let before = fetch_stats(&addr).await.expect("stats").connections_dropped;
    let mut s = raw_connect(&addr).await;
    let flood = tokio::spawn(async move {
        let mut buf = Vec::new();
        for id in 0..200_000 {
            wire::encode(&ClientMsg::Stats { id }, &mut buf).expect("encode");
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), s.write_all(&buf)).await;
        s
    });
    served(&addr).await;
    let t0 = Instant::now();
    while fetch_stats(&addr)
        .await
        .expect("stats during the flood")
        .connections_dropped
        == before
    {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the non-reading client was never dropped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    served(&addr).await;
    drop(flood);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_everyone_and_exits_cleanly() {
    let q = test_quorum(5);
    let mut b1 = broker(&q, &[]);
    let b2 = broker(&q, &[]);
    let c = client(&[&b1.addr, &b2.addr], Duration::from_secs(5)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = spawn_callers(&c, 32, 1, &stop);
    tokio::time::sleep(Duration::from_millis(500)).await;
    b1.proc.signal(libc::SIGTERM);
    let status = tokio::task::block_in_place(|| b1.proc.wait());
    assert!(status.success(), "idbroker exit after SIGTERM: {status:?}");
    let stopped_ns = monotonic_ns();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Relaxed);
    let events = history(tasks).await;
    assert_linearizable(&events);
    // docs/broker.md: the round in flight is answered, queued requests are refused as
    // never started and resent to the other broker, unread ones are resent after the
    // close. So not one request fails, and callers go on after the exit.
    let failed = events.len() - ok_count(&events);
    assert_eq!(
        failed, 0,
        "requests failed across a graceful shutdown with another broker up"
    );
    assert!(
        events
            .iter()
            .any(|e| e.invoke_ns > stopped_ns && e.outcome.is_some()),
        "callers were served after the exit"
    );
    assert!(fetch_stats(&b2.addr).await.expect("stats").requests_ok > 0);
}

/// Waits for `b` to exit, up to `limit`; its status.
fn wait_exit(b: &mut TestBroker, limit: Duration) -> Option<std::process::ExitStatus> {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(status) = b.proc.try_wait() {
            return Some(status);
        }
        if t0.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sigterm(b: &TestBroker) {
    b.proc.signal(libc::SIGTERM);
}

/// Shutdown does not wait for handshakes (nor half-sent frames): with a 120 s handshake
/// and frame timeout, a half-sent Hello used to keep the broker alive until it expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_does_not_wait_for_a_half_sent_hello() {
    let q = test_quorum(3);
    let mut b = broker(
        &q,
        &[
            "--handshake-timeout-ms",
            "120000",
            "--frame-timeout-ms",
            "120000",
        ],
    );
    let mut hello = TcpStream::connect(&b.addr).await.expect("connect");
    hello.write_all(&[12, 0, 0, 0, 0]).await.expect("write");
    let mut silent = TcpStream::connect(&b.addr).await.expect("connect");
    let mut half = raw_connect(&b.addr).await;
    half.write_all(&[28, 0]).await.expect("write");
    served(&b.addr).await;
    sigterm(&b);
    // Far below the 120 s the connections could otherwise hold it, generous for load.
    let status = tokio::task::block_in_place(|| wait_exit(&mut b, Duration::from_secs(30)))
        .expect("idbroker still running 30 s after SIGTERM: it waits for a handshake");
    assert!(status.success(), "idbroker exit after SIGTERM: {status:?}");
    for s in [&mut hello, &mut silent, &mut half] {
        closed_by_broker(s).await;
    }
}

/// A client that can open only one of its two connections (the broker is at its cap,
/// another client busy on the other slots) works with the one it has: every call
/// succeeds. It used to send half of its callers to the missing connection, where they
/// waited out their deadline. (Eviction is off here: it would let the client's own
/// idle connection make room, hiding the defect.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_works_with_the_connections_it_gets() {
    let q = test_quorum(3);
    let b = broker(
        &q,
        &["--max-connections", "3", "--evict-min-idle-ms", "600000"],
    );
    // The other client: two connections, kept busy (never idle long enough to evict).
    let other = client(&[&b.addr], Duration::from_secs(5)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let others = spawn_callers(&other, 8, 1, &stop);
    // Until both of its connections are open.
    let t0 = Instant::now();
    while fetch_stats(&b.addr).await.expect("stats").connections_open < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "other client did not open 2 connections"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = client(&[&b.addr], Duration::from_secs(5)).await;
    // Enough calls that every caller lands on the missing connection's slot many times.
    let mut results = Vec::new();
    for _ in 0..8 {
        let c = c.clone();
        results.push(tokio::spawn(async move {
            let c = &c;
            Recorder::new()
                .call_while(|i| i < 10, |_| c.next_ids(1))
                .await
        }));
    }
    for r in results {
        let errors = tokio::time::timeout(Duration::from_secs(60), r)
            .await
            .expect("a caller hung")
            .expect("caller task");
        assert!(errors.is_empty(), "calls failed: {errors:?}");
    }
    stop.store(true, Relaxed);
    let events = history(others).await;
    assert_eq!(
        ok_count(&events),
        events.len(),
        "the other client was not disturbed"
    );
}

/// `--max-connections` caps open connections: with every slot busy (mid-frame), a new
/// connection is refused with the reason; once one closes, clients are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_flag_caps_connections() {
    let q = test_quorum(3);
    let b = broker(
        &q,
        &["--max-connections", "2", "--frame-timeout-ms", "120000"],
    );
    let mut busy = Vec::new();
    for _ in 0..2 {
        let mut s = raw_connect(&b.addr).await;
        s.write_all(&[28]).await.expect("write");
        busy.push(s);
    }
    let mut third = TcpStream::connect(&b.addr).await.expect("connect");
    let _ = third
        .write_all(&[12, 0, 0, 0, 0, 0, 0, 0, b'Q', b'I', b'D', b'B', 1, 0, 0, 0])
        .await;
    assert!(
        closed_by_broker(&mut third)
            .await
            .contains("connection cap (2) reached"),
        "a third connection is refused"
    );
    drop(busy.pop());
    served(&b.addr).await;
}

/// Bad limits are refused at startup, naming the flag's setting (exit code 2).
#[test]
fn inconsistent_deadline_flags_are_refused() {
    let stderr = refused_at_startup(
        env!("CARGO_BIN_EXE_idbroker"),
        &["--max-deadline-ms", "100"],
    );
    assert!(
        stderr.contains("default_deadline exceeds max_deadline"),
        "{stderr}"
    );
}

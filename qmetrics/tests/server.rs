//! The endpoint over real TCP: the three paths, and its bounds against clients that
//! trickle headers (slowloris) or hold every connection slot.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use qmetrics::{get, prometheus_client, Endpoints, Limits};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use testkit::prometheus::Prometheus;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const GET_TIMEOUT: Duration = Duration::from_secs(10);

/// An endpoint on a free loopback port with one counter (`demo_things_total` = 7), ready
/// when `ready` is true. Aborted on drop.
struct Server {
    addr: String,
    _task: testkit::AbortOnDrop<()>,
}

async fn server(limits: Limits, ready: Arc<AtomicBool>) -> Server {
    let mut registry = Registry::default();
    let things: Counter = Counter::default();
    things.inc_by(7);
    registry.register("demo_things", "Things", things);
    let endpoints = Endpoints {
        registry,
        ready: Box::new(move || {
            let ready = ready.load(Relaxed);
            Box::pin(async move {
                if ready {
                    Ok(())
                } else {
                    Err("the demo is\nnot ready".to_string())
                }
            })
        }),
    };
    let listener = qmetrics::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let task = tokio::spawn(qmetrics::serve(listener, Arc::new(endpoints), limits));
    Server {
        addr,
        _task: testkit::AbortOnDrop(task),
    }
}

#[tokio::test]
async fn serves_metrics_health_and_readiness() {
    let ready = Arc::new(AtomicBool::new(false));
    let s = server(Limits::default(), ready.clone()).await;
    let (status, body) = get(&s.addr, "/metrics", GET_TIMEOUT)
        .await
        .expect("GET /metrics");
    assert_eq!(status, 200);
    assert!(body.contains("\ndemo_things_total 7\n"), "{body}");
    assert!(
        body.contains("# TYPE demo_things_total counter\n"),
        "{body}"
    );
    assert_eq!(
        get(&s.addr, "/healthz", GET_TIMEOUT)
            .await
            .expect("healthz"),
        (200, "ok\n".into())
    );
    assert_eq!(
        get(&s.addr, "/readyz", GET_TIMEOUT).await.expect("readyz"),
        (503, "not ready: the demo is not ready\n".into()),
        "one line, whatever the reason"
    );
    ready.store(true, Relaxed);
    assert_eq!(
        get(&s.addr, "/readyz", GET_TIMEOUT).await.expect("readyz"),
        (200, "ready\n".into())
    );
    let (status, _) = get(&s.addr, "/nope", GET_TIMEOUT).await.expect("GET /nope");
    assert_eq!(status, 404);
}

/// Sends `GET /metrics` one byte at a time from [`ATTACKER`], never finishing the
/// headers, until the server closes the connection; returns whether it did within `patience`.
async fn trickle_until_closed(addr: String, patience: Duration) -> bool {
    let mut stream = connect_from(ATTACKER, &addr).await.expect("connect");
    let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    let until = tokio::time::Instant::now() + patience;
    let mut sent = 0usize;
    let mut buf = [0u8; 256];
    while tokio::time::Instant::now() < until {
        let byte = request.get(sent).copied().unwrap_or(b'a');
        if stream.write_all(&[byte]).await.is_err() {
            return true; // reset by the server
        }
        sent += 1;
        match tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {} // an error response (408): the close follows
            Err(_) => {}    // still open
        }
    }
    false
}

#[tokio::test]
async fn slowloris_clients_neither_stall_scrapes_nor_keep_their_slot() {
    let limits = Limits {
        header_read_timeout: Duration::from_secs(1),
        ..Limits::default()
    };
    let s = server(limits, Arc::new(AtomicBool::new(true))).await;
    let slow: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(trickle_until_closed(
                s.addr.clone(),
                Duration::from_secs(30),
            ))
        })
        .collect();
    // Scrapes succeed while the slow clients are connected.
    for _ in 0..5 {
        let (status, body) = get(&s.addr, "/metrics", GET_TIMEOUT).await.expect("scrape");
        assert_eq!(status, 200);
        assert!(body.contains("demo_things_total 7"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for t in slow {
        assert!(
            t.await.expect("slow client task"),
            "a client trickling headers was not closed within 30 s (header timeout 1 s)"
        );
    }
    // Each was counted (the count follows the close: wait for it, bounded).
    let series = "qlist_metrics_connections_timed_out_total{reason=\"headers\"}";
    let mut counted = None;
    for _ in 0..100 {
        let (_, body) = get(&s.addr, "/metrics", GET_TIMEOUT).await.expect("scrape");
        counted = sample(&body, series);
        if counted == Some(4.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(counted, Some(4.0), "{series}");
}

#[tokio::test]
async fn at_the_connection_cap_new_connections_wait_for_idle_ones_to_time_out() {
    let limits = Limits {
        header_read_timeout: Duration::from_secs(3),
        max_connections: 2,
        ..Limits::default()
    };
    let s = server(limits, Arc::new(AtomicBool::new(true))).await;
    // Two connections that send half a request and stop hold both slots...
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(&s.addr).await.expect("connect");
        c.write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .expect("write");
        holders.push(c);
    }
    // A third is closed at once (the cap), well within the 3 s header timeout...
    let refused = get(&s.addr, "/metrics", Duration::from_secs(2)).await;
    assert!(
        refused.is_err(),
        "a connection over the cap was served: {refused:?}"
    );
    // ...only until the header timeout: then scrapes get through again.
    let mut ok = false;
    for _ in 0..100 {
        if let Ok((200, _)) = get(&s.addr, "/metrics", Duration::from_secs(2)).await {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        ok,
        "no scrape succeeded after the stuck connections timed out"
    );
    for mut c in holders {
        let mut buf = [0u8; 512];
        // Closed by the server (possibly after a 408): reads end.
        loop {
            match tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) => continue,
                Err(_) => panic!("a stuck connection was still open 10 s after its header timeout"),
            }
        }
    }
}

/// The address every hostile client in these tests comes from: another loopback address
/// (the whole 127/8 is loopback on Linux), so that scrapes from 127.0.0.1, Prometheus'
/// included, come from a different peer.
const ATTACKER: &str = "127.0.0.2";

/// A TCP connection to `addr` from `source` (port picked by the kernel).
async fn connect_from(source: &str, addr: &str) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(format!("{source}:0").parse().expect("source address"))?;
    socket.connect(addr.parse().expect("server address")).await
}

/// One slowloris connection slot held from [`ATTACKER`] until `stop`: every 0.5 s it
/// sends the next byte of a request whose headers never end, and when the server closes
/// the connection (or refuses it) it connects again on the next tick.
async fn hold_slowly(addr: String, stop: Arc<AtomicBool>) {
    let request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    let mut conn: Option<(TcpStream, usize)> = None;
    let mut buf = [0u8; 512];
    while !stop.load(Relaxed) {
        match conn.take() {
            None => conn = connect_from(ATTACKER, &addr).await.ok().map(|s| (s, 0)),
            Some((mut stream, sent)) => {
                let byte = request.get(sent).copied().unwrap_or(b'a');
                let open = stream.write_all(&[byte]).await.is_ok()
                    && !matches!(
                        tokio::time::timeout(Duration::from_millis(1), stream.read(&mut buf)).await,
                        Ok(Ok(0)) | Ok(Err(_))
                    );
                if open {
                    conn = Some((stream, sent + 1));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One peer holding 64 slowloris connections (a header byte every
/// 0.5 s, reconnecting whenever closed) must not stall scrapes from another peer. Every
/// one of 60 scrapes from 127.0.0.1, one every 0.2 s, is answered, and a real Prometheus
/// server started during the attack scrapes with `up == 1` throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holding_slow_connections_cannot_stall_scrapes_from_another() {
    let s = server(Limits::default(), Arc::new(AtomicBool::new(true))).await;
    let stop = Arc::new(AtomicBool::new(false));
    let attack: Vec<_> = (0..64)
        .map(|_| tokio::spawn(hold_slowly(s.addr.clone(), stop.clone())))
        .collect();
    // Let the attack take every slot it can before the first scrape.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut prometheus = Prometheus::start("qmetrics", &s.addr);

    let mut failed = Vec::new();
    for i in 0..60 {
        match get(&s.addr, "/metrics", Duration::from_secs(5)).await {
            Ok((200, body)) if body.contains("demo_things_total 7") => {}
            other => failed.push(format!("scrape {i}: {other:?}")),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        failed.is_empty(),
        "{} of 60 scrapes from another peer failed during the attack:\n{}",
        failed.len(),
        failed.join("\n")
    );

    // Prometheus, started after the attack began, has scraped a few times by now (it
    // scrapes every second); every scrape of its found the target up. Waits (bounded)
    // for three scrapes in case the machine is slow to start it.
    let mut scrapes = 0.0;
    for _ in 0..300 {
        scrapes = prometheus
            .query("count_over_time(up%7Bjob%3D%22qmetrics%22%7D%5B5m%5D)")
            .await
            .unwrap_or(0.0);
        if scrapes >= 3.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        scrapes >= 3.0,
        "Prometheus scraped {scrapes} times in 30 s:\n{}",
        prometheus.log()
    );
    let min_up = prometheus
        .query("min_over_time(up%7Bjob%3D%22qmetrics%22%7D%5B5m%5D)")
        .await;
    assert_eq!(
        min_up,
        Some(1.0),
        "Prometheus found the target down during the attack"
    );
    stop.store(true, Relaxed);
    for a in attack {
        a.await.expect("attacker task");
    }
}

/// The value of the sample line `series` (name and labels, exactly) in `exposition`.
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Reads from `stream` until the server closes it; whether it did within `patience`.
async fn closed_within(stream: &mut TcpStream, patience: Duration) -> bool {
    let mut buf = [0u8; 512];
    let until = tokio::time::Instant::now() + patience;
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// The per-peer limit: a peer's connection over it is closed at once (long before the
/// header deadline), counted, and other peers are served; once one of the peer's
/// connections ends, the peer gets a slot again.
#[tokio::test]
async fn a_connection_over_its_peers_limit_is_closed_at_once() {
    let limits = Limits {
        header_read_timeout: Duration::from_secs(20),
        max_connections_per_peer: 2,
        ..Limits::default()
    };
    let s = server(limits, Arc::new(AtomicBool::new(true))).await;
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut c = connect_from(ATTACKER, &s.addr).await.expect("connect");
        c.write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .expect("write");
        holders.push(c);
    }
    let mut over = connect_from(ATTACKER, &s.addr).await.expect("connect");
    assert!(
        closed_within(&mut over, Duration::from_secs(10)).await,
        "a connection over its peer's limit of 2 was still open after 10 s (header deadline 20 s)"
    );
    let (status, body) = get(&s.addr, "/metrics", GET_TIMEOUT)
        .await
        .expect("a scrape from another peer");
    assert_eq!(status, 200);
    assert_eq!(
        sample(
            &body,
            "qlist_metrics_connections_refused_total{reason=\"peer_limit\"}"
        ),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(
            &body,
            "qlist_metrics_connections_refused_total{reason=\"connection_cap\"}"
        ),
        Some(0.0),
        "{body}"
    );
    if let Err(e) = qmetrics::promtool_check(&body) {
        panic!("{e}");
    }

    // One holder leaves: the peer may connect again (once the server has seen it go).
    drop(holders.pop());
    let mut served = false;
    for _ in 0..100 {
        let mut c = connect_from(ATTACKER, &s.addr).await.expect("connect");
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut reply = Vec::new();
        let read = tokio::time::timeout(GET_TIMEOUT, c.read_to_end(&mut reply)).await;
        if matches!(read, Ok(Ok(_))) && reply.starts_with(b"HTTP/1.1 200") {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        served,
        "the peer got no slot back after one of its connections ended"
    );
}

//! The endpoint over real TCP: the three paths, and its bounds against clients that
//! trickle headers (slowloris) or hold every connection slot.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use qmetrics::{get, prometheus_client, Endpoints, Limits};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

const GET_TIMEOUT: Duration = Duration::from_secs(10);

/// An endpoint on a free loopback port with one counter (`demo_things_total` = 7), ready
/// when `ready` is true. Aborted on drop.
struct Server {
    addr: String,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
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
    Server { addr, task }
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

/// Sends `GET /metrics` one byte at a time, never finishing the headers, until the
/// server closes the connection; returns whether it did within `patience`.
async fn trickle_until_closed(addr: String, patience: Duration) -> bool {
    let mut stream = TcpStream::connect(&addr).await.expect("connect");
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

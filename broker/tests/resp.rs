//! The RESP listener (`idbroker --resp-listen`) with real clients: `redis-cli`, redis-py
//! and the Rust `redis` crate, against real `idbroker` processes on real redis-server
//! quorums, next to binary clients; hostile input over raw TCP; and, in process with a
//! fake quorum, that RESP and binary requests share rounds.

use broker::{BrokerConfig, RoundSource};
use idclient::broker_client::{fetch_stats, BrokerClient, BrokerClientConfig};
use idclient::{IdError, IdRange, IdSource};
use idproto::framed::FrameReader;
use idproto::wire::{ClientMsg, ServerMsg};
use idtools::cluster::{test_quorum, LocalQuorum};
use idtools::history::{assert_linearizable, Recorder};
use std::future::Future;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testkit::broker::TestBroker;
use testkit::raw;
use testkit::resp::{parse_range, python};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// An idbroker serving binary and RESP on `quorum`, with `extra` flags.
fn broker(quorum: &LocalQuorum, extra: &[&str]) -> TestBroker {
    TestBroker::on(env!("CARGO_BIN_EXE_idbroker"), quorum, extra)
}

/// (host, port) of the broker's RESP listener.
fn resp_host_port(b: &TestBroker) -> (String, String) {
    let (host, port) = b.resp.rsplit_once(':').expect("host:port");
    (host.to_string(), port.to_string())
}

/// Runs `redis-cli` against the broker's RESP port with `args` (and `stdin`); its stdout.
fn redis_cli(b: &TestBroker, args: &[&str], stdin: &[u8]) -> String {
    testkit::resp::redis_cli(&b.resp, args, stdin)
}

/// Ranges each wholly above the one before, each of `len` IDs (where given).
#[track_caller]
fn assert_increasing(ranges: &[IdRange]) {
    for w in ranges.windows(2) {
        assert!(
            w[0].lo <= w[0].hi && w[1].lo > w[0].hi,
            "not increasing: {w:?}"
        );
    }
}

#[test]
fn redis_cli_session() {
    let q = test_quorum(3);
    let b = broker(&q, &[]);
    assert_eq!(redis_cli(&b, &["PING"], b""), "PONG\n");
    assert_eq!(redis_cli(&b, &["ping", "hello"], b""), "hello\n");

    let out = redis_cli(&b, &["QLIST.NEXT", "5"], b"");
    let lines: Vec<&str> = out.lines().collect();
    let first = parse_range(lines[0], lines[1]);
    assert_eq!(first.len(), 5, "{out:?}");
    let out = redis_cli(&b, &["qlist.next"], b"");
    let lines: Vec<&str> = out.lines().collect();
    let second = parse_range(lines[0], lines[1]);
    assert_eq!(second.len(), 1);
    assert_increasing(&[first, second]);

    // RESP3: HELLO's map, then the counters as a map (redis-cli prints a map entry as
    // "key value", an element of a RESP2 array on its own line).
    let hello = redis_cli(&b, &["-3", "HELLO", "3"], b"");
    assert!(
        hello.contains("server qlist\n") && hello.contains("proto 3\n"),
        "{hello:?}"
    );
    let hello = redis_cli(&b, &["HELLO", "2"], b"");
    assert!(hello.contains("proto\n2\n"), "{hello:?}");
    let stats = redis_cli(&b, &["-3", "QLIST.STATS"], b"");
    assert!(stats.contains("requests_ok 2\n"), "{stats:?}");

    let errors = [
        (vec!["AUTH", "secret"], "without any password configured"),
        (vec!["HELLO", "4"], "NOPROTO"),
        (vec!["FLUSHALL"], "ERR unknown command 'FLUSHALL'"),
        (vec!["QLIST.NEXT", "1", "2"], "wrong number of arguments"),
        (vec!["QLIST.NEXT", "0"], "count 0 is outside 1..="),
        (vec!["QLIST.NEXT", "-3"], "not an integer or out of range"),
    ];
    for (args, want) in errors {
        let out = redis_cli(&b, &args, b"");
        assert!(out.contains(want), "{args:?}: {out:?}");
        assert!(!out.contains("secret"), "AUTH never echoes the password");
    }

    // Commands read from stdin, one a line, and a raw pipelined flood with --pipe.
    let out = redis_cli(&b, &[], "QLIST.NEXT 3\n".repeat(20).as_bytes());
    let lines: Vec<&str> = out.lines().collect();
    let ranges: Vec<IdRange> = lines.chunks(2).map(|c| parse_range(c[0], c[1])).collect();
    assert_eq!(ranges.len(), 20, "{out:?}");
    assert!(ranges.iter().all(|r| r.len() == 3));
    assert_increasing(&ranges);
    let pipe = "*2\r\n$10\r\nQLIST.NEXT\r\n$1\r\n2\r\n".repeat(2000);
    let out = redis_cli(&b, &["--pipe"], pipe.as_bytes());
    assert!(out.contains("errors: 0, replies: 2000"), "{out:?}");
}

#[test]
fn redis_py_client() {
    let q = test_quorum(3);
    let b = broker(&q, &[]);
    let (host, port) = resp_host_port(&b);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/resp_client.py");
    let out = Command::new(python())
        .args([script, &host, &port])
        .output()
        .expect("run python3 (Debian packages python3, python3-redis)");
    assert!(
        out.status.success(),
        "redis-py client failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let ranges: Vec<IdRange> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| {
            let (lo, hi) = l.split_once(' ').expect("LO HI");
            parse_range(lo, hi)
        })
        .collect();
    assert_eq!(ranges.len(), 51);
    assert_eq!(ranges[0].len(), 5);
    assert!(ranges[1..].iter().all(|r| r.len() == 2));
    assert_increasing(&ranges);
}

/// Binary callers (the broker client) and RESP callers (the Rust `redis` crate, RESP2 and
/// RESP3) at once: every range is distinct and in real-time order across both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_and_resp_clients_interleave_linearizably() {
    let q = test_quorum(3);
    let b = broker(&q, &[]);
    let binary = Arc::new(
        BrokerClient::connect(vec![b.addr.clone()], BrokerClientConfig::default())
            .await
            .expect("binary client connects"),
    );
    let mut resp = Vec::new();
    for protocol in ["resp2", "resp3"] {
        let url = format!("redis://{}/?protocol={protocol}", b.resp);
        let client = redis::Client::open(url).expect("redis URL");
        let con = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis crate connects");
        resp.push(con);
    }
    // One direct call, as the docs show it.
    let (lo, hi): (String, String) = redis::cmd("QLIST.NEXT")
        .arg(5)
        .query_async(&mut resp[0])
        .await
        .expect("QLIST.NEXT 5");
    assert_eq!(parse_range(&lo, &hi).len(), 5);

    let history = Recorder::new();
    let mut tasks = Vec::new();
    for caller in 0..24 {
        let (binary, history) = (binary.clone(), history.clone());
        let con = resp[caller % 2].clone();
        tasks.push(tokio::spawn(async move {
            let binary = &binary;
            // One multiplexed connection a caller: its clones share it.
            let request = |i: usize| {
                let mut con = con.clone();
                async move {
                    if (caller + i).is_multiple_of(2) {
                        binary.next_ids(2).await.map_err(|e| e.to_string())
                    } else {
                        let reply: Result<(String, String), _> =
                            redis::cmd("QLIST.NEXT").arg(2).query_async(&mut con).await;
                        reply
                            .map(|(lo, hi)| parse_range(&lo, &hi))
                            .map_err(|e| e.to_string())
                    }
                }
            };
            history.call_while(|i| i < 40, request).await
        }));
    }
    let mut errors = Vec::new();
    for t in tasks {
        errors.extend(t.await.expect("caller task"));
    }
    let events = history.take();
    assert!(
        events.iter().all(|e| e.outcome.is_some()),
        "a request failed: {errors:?}"
    );
    assert_linearizable(&events);
    let stats = fetch_stats(&b.addr).await.expect("stats");
    // Every ID the broker handed out went to one of these callers.
    assert_eq!(stats.ids, 24 * 40 * 2 + 5);
}

/// Connects to the RESP port, sends `bytes`, and reads until the broker closes: what it
/// sent back, lossily as text.
async fn send_until_closed(b: &TestBroker, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(&b.resp).await.expect("connect");
    // The broker may close before everything is written: that is the point.
    let _ = s.write_all(bytes).await;
    read_until_closed(&mut s).await
}

async fn read_until_closed(s: &mut TcpStream) -> String {
    let mut all = Vec::new();
    let mut chunk = [0u8; 4096];
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(until, s.read(&mut chunk)).await {
            Err(_) => panic!("broker did not close the connection; got {all:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => all.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&all).into_owned()
}

/// A well-behaved client is still served.
async fn still_served(b: &TestBroker) {
    let client = redis::Client::open(format!("redis://{}/", b.resp)).expect("redis URL");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("a normal client connects");
    let (lo, hi): (String, String) = redis::cmd("QLIST.NEXT")
        .arg(3)
        .query_async(&mut con)
        .await
        .expect("a normal client is served");
    assert_eq!(parse_range(&lo, &hi).len(), 3);
}

/// The broker's resident memory, KiB (Linux).
fn rss_kib(b: &TestBroker) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", b.proc.pid()))
        .expect("read /proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_costs_only_that_connection() {
    let q = test_quorum(3);
    let b = broker(
        &q,
        &[
            "--frame-timeout-ms",
            "300",
            "--idle-timeout-ms",
            "600",
            "--max-in-flight",
            "8",
        ],
    );
    still_served(&b).await;
    let rss_before = rss_kib(&b);

    let cases: [(&str, Vec<u8>, &str); 6] = [
        (
            "garbage",
            b"\x00\xff\x13garbage\r\n".to_vec(),
            "-ERR Protocol error: expected '*'",
        ),
        (
            "inline",
            b"PING\r\n".to_vec(),
            "-ERR Protocol error: inline commands are not supported",
        ),
        (
            "not bulk strings",
            b"*1\r\n:1\r\n".to_vec(),
            "expected an array of bulk strings",
        ),
        (
            "bad length",
            b"*1\r\n$x\r\n".to_vec(),
            "-ERR Protocol error: malformed request",
        ),
        (
            "huge bulk length",
            [b"*1\r\n$999999999999\r\n".as_slice(), &[b'x'; 20_000]].concat(),
            "-ERR Protocol error: request larger than",
        ),
        (
            "millions of elements",
            [b"*5000000\r\n".as_slice(), &b"$1\r\na\r\n".repeat(5000)].concat(),
            "-ERR Protocol error: a request of 5000000 arguments (at most 16)",
        ),
    ];
    for (what, bytes, want) in cases {
        let got = send_until_closed(&b, &bytes).await;
        assert!(
            got.starts_with("-ERR ") && got.contains(want),
            "{what}: got {got:?}"
        );
    }
    // Nothing was allocated for the declared sizes.
    let grown = rss_kib(&b).saturating_sub(rss_before);
    assert!(grown < 64 * 1024, "RSS grew by {grown} KiB");

    // Half a request, then silence: the frame timeout.
    let got = send_until_closed(&b, b"*2\r\n$10\r\nQLIST.NEXT\r\n$1\r\n").await;
    assert!(got.contains("-ERR request not completed within"), "{got:?}");
    // A client that says nothing: the idle timeout.
    let got = send_until_closed(&b, b"").await;
    assert!(got.contains("-ERR idle for"), "{got:?}");
    // Valid requests before garbage are answered, in order, before the error.
    let got = send_until_closed(&b, b"*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n%%%\r\n").await;
    assert!(
        got.starts_with("+PONG\r\n+PONG\r\n-ERR Protocol error"),
        "{got:?}"
    );
    // QUIT: +OK, then the broker closes.
    let got = send_until_closed(&b, b"*1\r\n$4\r\nQUIT\r\n*1\r\n$4\r\nPING\r\n").await;
    assert_eq!(got, "+OK\r\n");

    still_served(&b).await;
}

/// A pipelined flood far above the in-flight cap: the broker stops reading at the cap,
/// and every request is still answered, in order, as the client reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_flood_is_answered_in_order() {
    let q = test_quorum(3);
    let b = broker(&q, &["--max-in-flight", "4"]);
    let n = 3000;
    let mut flood = Vec::new();
    for i in 0..n {
        // Local replies (PING) between batched ones: order across both kinds.
        if i % 3 == 0 {
            flood.extend_from_slice(b"*2\r\n$4\r\nPING\r\n$1\r\np\r\n");
        } else {
            flood.extend_from_slice(b"*2\r\n$10\r\nQLIST.NEXT\r\n$1\r\n2\r\n");
        }
    }
    flood.extend_from_slice(b"*1\r\n$4\r\nQUIT\r\n");
    let s = TcpStream::connect(&b.resp).await.expect("connect");
    let (mut rd, mut wr) = s.into_split();
    let writer = tokio::spawn(async move { wr.write_all(&flood).await });
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), rd.read_to_end(&mut all))
        .await
        .expect("every reply arrives")
        .expect("read");
    writer.await.expect("writer task").expect("flood written");
    let text = String::from_utf8(all).expect("utf-8");
    let mut lines = text.split("\r\n");
    let mut ranges = Vec::new();
    for i in 0..n {
        if i % 3 == 0 {
            assert_eq!(lines.next(), Some("$1"), "reply {i}");
            assert_eq!(lines.next(), Some("p"), "reply {i}");
        } else {
            let head: Vec<_> = (0..5).filter_map(|_| lines.next()).collect();
            assert!(head.len() == 5 && head[0] == "*2", "reply {i}: {head:?}");
            ranges.push(parse_range(head[2], head[4]));
        }
    }
    assert_eq!(lines.next(), Some("+OK"));
    assert_increasing(&ranges);
    still_served(&b).await;
}

/// SIGTERM with RESP requests pipelined: every reply the client gets is whole and in
/// order (IDs, or the shutdown error for requests never started), then the broker closes
/// the connection and exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_resp_connections_after_their_replies() {
    let q = test_quorum(3);
    let mut b = broker(&q, &[]);
    let mut s = TcpStream::connect(&b.resp).await.expect("connect");
    s.write_all(next_cmd(1).repeat(500).as_bytes())
        .await
        .expect("write");
    let first = read_range(&mut s).await;
    b.proc.signal(libc::SIGTERM);
    let rest = read_until_closed(&mut s).await;
    let status = tokio::task::block_in_place(|| b.proc.wait());
    assert!(status.success(), "idbroker exit after SIGTERM: {status:?}");
    let replies = rest;
    let mut ranges = vec![first];
    let mut lines = replies.split("\r\n").filter(|l| !l.is_empty());
    while let Some(line) = lines.next() {
        if line == "*2" {
            let r: Vec<&str> = lines.by_ref().take(4).collect();
            assert_eq!(r.len(), 4, "a cut reply: {replies:?}");
            ranges.push(parse_range(r[1], r[3]));
        } else {
            assert!(line.starts_with("-ERR "), "not a reply: {line:?}");
        }
    }
    assert_increasing(&ranges);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cap_refuses_resp_clients_in_redis_words() {
    let q = test_quorum(3);
    let b = broker(
        &q,
        &["--max-connections", "1", "--evict-min-idle-ms", "60000"],
    );
    let mut held = TcpStream::connect(&b.resp).await.expect("connect");
    held.write_all(b"*1\r\n$4\r\nPING\r\n")
        .await
        .expect("write");
    let mut pong = [0u8; 7];
    held.read_exact(&mut pong).await.expect("PONG");
    assert_eq!(&pong, b"+PONG\r\n");
    let got = send_until_closed(&b, b"").await;
    assert_eq!(got, "-ERR max number of clients reached\r\n");
}

/// How a RESP connection ended up at the cap: still served, evicted, or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Fate {
    Served,
    Evicted,
    Refused,
}

/// Sends PING (if the connection is still open) and reads until PONG or the close: the
/// connection's fate. No timing: an open connection answers, a closed one was told why
/// first (the deadline only stops a hang).
async fn fate(s: &mut TcpStream) -> Fate {
    let _ = s.write_all(b"*1\r\n$4\r\nPING\r\n").await;
    let mut all = Vec::new();
    let mut chunk = [0u8; 256];
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let text = String::from_utf8_lossy(&all);
        if text == "+PONG\r\n" {
            return Fate::Served;
        }
        match tokio::time::timeout_at(until, s.read(&mut chunk)).await {
            Err(_) => panic!("neither PONG nor a close: {text:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => all.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&all);
    if text.starts_with("-ERR evicted: idle for ") {
        Fate::Evicted
    } else if text == "-ERR max number of clients reached\r\n" {
        Fate::Refused
    } else {
        panic!("closed with {text:?}")
    }
}

/// How many of `conns` met each fate, in the order Served, Evicted, Refused.
async fn fates(conns: &mut [TcpStream]) -> [usize; 3] {
    let mut n = [0; 3];
    for s in conns {
        n[fate(s).await as usize] += 1;
    }
    n
}

/// Issue #48's run at `--max-connections 100` with `--evict-min-idle-ms min_idle_ms`: 100
/// RESP connections, each PINGed then left idle for 1.5 s (longer than the default
/// minimum), then 60 more left open without a word, then a fresh client's PING. The
/// fates of the 100, the 60 and the fresh client.
async fn at_a_full_cap(min_idle_ms: &str) -> ([usize; 3], [usize; 3], Fate) {
    let q = test_quorum(3);
    let b = broker(
        &q,
        &[
            "--max-connections",
            "100",
            "--evict-min-idle-ms",
            min_idle_ms,
            // Far beyond the test: no connection closes for being idle.
            "--idle-timeout-ms",
            "600000",
        ],
    );
    let mut idle = Vec::new();
    for _ in 0..100 {
        let mut s = TcpStream::connect(&b.resp).await.expect("connect");
        assert_eq!(fate(&mut s).await, Fate::Served);
        idle.push(s);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut silent = Vec::new();
    for _ in 0..60 {
        silent.push(TcpStream::connect(&b.resp).await.expect("connect"));
    }
    let mut fresh = TcpStream::connect(&b.resp).await.expect("connect");
    let fresh = fate(&mut fresh).await;
    (fates(&mut idle).await, fates(&mut silent).await, fresh)
}

/// The eviction policy (docs/broker.md, "Connection slots"), one end: with
/// `--evict-min-idle-ms 0` every connection not busy may be evicted, so every newcomer
/// at the cap is admitted, each evicting one connection and taking its slot: 61
/// evicted, none refused. Which 61 is not pinned here (choose_victim's unit tests pin
/// the order): mostly the idle ones, but a silent newcomer whose task has not run yet
/// is not admitted yet, and those go first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_with_no_minimum_idle_every_newcomer_evicts_one() {
    let (idle, silent, fresh) = at_a_full_cap("0").await;
    assert_eq!(fresh, Fate::Served, "the fresh client is admitted at once");
    let all: Vec<usize> = idle.iter().zip(silent).map(|(i, s)| i + s).collect();
    assert_eq!(
        all,
        [99, 61, 0],
        "served, evicted, refused of the 160 (idle {idle:?}, silent {silent:?})"
    );
}

/// The other end: with a minimum idle time longer than any connection has been idle,
/// none may be evicted, so every newcomer at the cap is refused in Redis's words and
/// the connections it found keep their slots, however long they had been idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_with_no_connection_idle_long_enough_a_newcomer_is_refused() {
    let (idle, silent, fresh) = at_a_full_cap("3600000").await;
    assert_eq!(fresh, Fate::Refused, "the fresh client is refused");
    assert_eq!(
        idle,
        [100, 0, 0],
        "of the 100 idle: served, evicted, refused"
    );
    assert_eq!(
        silent,
        [0, 0, 60],
        "of the 60 silent: served, evicted, refused"
    );
}

/// A fake quorum whose rounds wait for the test: each round records its size, then takes
/// one permit of `gate` before it answers from a counter.
struct Gated {
    next: AtomicU64,
    rounds: Mutex<Vec<u64>>,
    gate: Arc<Semaphore>,
}

impl RoundSource for Gated {
    fn next_ids_until(
        &self,
        n: u64,
        _deadline: Instant,
    ) -> impl Future<Output = Result<IdRange, IdError>> + Send {
        self.rounds.lock().expect("rounds").push(n);
        async move {
            self.gate.acquire().await.expect("gate").forget();
            let lo = self.next.fetch_add(n, Relaxed) + 1;
            Ok(IdRange { lo, hi: lo + n - 1 })
        }
    }
}

/// A RESP request and a binary request queued during the same round are served together
/// by the next round: one batch, one range split between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp_and_binary_requests_share_a_round() {
    let source = Arc::new(Gated {
        next: AtomicU64::new(0),
        rounds: Mutex::default(),
        gate: Arc::new(Semaphore::new(0)),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let resp_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let resp = resp_listener.local_addr().expect("addr").to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(broker::run_with(
        listener,
        Some(resp_listener),
        Default::default(),
        source.clone(),
        BrokerConfig::default(),
        async move {
            let _ = stopped.await;
        },
    ));
    let rounds = || source.rounds.lock().expect("rounds").clone();

    // Round 1 holds the batcher.
    let mut first = TcpStream::connect(&resp).await.expect("connect");
    first
        .write_all(next_cmd(1).as_bytes())
        .await
        .expect("write");
    testkit::wait_for_async("round 1", testkit::WAIT_LIMIT, || {
        std::future::ready(rounds().len() == 1)
    })
    .await;

    // Meanwhile one RESP and one binary request are queued. Each connection then sends a
    // request with a bad count, answered at once but counted only after the request
    // before it is in the batcher's queue: the counter reaching 5 proves both are.
    let mut second = TcpStream::connect(&resp).await.expect("connect");
    let pipelined = format!("{}{}", next_cmd(4), next_cmd(0));
    second.write_all(pipelined.as_bytes()).await.expect("write");
    let mut binary = TcpStream::connect(&addr).await.expect("connect");
    let hello = raw::encode(&[
        raw::hello(),
        ClientMsg::NextIds {
            id: 1,
            count: 3,
            deadline_ms: 0,
        },
        ClientMsg::NextIds {
            id: 2,
            count: 0,
            deadline_ms: 0,
        },
    ]);
    binary.write_all(&hello).await.expect("write");
    let mut queued = 0;
    while queued < 5 {
        queued = fetch_stats(&addr).await.expect("stats").requests;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    source.gate.add_permits(2);

    let mut rd = FrameReader::new(&mut binary, Duration::from_secs(10));
    let mut binary_range = None;
    while binary_range.is_none() {
        match rd.read_msg::<ServerMsg>().await.expect("binary reply") {
            Some(ServerMsg::Ids { id: 1, lo, hi }) => binary_range = Some(IdRange { lo, hi }),
            Some(ServerMsg::Welcome { .. } | ServerMsg::Failed { id: 2, .. }) => {}
            other => panic!("unexpected binary reply {other:?}"),
        }
    }
    let binary_range = binary_range.expect("binary range");
    let resp_range = read_range(&mut second).await;
    assert_eq!(read_range(&mut first).await, IdRange { lo: 1, hi: 1 });
    assert_eq!(rounds(), vec![1, 7], "round 2 served both requests");
    let (lo, hi) = if binary_range.lo < resp_range.lo {
        (binary_range, resp_range)
    } else {
        (resp_range, binary_range)
    };
    assert_eq!((lo.lo, lo.hi + 1, hi.hi), (2, hi.lo, 8), "one range, split");
    assert_eq!((binary_range.len(), resp_range.len()), (3, 4));

    let _ = stop.send(());
    let stats = server.await.expect("task").expect("broker");
    assert_eq!((stats.rounds, stats.batch_max), (2, 2));
}

fn next_cmd(count: u64) -> String {
    let count = count.to_string();
    format!("*2\r\n$10\r\nQLIST.NEXT\r\n${}\r\n{count}\r\n", count.len())
}

/// Reads one QLIST.NEXT reply (`*2`, two bulk strings) from `s`, and nothing more (a
/// byte at a time).
async fn read_range(s: &mut TcpStream) -> IdRange {
    let mut got = Vec::new();
    let mut chunk = [0u8; 1];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        let lines: Vec<&str> = text.split("\r\n").collect();
        if lines.len() >= 6 {
            assert_eq!(lines[0], "*2", "{text:?}");
            return parse_range(lines[2], lines[4]);
        }
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("reply in time")
            .expect("read");
        assert!(n > 0, "closed before the reply: {text:?}");
        got.extend_from_slice(&chunk[..n]);
    }
}

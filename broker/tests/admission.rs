//! Admission at the connection cap, the authentication deadline, AUTH guessing (and the
//! pause before each wrong token's answer) and the RESP decoder's cost, each attacked
//! with raw TCP clients against a real idbroker process on a real Redis quorum.

use idclient::broker_client::{fetch_stats_with_token, BrokerClient, BrokerClientConfig};
use idclient::{IdSource, Token};
use idtools::cluster::{test_quorum, LocalQuorum};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use testkit::broker::TestBroker;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

const SECRET: &str = "tok-5be1d07a-never-logged";

/// The deadline of every client that must be served (the broker client's default).
const DEADLINE: Duration = Duration::from_secs(5);

/// Starts idbroker on `quorum` with a binary, a RESP and a metrics listener, the token
/// file holding `token` (if any) and `extra` flags.
fn broker(quorum: &LocalQuorum, token: Option<&str>, extra: &[&str]) -> TestBroker {
    TestBroker::start_with_metrics(
        env!("CARGO_BIN_EXE_idbroker"),
        &quorum.urls_arg(),
        token,
        extra,
    )
}

/// The value of the unlabelled metric `name` on `b`'s `/metrics`.
async fn metric(b: &TestBroker, name: &str) -> f64 {
    let addr = b.metrics.as_deref().expect("a metrics listener");
    let (status, body) = qmetrics::get(addr, "/metrics", Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("GET /metrics: {e}"));
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in {body}"))
}

/// CPU time the broker process has used so far (user + system).
fn cpu_time(b: &TestBroker) -> Duration {
    testkit::cpu_time(b.proc.pid())
}

/// A RESP request: an array of bulk strings.
fn cmd(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// Reads one RESP2 reply (simple, error, integer, bulk or array of those) as text,
/// one element a line; `None` if the connection closed first.
async fn read_reply<R: AsyncBufReadExt + Unpin>(rd: &mut R) -> Option<String> {
    let mut out = String::new();
    let mut owed = 1u64;
    while owed > 0 {
        let mut line = String::new();
        if rd.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        owed -= 1;
        match line.as_bytes().first() {
            Some(b'*') => owed += line[1..].trim().parse::<u64>().ok()?,
            Some(b'$') if line.trim() != "$-1" => owed += 1,
            _ => out.push_str(&line),
        }
    }
    Some(out)
}

/// One `QLIST.NEXT` over RESP (after `AUTH token` if given), retried while the broker
/// refuses the connection at its cap, until `deadline`: how long it took, or what went
/// wrong last.
async fn resp_next_within(
    addr: &str,
    token: Option<&str>,
    deadline: Duration,
) -> Result<Duration, String> {
    let started = Instant::now();
    let until = started + deadline;
    let mut last = String::from("nothing");
    while Instant::now() < until {
        let attempt = async {
            let s = TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            let (rd, mut wr) = s.into_split();
            let mut rd = BufReader::new(rd);
            let mut req = Vec::new();
            if let Some(t) = token {
                req.extend(cmd(&["AUTH", t]));
            }
            req.extend(cmd(&["QLIST.NEXT"]));
            wr.write_all(&req)
                .await
                .map_err(|e| format!("write: {e}"))?;
            if token.is_some() {
                let auth = read_reply(&mut rd)
                    .await
                    .ok_or("closed before AUTH's reply")?;
                if auth != "+OK\r\n" {
                    return Err(format!("AUTH: {auth:?}"));
                }
            }
            let ids = read_reply(&mut rd)
                .await
                .ok_or("closed before QLIST.NEXT's reply")?;
            if ids.lines().count() == 2 && ids.lines().all(|l| l.parse::<u64>().is_ok()) {
                Ok(())
            } else {
                Err(format!("QLIST.NEXT: {ids:?}"))
            }
        };
        match tokio::time::timeout_at(until, attempt).await {
            Ok(Ok(())) => return Ok(started.elapsed()),
            Ok(Err(e)) => last = e,
            Err(_) => last = format!("no answer within {deadline:?} (last: {last})"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last)
}

/// One ID from the binary broker client with its `deadline` (it retries refusals
/// itself), bounded by that deadline as a whole.
async fn binary_next_within(
    addr: &str,
    token: Option<&str>,
    deadline: Duration,
) -> Result<Duration, String> {
    let started = Instant::now();
    let config = BrokerClientConfig {
        deadline,
        token: token.map(|t| Token::new(t).expect("token")),
        ..Default::default()
    };
    let work = async {
        let c = BrokerClient::connect(vec![addr.to_string()], config)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        c.next_ids(1).await.map_err(|e| format!("next_ids: {e}"))
    };
    match tokio::time::timeout(deadline, work).await {
        Ok(Ok(_)) => Ok(started.elapsed()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(format!("not served within {deadline:?}")),
    }
}

/// Finding 1: with the cap full of idle RESP connections and 60 silent connections
/// (binary and RESP) queued behind them, fresh clients of both protocols are served
/// within their deadline: admission never waits for an eviction in the accept loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cap_of_idle_connections_does_not_stall_admission() {
    let q = test_quorum(3);
    let b = broker(&q, None, &["--max-connections", "40"]);
    let mut idle = Vec::new();
    for _ in 0..40 {
        let s = TcpStream::connect(&b.resp).await.expect("connect");
        let (rd, mut wr) = s.into_split();
        let mut rd = BufReader::new(rd);
        wr.write_all(&cmd(&["PING"])).await.expect("PING");
        assert_eq!(read_reply(&mut rd).await.as_deref(), Some("+PONG\r\n"));
        idle.push((rd, wr));
    }
    // Longer than --evict-min-idle-ms: every one of them may now be evicted.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut silent = Vec::new();
    for i in 0..60 {
        let addr = if i % 2 == 0 { &b.resp } else { &b.addr };
        silent.push(TcpStream::connect(addr).await.expect("connect"));
    }
    let (resp, binary) = tokio::join!(
        resp_next_within(&b.resp, None, DEADLINE),
        binary_next_within(&b.addr, None, DEADLINE)
    );
    assert!(resp.is_ok(), "fresh RESP client: {resp:?}");
    assert!(binary.is_ok(), "fresh binary client: {binary:?}");
    drop((idle, silent));
}

/// Finding 2: forty unauthenticated RESP clients PINGing (and told NOAUTH) every 0.3 s
/// on a broker capped at forty connections: clients with the token are still served,
/// over RESP and binary, within their deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_pingers_do_not_lock_out_token_holders() {
    let q = test_quorum(3);
    let b = broker(&q, Some(SECRET), &["--max-connections", "40"]);
    let stop = Arc::new(AtomicBool::new(false));
    let noauth = Arc::new(AtomicU64::new(0));
    let mut pingers = Vec::new();
    for _ in 0..40 {
        let (addr, stop, noauth) = (b.resp.clone(), stop.clone(), noauth.clone());
        pingers.push(tokio::spawn(async move {
            // Reconnects whenever closed: the attacker does not give up.
            while !stop.load(Relaxed) {
                let Ok(s) = TcpStream::connect(&addr).await else {
                    continue;
                };
                let (rd, mut wr) = s.into_split();
                let mut rd = BufReader::new(rd);
                while !stop.load(Relaxed) {
                    if wr.write_all(&cmd(&["PING"])).await.is_err() {
                        break;
                    }
                    match read_reply(&mut rd).await {
                        Some(r) if r.starts_with("-NOAUTH") => noauth.fetch_add(1, Relaxed),
                        _ => break,
                    };
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    // Every slot is taken and kept busy by now.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(noauth.load(Relaxed) >= 40, "the pingers are refused");
    let (resp, binary) = tokio::join!(
        resp_next_within(&b.resp, Some(SECRET), DEADLINE),
        binary_next_within(&b.addr, Some(SECRET), DEADLINE)
    );
    stop.store(true, Relaxed);
    for p in pingers {
        p.await.expect("pinger task");
    }
    assert!(resp.is_ok(), "RESP client with the token: {resp:?}");
    assert!(binary.is_ok(), "binary client with the token: {binary:?}");
    assert!(!b.stderr().contains(SECRET));
}

/// Finding 4: a connection guessing tokens is closed after a few wrong ones, told why;
/// every failure (RESP and binary) is counted in /metrics and logged, never with what
/// was tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_guessing_is_cut_off_counted_and_logged_without_the_guess() {
    let q = test_quorum(3);
    let b = broker(&q, Some(SECRET), &[]);
    let guesses: Vec<u8> = (0..1000)
        .flat_map(|i| cmd(&["AUTH", &format!("guess-{i}")]))
        .chain(cmd(&["AUTH", SECRET]))
        .chain(cmd(&["QLIST.NEXT"]))
        .collect();
    let mut s = TcpStream::connect(&b.resp).await.expect("connect");
    let (rd, mut wr) = s.split();
    // The broker closes before reading everything: that is the point.
    let (_, got) = tokio::join!(wr.write_all(&guesses), read_until_closed(rd));
    let wrong = got.matches("-WRONGPASS").count();
    assert_eq!(wrong, 3, "three wrong tokens, then closed: {got:?}");
    assert!(
        got.ends_with("-ERR too many failed AUTH attempts: closing the connection\r\n"),
        "{got:?}"
    );
    assert!(!got.contains("+OK") && !got.contains("guess-"), "{got:?}");
    // A binary client with a wrong token: one more failure.
    assert!(binary_next_within(&b.addr, Some("guess-binary"), DEADLINE)
        .await
        .is_err());
    assert_eq!(metric(&b, "qlist_broker_auth_failures_total").await, 4.0);
    // Logged when the connection ends, after its linger.
    testkit::wait_for_async(
        "idbroker logs the failed AUTH attempts",
        Duration::from_secs(5),
        || std::future::ready(b.stderr().contains("failed AUTH")),
    )
    .await;
    let log = b.stderr();
    assert!(log.contains("failed AUTH"), "{log}");
    assert!(!log.contains("guess-") && !log.contains(SECRET), "{log}");
    // The right token still works, on a connection of its own.
    assert!(resp_next_within(&b.resp, Some(SECRET), DEADLINE)
        .await
        .is_ok());
}

/// Reads until the broker closes (10 s at most): what it sent, lossily as text.
async fn read_until_closed<R: AsyncReadExt + Unpin>(rd: R) -> String {
    read_until_closed_by(rd, Instant::now() + Duration::from_secs(10)).await
}

/// Reads until the broker closes, at the latest by `until` (else panics): what it sent,
/// lossily as text.
async fn read_until_closed_by<R: AsyncReadExt + Unpin>(mut rd: R, until: Instant) -> String {
    let mut all = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(until, rd.read(&mut chunk)).await {
            Err(_) => panic!(
                "broker did not close the connection; got {} bytes ending {:?}",
                all.len(),
                String::from_utf8_lossy(&all[all.len().saturating_sub(200)..])
            ),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => all.extend_from_slice(&chunk[..n]),
        }
    }
    String::from_utf8_lossy(&all).into_owned()
}

/// Sends `line` every millisecond on a connection to `addr` (reconnecting when the
/// broker closes it) until `stop`, counting the bytes written in `sent`.
async fn trickle(addr: String, line: &'static [u8], stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    while !stop.load(Relaxed) {
        let Ok(mut s) = TcpStream::connect(&addr).await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = s.set_nodelay(true);
        while !stop.load(Relaxed) {
            if s.write_all(line).await.is_err() {
                break;
            }
            sent.fetch_add(line.len() as u64, Relaxed);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Finding 3: sixty connections each trickling `*1\r\n` or `*2147483647\r\n` lines
/// every millisecond. The broker's CPU time (counted work, from /proc) per MiB received
/// stays small, and a probe's `QLIST.NEXT` is answered within its deadline throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_request_headers_cost_work_proportional_to_their_bytes() {
    let q = test_quorum(3);
    let b = broker(&q, None, &[]);
    assert!(resp_next_within(&b.resp, None, DEADLINE).await.is_ok());
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let cpu_before = cpu_time(&b);
    let mut attackers = Vec::new();
    for i in 0..60 {
        let line: &'static [u8] = if i % 2 == 0 {
            b"*1\r\n"
        } else {
            b"*2147483647\r\n"
        };
        attackers.push(tokio::spawn(trickle(
            b.resp.clone(),
            line,
            stop.clone(),
            sent.clone(),
        )));
    }
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        match resp_next_within(&b.resp, None, DEADLINE).await {
            Ok(took) => slowest = slowest.max(took),
            Err(e) => panic!("probe not served during the trickle: {e}"),
        }
    }
    stop.store(true, Relaxed);
    for a in attackers {
        a.await.expect("trickle task");
    }
    let cpu = cpu_time(&b).saturating_sub(cpu_before).as_secs_f64();
    let mib = sent.load(Relaxed) as f64 / f64::from(1 << 20);
    let per_mib = cpu / mib;
    eprintln!(
        "trickle: {mib:.2} MiB sent, broker CPU {cpu:.2} s, {per_mib:.2} CPU-s/MiB, slowest probe {slowest:?}"
    );
    assert!(mib > 0.1, "the trickle ran: {mib} MiB");
    // Before the incremental parser: 3.3-4.0 CPU-s/MiB (the decoder re-read every
    // partial request at each line end); after: about 0.5, mostly the cost of one
    // read per 4-13 byte packet and of reconnecting, which no parser avoids.
    assert!(per_mib < 1.5, "{per_mib:.2} CPU-seconds per MiB received");
}

/// The RESP authentication deadline (`--handshake-timeout-ms`, from the connect): with a
/// token configured, a client that sends nothing, and one that sends half an `AUTH` and
/// goes silent, are told why and closed once it passes, not before, and well before
/// the frame and idle timeouts (set far longer here) would close them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp_clients_must_authenticate_within_the_deadline() {
    const AUTH_DEADLINE: Duration = Duration::from_millis(2000);
    /// Slack for a loaded machine: the close comes within this after the deadline.
    const SLACK: Duration = Duration::from_secs(10);
    let q = test_quorum(3);
    let ms = AUTH_DEADLINE.as_millis().to_string();
    let b = broker(
        &q,
        Some(SECRET),
        &[
            "--handshake-timeout-ms",
            &ms,
            "--frame-timeout-ms",
            "120000",
            "--idle-timeout-ms",
            "120000",
        ],
    );
    let silent = async {
        let started = Instant::now();
        let mut s = TcpStream::connect(&b.resp).await.expect("connect");
        let got = read_until_closed_by(&mut s, started + AUTH_DEADLINE + SLACK).await;
        (started.elapsed(), got)
    };
    let half = async {
        let started = Instant::now();
        let mut s = TcpStream::connect(&b.resp).await.expect("connect");
        // `AUTH <token>` cut in the middle of the token, then nothing.
        s.write_all(b"*2\r\n$4\r\nAUTH\r\n$24\r\ntok-5be1")
            .await
            .expect("send half a request");
        let got = read_until_closed_by(&mut s, started + AUTH_DEADLINE + SLACK).await;
        (started.elapsed(), got)
    };
    let (silent, half) = tokio::join!(silent, half);
    for (what, (took, got)) in [("silent", silent), ("half an AUTH", half)] {
        assert!(
            took >= AUTH_DEADLINE,
            "{what}: closed after {took:?}, before the {AUTH_DEADLINE:?} deadline: {got:?}"
        );
        assert_eq!(
            got, "-ERR not authenticated within 2s of connecting\r\n",
            "{what}, closed after {took:?}"
        );
    }
    // The right token in time: served.
    assert!(resp_next_within(&b.resp, Some(SECRET), DEADLINE)
        .await
        .is_ok());
}

/// The pause before a wrong token is answered (`broker::AUTH_FAILURE_PAUSE`), on RESP
/// (`AUTH`) and binary (`Hello`) connections: the refusal comes no sooner. The right
/// token is not paused: many right tokens take less time than a few paused ones would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_are_answered_after_the_pause_and_right_ones_at_once() {
    const PAUSE: Duration = broker::AUTH_FAILURE_PAUSE;
    /// Right tokens sent: paused, they would take `RIGHT * PAUSE`.
    const RIGHT: u32 = 40;
    let q = test_quorum(3);
    let b = broker(&q, Some(SECRET), &[]);

    // RESP: each wrong AUTH is answered no sooner than PAUSE after it was sent.
    let s = TcpStream::connect(&b.resp).await.expect("connect");
    let (rd, mut wr) = s.into_split();
    let mut rd = BufReader::new(rd);
    for form in [&["AUTH", "wrong"][..], &["AUTH", "default", "wrong"]] {
        let sent = Instant::now();
        wr.write_all(&cmd(form)).await.expect("send AUTH");
        let reply = read_reply(&mut rd).await.expect("a reply");
        let took = sent.elapsed();
        assert!(reply.starts_with("-WRONGPASS"), "{form:?}: {reply:?}");
        assert!(
            took >= PAUSE,
            "{form:?}: answered after {took:?}, before the {PAUSE:?} pause"
        );
    }
    // The right token on the same connection, RIGHT times pipelined: all answered in
    // less than half the time the pauses alone would take.
    let sent = Instant::now();
    let rights: Vec<u8> = (0..RIGHT).flat_map(|_| cmd(&["AUTH", SECRET])).collect();
    wr.write_all(&rights).await.expect("send AUTHs");
    for i in 0..RIGHT {
        let reply = read_reply(&mut rd).await.expect("a reply");
        assert_eq!(reply, "+OK\r\n", "right token {i}");
    }
    let took = sent.elapsed();
    assert!(
        took < PAUSE * RIGHT / 2,
        "{RIGHT} right tokens took {took:?}: paused ({PAUSE:?} each)?"
    );
    drop((rd, wr));

    // Binary: a Hello with a wrong token is refused no sooner than PAUSE after connecting
    // (one connection, no retry: see auth.rs).
    let started = Instant::now();
    let refused = binary_next_within(&b.addr, Some("wrong"), DEADLINE).await;
    let took = started.elapsed();
    let e = refused.expect_err("served with a wrong token");
    assert!(e.contains("refused the token"), "{e}");
    assert!(
        took >= PAUSE,
        "binary: refused after {took:?}, before the {PAUSE:?} pause"
    );
    // RIGHT Hellos with the right token, each on a new connection (stats requests).
    let token = Token::new(SECRET).expect("token");
    let started = Instant::now();
    for _ in 0..RIGHT {
        fetch_stats_with_token(&b.addr, Some(&token))
            .await
            .expect("stats with the right token");
    }
    let took = started.elapsed();
    assert!(
        took < PAUSE * RIGHT / 2,
        "{RIGHT} binary Hellos with the right token took {took:?}: paused ({PAUSE:?} each)?"
    );
}

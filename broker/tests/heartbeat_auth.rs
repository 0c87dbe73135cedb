//! What a writer to the nodes, a careless `--advertise` and a SIGTERM can do to the
//! election, end to end: real `idbroker` processes on a real redis quorum, keys written
//! with the `redis` crate, a sink listener the test owns counting the connections that
//! reach it, raw pipelining RESP clients.
//!
//! - A forged heartbeat (a higher term naming the sink) on every node, while the brokers
//!   share a token: nobody steps down, nothing reaches the sink, IDs keep being served.
//! - A heartbeat of term u64::MAX for 1.5 s (no token): elections resume once it is
//!   gone, and the log says what it was; a term register at u64::MAX is reported as
//!   what it is, with the fix.
//! - SIGTERM of the leader under pipelined RESP load: every request is answered well
//!   within its 5 s deadline.
//! - A leader advertising an address where no broker serves: a few RESP requests on a
//!   follower cost a bounded number of connections there and get a clear error, logged
//!   once.

use idclient::broker_client::{BrokerClient, BrokerClientConfig};
use idclient::{IdSource, Token};
use idtools::cluster::{test_quorum, LocalQuorum};
use idtools::failover::{self, stats};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use testkit::broker::TestBroker;
use testkit::resp;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

const SECRET: &str = "hb-s3cret-never-sent-to-a-sink";

/// The heartbeat and term register keys of the default ID register `current`.
const HEARTBEAT_KEY: &str = "current:leader";
const TERM_KEY: &str = "current:term";

/// An idbroker on `quorum` (binary and RESP), with `token` if given, election timing
/// `timeout_ms`/`heartbeat_ms`, and `extra` flags.
fn broker(
    quorum: &LocalQuorum,
    token: Option<&str>,
    (timeout_ms, heartbeat_ms): (u64, u64),
    extra: &[&str],
) -> TestBroker {
    let (t, h) = (timeout_ms.to_string(), heartbeat_ms.to_string());
    let timing = ["--election-timeout-ms", &t, "--heartbeat-ms", &h];
    TestBroker::start(
        env!("CARGO_BIN_EXE_idbroker"),
        &quorum.urls_arg(),
        token,
        &[&timing[..], extra].concat(),
    )
}

/// The default timing of the election tests.
const FAST: (u64, u64) = (200, 50);

async fn wait_settled(
    brokers: &[&TestBroker],
    token: Option<&Token>,
    limit: Duration,
) -> Result<usize, String> {
    let views: Vec<_> = brokers
        .iter()
        .enumerate()
        .map(|(i, b)| (i, b.addr.as_str()))
        .collect();
    failover::wait_settled(&views, token, limit).await
}

/// Runs `cmd` on every node of `quorum` (the writer with access to the nodes).
fn on_every_node(quorum: &LocalQuorum, cmd: &redis::Cmd) {
    tokio::task::block_in_place(|| {
        for url in quorum.urls() {
            let mut con = redis::Client::open(url.as_str())
                .expect("node URL")
                .get_connection_with_timeout(Duration::from_secs(2))
                .expect("connect to a node");
            cmd.query::<redis::Value>(&mut con)
                .expect("the command on a node");
        }
    });
}

fn set(key: &str, value: &str) -> redis::Cmd {
    let mut c = redis::cmd("SET");
    c.arg(key).arg(value);
    c
}

/// A listener the test owns that accepts connections, counts them and closes them at
/// once: its address and the count.
async fn sink() -> (String, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the sink");
    let addr = l.local_addr().expect("sink address").to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            count.fetch_add(1, Relaxed);
            drop(s);
        }
    });
    (addr, accepted)
}

/// `QLIST.NEXT 1` on a fresh RESP connection to `resp` (with `AUTH` first when a token
/// is given): the reply's lines, or why there was none within `limit`.
async fn next_on(resp: &str, token: Option<&str>, limit: Duration) -> Result<Vec<String>, String> {
    let mut s = TcpStream::connect(resp)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut buf = Vec::new();
    if let Some(t) = token {
        let auth = format!("*2\r\n$4\r\nAUTH\r\n${}\r\n{t}\r\n", t.len());
        s.write_all(auth.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let ok = resp::read_reply(&mut s, &mut buf, limit).await?;
        if ok != ["+OK"] {
            return Err(format!("AUTH: {ok:?}"));
        }
    }
    s.write_all(b"*2\r\n$10\r\nQLIST.NEXT\r\n$1\r\n1\r\n")
        .await
        .map_err(|e| e.to_string())?;
    resp::read_reply(&mut s, &mut buf, limit).await
}

/// Finding 8: `<key>:leader = "999 SEQ SINK"` written on every node, again and again for
/// 1.5 s, while two brokers with a token run. Before heartbeats were authenticated both
/// brokers stepped down and forwarded RESP requests, token in the Hello, to the sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_heartbeat_deposes_no_leader_and_draws_no_token() {
    let q = test_quorum(3);
    let (sink, accepted) = sink().await;
    // A timeout well above the forger's pace: followers must not stand merely because
    // the forged value hid the leader's heartbeat for a moment.
    let timing = (1000, 100);
    let brokers: Vec<TestBroker> = (0..2)
        .map(|_| broker(&q, Some(SECRET), timing, &[]))
        .collect();
    let token = Token::new(SECRET).expect("token");
    let refs: Vec<&TestBroker> = brokers.iter().collect();
    let l = wait_settled(&refs, Some(&token), Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (leader, follower) = (&brokers[l], &brokers[1 - l]);
    let term = stats(&leader.addr, Some(&token))
        .await
        .expect("leader stats")
        .term;

    let mut replies = Vec::new();
    let end = Instant::now() + Duration::from_millis(1500);
    let mut seq = 1;
    while Instant::now() < end {
        on_every_node(&q, &set(HEARTBEAT_KEY, &format!("999 {seq} {sink}")));
        seq += 1;
        for resp in [&follower.resp, &leader.resp] {
            replies.push(next_on(resp, Some(SECRET), Duration::from_secs(3)).await);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    assert_eq!(
        accepted.load(Relaxed),
        0,
        "connections reached the address named by the forged heartbeat"
    );
    let l_after = stats(&leader.addr, Some(&token)).await.expect("stats");
    let f_after = stats(&follower.addr, Some(&token)).await.expect("stats");
    assert_eq!(
        (l_after.role.as_str(), l_after.term),
        ("leader", term),
        "the leader stepped down"
    );
    assert_eq!(
        (
            f_after.role.as_str(),
            f_after.term,
            f_after.leader.as_deref()
        ),
        ("follower", term, Some(leader.addr.as_str())),
        "the follower followed the forged heartbeat"
    );
    let failed: Vec<_> = replies
        .iter()
        .filter(|r| !matches!(r.as_deref(), Ok([head, _, _, _, _]) if head == "*2"))
        .collect();
    assert!(failed.is_empty(), "requests not served: {failed:?}");
    let log = leader.stderr() + &follower.stderr();
    assert!(
        log.contains("not authenticated by the brokers' token"),
        "{log}"
    );
    assert!(!log.contains(SECRET), "the token is in a log");
}

/// Finding 8, without a token: a heartbeat of term u64::MAX for 1.5 s (then deleted).
/// Before, every broker took that term as its own and no election could follow it until
/// the brokers restarted, the log blaming the term register.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_of_the_largest_term_stops_no_election() {
    let q = test_quorum(3);
    let brokers: Vec<TestBroker> = (0..2).map(|_| broker(&q, None, FAST, &[])).collect();
    let refs: Vec<&TestBroker> = brokers.iter().collect();
    wait_settled(&refs, None, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let end = Instant::now() + Duration::from_millis(1500);
    let mut seq = 1;
    while Instant::now() < end {
        let forged = format!("{} {seq} 127.0.0.1:1", u64::MAX);
        on_every_node(&q, &set(HEARTBEAT_KEY, &forged));
        seq += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut del = redis::cmd("DEL");
    del.arg(HEARTBEAT_KEY);
    on_every_node(&q, &del);

    if let Err(e) = wait_settled(&refs, None, Duration::from_secs(10)).await {
        let log = brokers[0].stderr() + &brokers[1].stderr();
        panic!("no leader after the forged term was gone: {e}\n{log}");
    }
    let client = BrokerClient::connect(
        brokers.iter().map(|b| b.addr.clone()).collect(),
        BrokerClientConfig::default(),
    )
    .await
    .expect("connect");
    client.next_ids(3).await.expect("IDs after the forged term");
    let log = brokers[0].stderr() + &brokers[1].stderr();
    assert!(
        log.contains(&format!(
            "named term {}, above the highest term of the term register",
            u64::MAX
        )),
        "{log}"
    );
    assert!(!log.contains("the largest term"), "{log}");
}

/// A term register at u64::MAX (written by hand: elections only add one) is reported
/// as what it is, with the fix, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_register_at_the_largest_term_is_reported_with_the_fix() {
    let q = test_quorum(3);
    on_every_node(&q, &set(TERM_KEY, &u64::MAX.to_string()));
    let b = broker(&q, None, FAST, &[]);
    let want = format!(
        "the term register {TERM_KEY} holds {} on a majority of the nodes, the largest term; \
         no election can follow it",
        u64::MAX
    );
    // On failure, the broker's stderr is printed as it drops.
    testkit::wait_for_async(
        &format!("idbroker reports {want:?}"),
        Duration::from_secs(10),
        || std::future::ready(b.stderr().contains(&want)),
    )
    .await;
    // Several more elections fail meanwhile: still said once.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let log = b.stderr();
    assert_eq!(log.matches(&want).count(), 1, "{log}");
    assert!(
        log.contains(&format!("DEL {TERM_KEY} {HEARTBEAT_KEY} on every node")),
        "{log}"
    );
}

/// A raw client pipelining `QLIST.NEXT 1` in batches of 16 on one RESP connection until
/// `stop` or the connection ends: how long each reply took from its batch's write, and
/// each reply. A reply that does not come within 10 s, or the connection closing with
/// requests unanswered, is recorded as such.
async fn pipeline(
    resp: String,
    stop: Arc<AtomicBool>,
) -> Vec<(Duration, Result<Vec<String>, String>)> {
    const BATCH: usize = 16;
    let cmd = b"*2\r\n$10\r\nQLIST.NEXT\r\n$1\r\n1\r\n".repeat(BATCH);
    let mut s = TcpStream::connect(&resp).await.expect("connect RESP");
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while !stop.load(Relaxed) {
        let sent = Instant::now();
        if s.write_all(&cmd).await.is_err() {
            break;
        }
        for _ in 0..BATCH {
            let reply = resp::read_reply(&mut s, &mut buf, Duration::from_secs(10)).await;
            let closed = reply.is_err();
            out.push((sent.elapsed(), reply));
            if closed {
                return out;
            }
        }
    }
    out
}

/// Finding 7: SIGTERM of the leader while raw clients pipeline against the follower and
/// the leader itself. Before, the requests the resigning leader had taken waited their
/// full 5 s deadline for a leader it would never learn ("no leader is known now").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resigning_leader_answers_pending_resp_requests_promptly() {
    let q = test_quorum(3);
    let brokers: Vec<TestBroker> = (0..3).map(|_| broker(&q, None, FAST, &[])).collect();
    let refs: Vec<&TestBroker> = brokers.iter().collect();
    let l = wait_settled(&refs, None, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let stop = Arc::new(AtomicBool::new(false));
    let on_leader: Vec<_> = (0..2)
        .map(|_| tokio::spawn(pipeline(brokers[l].resp.clone(), stop.clone())))
        .collect();
    let on_follower = tokio::spawn(pipeline(brokers[(l + 1) % 3].resp.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    brokers[l].proc.signal(libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Relaxed);

    let mut replies = Vec::new();
    for p in on_leader {
        replies.push(("leader", p.await.expect("pipelining client")));
    }
    replies.push(("follower", on_follower.await.expect("pipelining client")));
    for (whose, r) in &replies {
        let slow: Vec<_> = r
            .iter()
            .filter(|(took, _)| *took >= Duration::from_millis(2500))
            .collect();
        assert!(
            slow.is_empty(),
            "requests on the {whose} answered after 2.5 s (deadline 5 s): {slow:?}"
        );
        for (_, reply) in r {
            match reply.as_deref() {
                Ok([head, _, _, _, _]) if head == "*2" => {}
                Ok([line]) if line.starts_with("-ERR ") => {}
                // The leader's connection ends when it has shut down; only there.
                Err(e) if *whose == "leader" && e == "closed" => {}
                other => panic!("on the {whose}: {other:?}"),
            }
        }
    }
    let served = replies[2].1.iter().filter(|(_, r)| r.is_ok()).count();
    assert!(served > 0, "nothing served on the follower");
}

/// Waits (10 s at most) until `b`, the first broker started, leads.
async fn wait_leads(b: &TestBroker) {
    let addr = &b.addr;
    testkit::wait_for_async(
        "the first broker leads",
        Duration::from_secs(10),
        || async move { stats(addr, None).await.is_some_and(|s| s.role == "leader") },
    )
    .await;
}

/// Finding 6: the leader advertises an address where no broker serves (a listener the
/// test owns, which closes every connection). Before, 4 RESP requests on a follower made
/// ~100 connections there, each request retrying until its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misadvertised_leader_costs_a_bounded_number_of_connections() {
    let q = test_quorum(3);
    let (sink, accepted) = sink().await;
    let leader = broker(&q, None, FAST, &["--advertise", &sink]);
    wait_leads(&leader).await;
    let follower = broker(&q, None, FAST, &[]);
    let (addr, sink_ref) = (&follower.addr, &sink);
    testkit::wait_for_async(
        &format!("the follower learns the leader, advertised as {sink}"),
        Duration::from_secs(10),
        || async move { stats(addr, None).await.and_then(|s| s.leader).as_ref() == Some(sink_ref) },
    )
    .await;

    let before = accepted.load(Relaxed);
    let started = Instant::now();
    let mut s = TcpStream::connect(&follower.resp)
        .await
        .expect("connect RESP");
    s.write_all(&b"*2\r\n$10\r\nQLIST.NEXT\r\n$1\r\n1\r\n".repeat(4))
        .await
        .expect("write");
    let mut buf = Vec::new();
    for _ in 0..4 {
        let reply = resp::read_reply(&mut s, &mut buf, Duration::from_secs(10))
            .await
            .expect("a reply");
        let line = &reply[0];
        assert!(
            line.starts_with("-ERR ") && line.contains(&sink) && line.contains("--advertise"),
            "unclear error: {reply:?}"
        );
    }
    let took = started.elapsed();
    let made = accepted.load(Relaxed) - before;
    assert!(made <= 4, "4 requests made {made} connections to {sink}");
    assert!(
        took < Duration::from_millis(2500),
        "answered after {took:?}"
    );
    let log = follower.stderr();
    assert_eq!(
        log.matches("cannot forward RESP requests").count(),
        1,
        "{log}"
    );
}

/// Finding 6, the other half: the live leader's heartbeat names the follower's own
/// address (both were given the same `--advertise`). The follower cannot forward to
/// itself and no election will change that: its RESP requests are answered at once with
/// an error saying so (before, each waited out its 5 s deadline), and it logs it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_named_by_the_live_leader_answers_at_once() {
    let q = test_quorum(3);
    let (shared, _accepted) = sink().await;
    let leader = broker(&q, None, FAST, &["--advertise", &shared]);
    wait_leads(&leader).await;
    let follower = broker(&q, None, FAST, &["--advertise", &shared]);
    let (addr, shared_ref) = (&follower.addr, &shared);
    testkit::wait_for_async(
        &format!("the follower follows the leader, advertised as {shared}"),
        Duration::from_secs(10),
        || async move {
            stats(addr, None).await.is_some_and(|s| {
                s.role == "follower" && s.leader.as_deref() == Some(shared_ref.as_str())
            })
        },
    )
    .await;
    // A few heartbeats: the follower has seen the leader's change (it is live).
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let mut s = TcpStream::connect(&follower.resp)
        .await
        .expect("connect RESP");
    s.write_all(&b"*2\r\n$10\r\nQLIST.NEXT\r\n$1\r\n1\r\n".repeat(3))
        .await
        .expect("write");
    let mut buf = Vec::new();
    for _ in 0..3 {
        let reply = resp::read_reply(&mut s, &mut buf, Duration::from_secs(10))
            .await
            .expect("a reply");
        let line = &reply[0];
        assert!(
            line.starts_with("-ERR ") && line.contains("own address") && line.contains(&shared),
            "unclear error: {reply:?}"
        );
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2500),
        "answered after {took:?}"
    );
    let log = follower.stderr();
    assert_eq!(
        log.matches("clients redirected to the leader reach this follower instead")
            .count(),
        1,
        "{log}"
    );
    drop(leader);
}

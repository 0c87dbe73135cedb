//! RESP on a follower: three real `idbroker` processes elect a leader on one real redis
//! quorum; Redis clients (redis-cli, the Rust `redis` crate, a raw pipelining client)
//! talking to a FOLLOWER's RESP port get their IDs, forwarded to the leader, in the same
//! history as binary clients of the leader; through a kill -9 of the leader; and with an
//! auth token the leader requires.

use idclient::broker_client::{BrokerClient, BrokerClientConfig};
use idclient::{IdRange, IdSource, Token};
use idtools::cluster::{test_quorum, LocalQuorum};
use idtools::failover::stats;
use idtools::history::{assert_linearizable, monotonic_ns, Event, Recorder};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use testkit::broker::{wait_settled, TestBroker};
use testkit::resp::{self, parse_range, redis_cli};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// An idbroker serving binary and RESP on `quorum`, taking part in elections with
/// short timeouts, with `extra` flags.
fn broker(quorum: &LocalQuorum, extra: &[&str]) -> TestBroker {
    let timing = ["--election-timeout-ms", "200", "--heartbeat-ms", "50"];
    TestBroker::start(
        env!("CARGO_BIN_EXE_idbroker"),
        &quorum.urls_arg(),
        None,
        &[&timing[..], extra].concat(),
    )
}

/// The follower's RESP port answers `QLIST.NEXT` with the leader's IDs: redis-cli, then
/// `redis` crate callers on the follower interleaved with binary callers of the leader,
/// all in one linearizable history; the follower reserves nothing itself and counts what
/// it forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_resp_port_serves_the_leaders_ids() {
    let q = test_quorum(3);
    let brokers: Vec<TestBroker> = (0..3).map(|_| broker(&q, &[])).collect();
    let l = wait_settled(&brokers, &[0, 1, 2], None, Duration::from_secs(10)).await;
    let (leader, follower) = (&brokers[l], &brokers[(l + 1) % 3]);

    let out = tokio::task::block_in_place(|| {
        redis_cli(&follower.resp, &[], "QLIST.NEXT 3\n".repeat(10).as_bytes())
    });
    let lines: Vec<&str> = out.lines().collect();
    let cli: Vec<IdRange> = lines.chunks(2).map(|c| parse_range(c[0], c[1])).collect();
    assert_eq!(cli.len(), 10, "{out:?}");
    for w in cli.windows(2) {
        assert!(w[0].len() == 3 && w[1].lo > w[0].hi, "{cli:?}");
    }

    let binary = Arc::new(
        BrokerClient::connect(vec![leader.addr.clone()], BrokerClientConfig::default())
            .await
            .expect("binary client connects"),
    );
    let mut resp = Vec::new();
    for protocol in ["resp2", "resp3"] {
        let url = format!("redis://{}/?protocol={protocol}", follower.resp);
        let client = redis::Client::open(url).expect("redis URL");
        let con = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis crate connects to the follower");
        resp.push(con);
    }
    let history = Recorder::new();
    let mut tasks = Vec::new();
    for caller in 0..16 {
        let (binary, history) = (binary.clone(), history.clone());
        let con = resp[caller % 2].clone();
        tasks.push(tokio::spawn(async move {
            let binary = &binary;
            // One multiplexed connection a caller: its clones share it.
            let request = |i: usize| {
                let mut con = con.clone();
                async move {
                    if (caller + i).is_multiple_of(2) {
                        binary.next_ids(2).await
                    } else {
                        let reply: Result<(String, String), _> =
                            redis::cmd("QLIST.NEXT").arg(2).query_async(&mut con).await;
                        Ok(reply
                            .map(|(lo, hi)| parse_range(&lo, &hi))
                            .expect("a forwarded QLIST.NEXT"))
                    }
                }
            };
            history.call_while(|i| i < 30, request).await
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

    let f = stats(&follower.addr, None).await.expect("follower stats");
    let lead = stats(&leader.addr, None).await.expect("leader stats");
    assert_eq!(f.role, "follower");
    // 10 from redis-cli, 16 x 15 from the redis crate, all answered by the leader.
    let forwarded = 10 + 16 * 15;
    assert_eq!((f.forwarded, f.requests_ok), (forwarded, forwarded));
    assert_eq!(f.ids, 0, "the follower handed out IDs of its own");
    assert_eq!(lead.forwarded, 0);
    // Every ID the leader handed out went to one of these callers (no hole in between).
    assert_eq!(lead.ids, 10 * 3 + 16 * 30 * 2);
    let cli_stats =
        tokio::task::block_in_place(|| redis_cli(&follower.resp, &["-3", "QLIST.STATS"], b""));
    assert!(
        cli_stats.contains(&format!("forwarded {forwarded}\n")),
        "{cli_stats:?}"
    );
}

/// A raw RESP client pipelining `QLIST.NEXT 1` in batches of `BATCH` on one connection
/// until `stop`: every reply's event (IDs or none), and the error lines it got.
async fn pipeline(resp: String, stop: Arc<AtomicBool>) -> (Vec<Event>, Vec<String>) {
    const BATCH: usize = 16;
    let cmd = b"*2\r\n$10\r\nQLIST.NEXT\r\n$1\r\n1\r\n".repeat(BATCH);
    let mut s = TcpStream::connect(&resp)
        .await
        .expect("connect to the follower");
    let (mut events, mut errors) = (Vec::new(), Vec::new());
    let mut buf = Vec::new();
    while !stop.load(Relaxed) {
        let invoke_ns = monotonic_ns();
        s.write_all(&cmd).await.expect("write a pipelined batch");
        for _ in 0..BATCH {
            let reply = read_reply(&mut s, &mut buf).await;
            let return_ns = monotonic_ns();
            let outcome = match reply.as_slice() {
                [head, lo, hi] if head == "*2" => Some(parse_range(lo, hi)),
                [line] if line.starts_with("-ERR ") => {
                    errors.push(line.clone());
                    None
                }
                other => panic!("not a QLIST.NEXT reply: {other:?}"),
            };
            events.push(Event {
                invoke_ns,
                return_ns,
                outcome,
            });
        }
    }
    (events, errors)
}

/// One reply: `["*2", lo, hi]` or `[error line]`. Every reply must arrive within 10 s
/// (the broker's deadline is 5 s): the connection never hangs.
async fn read_reply(s: &mut TcpStream, buf: &mut Vec<u8>) -> Vec<String> {
    let lines = resp::read_reply(s, buf, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("the follower's reply: {e}"));
    match &lines[..] {
        [n, _, lo, _, hi] => vec![n.clone(), lo.clone(), hi.clone()],
        _ => lines,
    }
}

/// kill -9 of the leader while raw clients pipeline against a follower: each request gets
/// IDs (forwarded to the new leader once elected, or served by the follower if it is
/// elected) or a clear `-ERR`; the connection never breaks; no ID is handed out twice and
/// real-time order holds, with binary clients of every broker in the same history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_under_pipelined_resp_load_on_a_follower() {
    let q = test_quorum(3);
    let mut brokers: Vec<TestBroker> = (0..3).map(|_| broker(&q, &[])).collect();
    let l = wait_settled(&brokers, &[0, 1, 2], None, Duration::from_secs(10)).await;
    let f = (l + 1) % 3;
    let stop = Arc::new(AtomicBool::new(false));
    let pipes: Vec<_> = (0..2)
        .map(|_| tokio::spawn(pipeline(brokers[f].resp.clone(), stop.clone())))
        .collect();
    // Binary callers of every broker (the BrokerClient follows redirects) meanwhile.
    let addrs: Vec<String> = brokers.iter().map(|b| b.addr.clone()).collect();
    let binary = Arc::new(
        BrokerClient::connect(addrs, BrokerClientConfig::default())
            .await
            .expect("binary client connects"),
    );
    let seen = Recorder::new();
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let (binary, stop, seen) = (binary.clone(), stop.clone(), seen.clone());
            tokio::spawn(async move {
                let binary = &binary;
                let request = |_| async move { binary.next_ids(1).await };
                seen.call_while(|_| !stop.load(Relaxed), request).await
            })
        })
        .collect();

    // Forwarding under way before the kill.
    let f_addr = &brokers[f].addr;
    testkit::wait_for_async(
        "the follower forwards 100 requests",
        Duration::from_secs(10),
        || async move { stats(f_addr, None).await.map_or(0, |s| s.forwarded) >= 100 },
    )
    .await;
    brokers[l].proc.kill();
    let killed_ns = monotonic_ns();
    let alive: Vec<usize> = (0..3).filter(|&i| i != l).collect();
    let n = wait_settled(&brokers, &alive, None, Duration::from_secs(10)).await;
    let settled_ns = monotonic_ns();
    let forwarded_then = stats(&brokers[f].addr, None)
        .await
        .map_or(0, |s| s.forwarded);
    // Requests invoked after the new leader settled are served (bounded wait).
    let served_after = |events: &[Event]| {
        events
            .iter()
            .any(|e| e.invoke_ns > settled_ns && e.outcome.is_some())
    };
    let (f_addr, seen_ref) = (&brokers[f].addr, &seen);
    testkit::wait_for_async(
        "the follower serves RESP requests, and a request invoked after the new leader \
         settled is served",
        Duration::from_secs(10),
        || async move {
            let f_stats = stats(f_addr, None).await;
            f_stats.is_some_and(|s| s.requests_ok > 0) && served_after(&seen_ref.events())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let forwarded_now = stats(&brokers[f].addr, None)
        .await
        .map_or(0, |s| s.forwarded);
    stop.store(true, Relaxed);

    for c in callers {
        c.await.expect("binary caller");
    }
    let mut events = seen.take();
    let mut resp_events = Vec::new();
    let mut errors = Vec::new();
    for p in pipes {
        let (ev, err) = p.await.expect("pipelining client");
        resp_events.extend(ev);
        errors.extend(err);
    }
    let after: Vec<&Event> = resp_events
        .iter()
        .filter(|e| e.invoke_ns > settled_ns)
        .collect();
    assert!(
        after.iter().any(|e| e.outcome.is_some()),
        "no RESP request on the follower was served after the new leader (broker {n}) settled"
    );
    // Errors say what happened: no leader yet, or the old leader unreachable in time.
    for e in &errors {
        let clear = e.contains("not the leader")
            || e.contains("no broker reachable")
            || e.contains("deadline");
        assert!(clear, "unclear error: {e}");
    }
    let failed_before_kill = resp_events
        .iter()
        .filter(|e| e.return_ns < killed_ns && e.outcome.is_none())
        .count();
    assert_eq!(failed_before_kill, 0, "errors before the kill: {errors:?}");
    if n != f {
        // Still a follower: it forwards to the new leader.
        assert!(
            forwarded_now > forwarded_then,
            "nothing forwarded to the new leader"
        );
    }
    eprintln!(
        "RESP on the follower through the kill: {} served, {} errors ({:?}); the new \
         leader is {}",
        resp_events.iter().filter(|e| e.outcome.is_some()).count(),
        errors.len(),
        errors.first(),
        if n == f {
            "that follower"
        } else {
            "the other follower"
        }
    );
    events.extend(resp_events);
    assert_linearizable(&events);
}

/// A quorum whose brokers require a token: the follower presents its own to the leader,
/// and its RESP clients still have to `AUTH` to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_with_a_token_forwards_to_a_leader_requiring_it() {
    let q = test_quorum(3);
    let dir = tempfile::tempdir().expect("temp dir");
    let secret = "forward-s3cret";
    let path = dir.path().join("token");
    write_private(&path, secret);
    let file = path.to_str().expect("utf-8 path");
    let token = Token::new(secret).expect("token");
    let brokers: Vec<TestBroker> = (0..3)
        .map(|_| broker(&q, &["--auth-token-file", file]))
        .collect();
    let l = wait_settled(&brokers, &[0, 1, 2], Some(&token), Duration::from_secs(10)).await;
    let follower = &brokers[(l + 1) % 3];

    let url = format!("redis://:{secret}@{}/", follower.resp);
    let mut con = redis::Client::open(url)
        .expect("redis URL")
        .get_multiplexed_async_connection()
        .await
        .expect("redis crate connects with AUTH");
    let mut ranges = Vec::new();
    for _ in 0..20 {
        let (lo, hi): (String, String) = redis::cmd("QLIST.NEXT")
            .arg(4)
            .query_async(&mut con)
            .await
            .expect("a forwarded QLIST.NEXT with the token");
        ranges.push(parse_range(&lo, &hi));
    }
    for w in ranges.windows(2) {
        assert!(w[0].len() == 4 && w[1].lo > w[0].hi, "{ranges:?}");
    }
    // Without AUTH the follower refuses, as Redis with requirepass does.
    let out = tokio::task::block_in_place(|| redis_cli(&follower.resp, &["QLIST.NEXT"], b""));
    assert!(out.contains("NOAUTH"), "{out:?}");
    let f = stats(&follower.addr, Some(&token))
        .await
        .expect("follower stats");
    assert_eq!((f.role.as_str(), f.forwarded), ("follower", 20));
    let lead = stats(&brokers[l].addr, Some(&token))
        .await
        .expect("leader stats");
    assert_eq!(lead.ids, 20 * 4);
}

/// Writes `content` to a new file readable by its owner only.
fn write_private(path: &Path, content: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .expect("create the token file");
    f.write_all(content.as_bytes())
        .expect("write the token file");
}

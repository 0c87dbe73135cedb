//! Leader election end to end: three real `idbroker --serve window` processes on one
//! real 5-node redis quorum. One becomes leader, the others redirect; kill -9 the leader
//! and another takes over; SIGSTOP the leader past the election timeout and SIGCONT it,
//! and it steps down. Every ID served meanwhile is checked with the history checker.
//!
//! Most callers here speak the wire protocol directly (a connection per request, following
//! redirects), so the failover can be timed per broker; the SIGSTOP test adds callers of
//! the real `BrokerClient` (which follows redirects itself) to the same history.

use idclient::broker_client::{BrokerClient, BrokerClientConfig};
use idclient::{IdRange, IdSource};
use idproto::framed::FrameReader;
use idproto::wire::{ClientMsg, ServerMsg};
use idtools::cluster::{test_quorum, LocalQuorum};
use idtools::failover::stats;
use idtools::history::{assert_linearizable, monotonic_ns, Recorder};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testkit::broker::{wait_settled, TestBroker};
use testkit::raw;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Election timing of these tests: the defaults, said out loud.
const ELECTION_TIMEOUT_MS: u64 = 200;
const HEARTBEAT_MS: u64 = 50;

/// An idbroker with the election timing of these tests.
fn broker(quorum: &LocalQuorum) -> TestBroker {
    let (timeout, heartbeat) = (ELECTION_TIMEOUT_MS.to_string(), HEARTBEAT_MS.to_string());
    TestBroker::start(
        env!("CARGO_BIN_EXE_idbroker"),
        &quorum.urls_arg(),
        None,
        &[
            "--election-timeout-ms",
            &timeout,
            "--heartbeat-ms",
            &heartbeat,
        ],
    )
}

/// One `NextIds` on a fresh connection: the broker's reply, or why there was none.
async fn request(addr: &str, count: u64) -> Result<ServerMsg, String> {
    let talk = async {
        let mut s = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let buf = raw::encode(&[
            raw::hello(),
            ClientMsg::NextIds {
                id: 1,
                count,
                deadline_ms: 1000,
            },
        ]);
        s.write_all(&buf).await.map_err(|e| format!("write: {e}"))?;
        let mut rd = FrameReader::new(&mut s, Duration::from_secs(5));
        match rd.read_msg::<ServerMsg>().await {
            Ok(Some(ServerMsg::Welcome { .. })) => {}
            other => return Err(format!("no welcome: {other:?}")),
        }
        match rd.read_msg::<ServerMsg>().await {
            Ok(Some(msg)) => Ok(msg),
            other => Err(format!("no reply: {other:?}")),
        }
    };
    tokio::time::timeout(Duration::from_secs(1), talk)
        .await
        .map_err(|_| "timed out".to_string())?
}

/// What the callers saw: every request's event, and which broker served each success
/// (when it returned, and the broker's address).
#[derive(Default)]
struct Seen {
    history: Recorder,
    served_by: Mutex<Vec<(u64, String)>>,
}

/// `n` callers asking for one ID at a time, starting at the broker they were last sent
/// to, following redirects, trying the next broker when one does not answer.
fn spawn_callers(
    addrs: Vec<String>,
    n: usize,
    stop: &Arc<AtomicBool>,
    seen: &Arc<Seen>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|c| {
            let (addrs, stop, seen) = (addrs.clone(), stop.clone(), seen.clone());
            tokio::spawn(async move {
                let mut target = addrs[c % addrs.len()].clone();
                let mut next = c;
                while !stop.load(Relaxed) {
                    let ids = async {
                        match request(&target, 1).await {
                            Ok(ServerMsg::Ids { lo, hi, .. }) => Ok(IdRange { lo, hi }),
                            other => Err(other),
                        }
                    };
                    let (reply, event) = seen.history.record_event(ids).await;
                    match reply {
                        Ok(_) => seen
                            .served_by
                            .lock()
                            .expect("served_by lock")
                            .push((event.return_ns, target.clone())),
                        Err(Ok(ServerMsg::Redirect {
                            leader: Some(l), ..
                        })) => target = l,
                        Err(_) => {
                            next += 1;
                            target = addrs[next % addrs.len()].clone();
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
            })
        })
        .collect()
}

/// `n` callers of one real `BrokerClient` over every broker, into the same history.
async fn spawn_client_callers(
    addrs: Vec<String>,
    n: usize,
    stop: &Arc<AtomicBool>,
    seen: &Arc<Seen>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let config = BrokerClientConfig {
        deadline: Duration::from_secs(5),
        ..Default::default()
    };
    let client = Arc::new(
        BrokerClient::connect(addrs, config)
            .await
            .expect("connect a broker client"),
    );
    (0..n)
        .map(|_| {
            let (client, stop, seen) = (client.clone(), stop.clone(), seen.clone());
            tokio::spawn(async move {
                let client = &client;
                seen.history
                    .call_while(|_| !stop.load(Relaxed), |_| client.next_ids(1))
                    .await;
            })
        })
        .collect()
}

async fn join(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("a caller hung")
            .expect("caller task");
    }
}

/// Waits (bounded) until a success served by another broker than `old` returned after
/// `since_ns`: the time from `since_ns` to it.
async fn first_served_after(seen: &Seen, old: &str, since_ns: u64) -> Duration {
    let mut first = None;
    testkit::wait_for_async(
        &format!("an ID served by a new leader (not {old})"),
        Duration::from_secs(15),
        || {
            first = seen
                .served_by
                .lock()
                .expect("served_by lock")
                .iter()
                .filter(|(t, by)| *t > since_ns && by != old)
                .map(|(t, _)| *t)
                .min();
            std::future::ready(first.is_some())
        },
    )
    .await;
    let t = first.expect("waited for");
    Duration::from_nanos(t - since_ns)
}

/// Checks the history; how many requests got IDs.
#[track_caller]
fn assert_checked(seen: &Seen) -> usize {
    let events = seen.history.events();
    assert_linearizable(&events);
    events.iter().filter(|e| e.outcome.is_some()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_serves_followers_redirect_and_a_killed_leader_is_replaced() {
    let q = test_quorum(5);
    let mut brokers: Vec<TestBroker> = (0..3).map(|_| broker(&q)).collect();
    let l = wait_settled(&brokers, &[0, 1, 2], None, Duration::from_secs(10)).await;
    let leader = brokers[l].addr.clone();

    // A follower redirects to the leader and starts nothing; the leader serves.
    let f = (l + 1) % 3;
    let before = stats(&brokers[f].addr, None).await.expect("follower stats");
    match request(&brokers[f].addr, 1).await {
        Ok(ServerMsg::Redirect { id: 1, leader: to }) => assert_eq!(to, Some(leader.clone())),
        other => panic!("follower answered {other:?}"),
    }
    let after = stats(&brokers[f].addr, None).await.expect("follower stats");
    assert_eq!(after.redirects, before.redirects + 1);
    assert_eq!((after.rounds, after.ids), (before.rounds, before.ids));
    assert!(matches!(request(&leader, 3).await, Ok(ServerMsg::Ids { lo, hi, .. }) if hi == lo + 2));

    // Callers through the kill -9 of the leader.
    let addrs: Vec<String> = brokers.iter().map(|b| b.addr.clone()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let callers = spawn_callers(addrs, 4, &stop, &seen);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let term = stats(&leader, None).await.expect("leader stats").term;
    let killed_ns = monotonic_ns();
    brokers[l].proc.kill();
    let took = first_served_after(&seen, &leader, killed_ns).await;
    eprintln!("failover: kill -9 of the leader to the first ID from the new leader: {took:?}");
    let alive: Vec<usize> = (0..3).filter(|&i| i != l).collect();
    let n = wait_settled(&brokers, &alive, None, Duration::from_secs(10)).await;
    let new = stats(&brokers[n].addr, None)
        .await
        .expect("new leader stats");
    assert!(new.term > term, "new term {} after {term}", new.term);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Relaxed);
    join(callers).await;
    let ok = assert_checked(&seen);
    assert!(ok > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_past_the_timeout_steps_down_when_continued() {
    let q = test_quorum(5);
    let brokers: Vec<TestBroker> = (0..3).map(|_| broker(&q)).collect();
    let l = wait_settled(&brokers, &[0, 1, 2], None, Duration::from_secs(10)).await;
    let leader = brokers[l].addr.clone();
    let term = stats(&leader, None).await.expect("leader stats").term;

    let addrs: Vec<String> = brokers.iter().map(|b| b.addr.clone()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let mut callers = spawn_callers(addrs.clone(), 4, &stop, &seen);
    callers.extend(spawn_client_callers(addrs, 8, &stop, &seen).await);
    tokio::time::sleep(Duration::from_millis(300)).await;

    brokers[l].proc.signal(libc::SIGSTOP);
    let stopped_ns = monotonic_ns();
    // The others elect a new leader meanwhile (the stopped one cannot be asked).
    let others: Vec<usize> = (0..3).filter(|&i| i != l).collect();
    let n = wait_settled(&brokers, &others, None, Duration::from_secs(10)).await;
    let took = first_served_after(&seen, &leader, stopped_ns).await;
    eprintln!("failover: SIGSTOP of the leader to the first ID from the new leader: {took:?}");
    brokers[l].proc.signal(libc::SIGCONT);
    // Continued, it sees the higher term and follows the new leader.
    let settled = wait_settled(&brokers, &[0, 1, 2], None, Duration::from_secs(10)).await;
    assert_eq!(settled, n);
    let old = stats(&leader, None).await.expect("old leader stats");
    assert_eq!(old.role, "follower");
    assert!(old.term > term);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Relaxed);
    join(callers).await;
    let ok = assert_checked(&seen);
    assert!(ok > 0);
}

/// Kills of the leader in [`repeated_kills_of_the_leader_fail_over_every_time`]:
/// `QLIST_FAILOVER_KILLS` (20 for the failover measurement), 5 by default.
fn kills() -> usize {
    std::env::var("QLIST_FAILOVER_KILLS")
        .ok()
        .map(|v| v.parse().expect("QLIST_FAILOVER_KILLS must be a number"))
        .unwrap_or(5)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_kills_of_the_leader_fail_over_every_time() {
    let q = test_quorum(5);
    let mut brokers: Vec<TestBroker> = (0..3).map(|_| broker(&q)).collect();
    let mut alive: Vec<usize> = vec![0, 1, 2];
    let seen = Arc::new(Seen::default());
    let mut took = Vec::new();
    for _ in 0..kills() {
        let l = wait_settled(&brokers, &alive, None, Duration::from_secs(10)).await;
        let leader = brokers[l].addr.clone();
        let addrs: Vec<String> = alive.iter().map(|&i| brokers[i].addr.clone()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let callers = spawn_callers(addrs, 4, &stop, &seen);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let killed_ns = monotonic_ns();
        brokers[l].proc.kill();
        took.push(first_served_after(&seen, &leader, killed_ns).await);
        stop.store(true, Relaxed);
        join(callers).await;
        alive.retain(|&i| i != l);
        brokers.push(broker(&q));
        alive.push(brokers.len() - 1);
    }
    took.sort();
    let p50 = took[took.len() / 2];
    let max = took[took.len() - 1];
    eprintln!(
        "failover over {} kills -9 of the leader, to the first ID from the new leader: \
         p50 {p50:?}, max {max:?} (all: {took:?})",
        took.len()
    );
    assert!(assert_checked(&seen) > 0);
}

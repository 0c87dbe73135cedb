use super::coalesce::COALESCE_QUEUE;
use super::failover::note_cut;
use super::*;
use idproto::framed::FrameReader;
use idproto::wire::{self, ClientMsg, ServerMsg};
use idproto::NodeFailure;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// How a fake broker answers.
#[derive(Debug, Clone)]
enum Script {
    /// Welcome, then the right IDs for every request.
    Normal,
    /// Refused instead of Welcome.
    RefuseHello,
    /// A reply for a request id never sent, then the right reply.
    UnknownIdFirst,
    /// An undecodable frame in reply to a request.
    Garbage,
    /// The first bytes of a reply, then silence (the connection stays open).
    HalfFrame,
    /// Closes the connection when a request arrives.
    CloseOnRequest,
    /// Answers every request with this error.
    Fail(IdError),
    /// Answers with one ID too many.
    WrongCount,
    /// A follower: answers every request with a redirect to this leader.
    Redirect(Option<String>),
}

struct FakeBroker {
    addr: String,
    /// Connections accepted, and requests read (over all of them).
    conns: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeBroker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeBroker {
    async fn start(script: Script) -> FakeBroker {
        FakeBroker::serve_gated(fake_listener().await, script, None)
    }

    /// Like `start`, but every reply first takes a permit of the gate returned, closed
    /// at first (the test releases replies one by one, or all at once).
    async fn start_gated(script: Script) -> (FakeBroker, Arc<Semaphore>) {
        let gate = Arc::new(Semaphore::new(0));
        let b = FakeBroker::serve_gated(fake_listener().await, script, Some(gate.clone()));
        (b, gate)
    }

    /// A fake broker on `listener` (bound first, so that brokers can name each other).
    fn serve_on(listener: TcpListener, script: Script) -> FakeBroker {
        FakeBroker::serve_gated(listener, script, None)
    }

    fn serve_gated(
        listener: TcpListener,
        script: Script,
        gate: Option<Arc<Semaphore>>,
    ) -> FakeBroker {
        let addr = addr_of(&listener);
        let conns = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let (c, r) = (conns.clone(), requests.clone());
        let task = tokio::spawn(async move {
            // IDs are handed out from one counter per fake broker.
            let next = Arc::new(AtomicU64::new(1));
            let mut serving = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                c.fetch_add(1, Relaxed);
                let (script, r, next, gate) =
                    (script.clone(), r.clone(), next.clone(), gate.clone());
                serving.spawn(serve(stream, script, r, next, gate));
            }
        });
        FakeBroker {
            addr,
            conns,
            requests,
            task,
        }
    }

    fn conns(&self) -> usize {
        self.conns.load(Relaxed)
    }

    fn requests(&self) -> usize {
        self.requests.load(Relaxed)
    }
}

async fn fake_listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port for the fake broker")
}

fn addr_of(listener: &TcpListener) -> String {
    listener.local_addr().expect("local addr").to_string()
}

async fn write(wr: &mut tokio::net::tcp::OwnedWriteHalf, msg: &ServerMsg) {
    let mut buf = Vec::new();
    wire::encode(msg, &mut buf).expect("encode");
    wr.write_all(&buf).await.expect("fake broker write");
}

/// One connection of a fake broker.
async fn serve(
    stream: TcpStream,
    script: Script,
    requests: Arc<AtomicUsize>,
    next: Arc<AtomicU64>,
    gate: Option<Arc<Semaphore>>,
) {
    let (rd, mut wr) = stream.into_split();
    let mut rd = FrameReader::new(rd, framed::FRAME_TIMEOUT);
    let Ok(Some(ClientMsg::Hello { .. })) = rd.read_msg::<ClientMsg>().await else {
        return;
    };
    if let Script::RefuseHello = script {
        let reason = "go away".to_string();
        return write(&mut wr, &ServerMsg::Refused { reason }).await;
    }
    let welcome = ServerMsg::Welcome {
        version: wire::VERSION,
        max_count: 1000,
        max_in_flight: 64,
    };
    write(&mut wr, &welcome).await;
    while let Ok(Some(msg)) = rd.read_msg::<ClientMsg>().await {
        let ClientMsg::NextIds { id, count, .. } = msg else {
            continue;
        };
        requests.fetch_add(1, Relaxed);
        if let Some(gate) = &gate {
            gate.acquire().await.expect("gate open").forget();
        }
        let lo = next.fetch_add(count, Relaxed);
        let ids = ServerMsg::ids(
            id,
            IdRange {
                lo,
                hi: lo + count - 1,
            },
        );
        match &script {
            Script::Normal | Script::RefuseHello => write(&mut wr, &ids).await,
            Script::UnknownIdFirst => {
                let stray = ServerMsg::ids(id + 1000, IdRange { lo: 1, hi: 1 });
                write(&mut wr, &stray).await;
                write(&mut wr, &ids).await;
            }
            Script::Garbage => {
                let _ = wr.write_all(&[3, 0, 0, 0, 0xde, 0xad, 0xbe]).await;
            }
            Script::HalfFrame => {
                let mut frame = Vec::new();
                wire::encode(&ids, &mut frame).expect("encode");
                wr.write_all(&frame[..6]).await.expect("fake broker write");
                // Silence, with the connection open, until the test ends.
                std::future::pending::<()>().await;
            }
            Script::CloseOnRequest => return,
            Script::Fail(error) => {
                let error = error.clone();
                write(&mut wr, &ServerMsg::Failed { id, error }).await;
            }
            Script::WrongCount => {
                let wrong = ServerMsg::ids(id, IdRange { lo, hi: lo + count });
                write(&mut wr, &wrong).await;
            }
            Script::Redirect(leader) => {
                let leader = leader.clone();
                write(&mut wr, &ServerMsg::Redirect { id, leader }).await;
            }
        }
    }
}

fn config(deadline: Duration) -> BrokerClientConfig {
    BrokerClientConfig {
        deadline,
        connections: 1,
        jitter_seed: Some(7),
        ..Default::default()
    }
}

async fn client(brokers: &[&FakeBroker], config: BrokerClientConfig) -> BrokerClient {
    let addrs = brokers.iter().map(|b| b.addr.clone()).collect();
    BrokerClient::connect(addrs, config)
        .await
        .expect("connect to the fake broker")
}

/// The reasons of a `BrokersUnavailable`, or a panic naming what came instead.
#[track_caller]
fn unavailable_reasons<T: std::fmt::Debug>(r: Result<T, IdError>) -> Vec<String> {
    match r {
        Err(IdError::BrokersUnavailable { failures }) => {
            failures.into_iter().map(|f| f.reason).collect()
        }
        other => panic!("expected BrokersUnavailable, got {other:?}"),
    }
}

/// A typed error a broker answers with: it reached too few nodes.
fn no_quorum() -> IdError {
    IdError::NoQuorum {
        needed: 3,
        reachable: 1,
        accepted: Some(1),
        total: 5,
        failures: Vec::new(),
    }
}

/// Asks `b` alone (with `config`) for one ID, which it never answers well: the request
/// is resent on new connections (at least once) until the deadline makes it
/// unavailable. Returns the reasons given.
async fn resent_until_unavailable(b: &FakeBroker, config: BrokerClientConfig) -> Vec<String> {
    let before = b.requests();
    let c = client(&[b], config).await;
    let reasons = unavailable_reasons(c.next_ids(1).await);
    assert!(b.requests() - before >= 2, "{}", b.requests());
    reasons
}

/// Plenty: failover tests must not depend on how fast the machine is.
const LONG: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_refused_connect_is_reported_once_with_its_cause() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let config = BrokerClientConfig {
        deadline: Duration::from_millis(200),
        ..Default::default()
    };
    let e = BrokerClient::connect(vec![addr.clone()], config)
        .await
        .expect_err("nothing listens there");
    let text = e.to_string();
    assert_eq!(text.matches("no broker reachable").count(), 1, "{text}");
    assert_eq!(text.matches(addr.as_str()).count(), 1, "{text}");
    assert!(text.contains("refused"), "{text}");
}

#[tokio::test]
async fn normal_replies_are_returned_in_order() {
    let b = FakeBroker::start(Script::Normal).await;
    let c = client(&[&b], config(LONG)).await;
    assert_eq!(c.next_ids(3).await.expect("ids"), IdRange { lo: 1, hi: 3 });
    assert_eq!(c.next_id().await.expect("id"), 4);
    assert!(matches!(c.next_ids(0).await, Err(IdError::BadRequest(_))));
    // Above the broker's max_count (from its Welcome): refused without asking it.
    assert!(matches!(
        c.next_ids(1001).await,
        Err(IdError::BadRequest(_))
    ));
    assert_eq!((b.conns(), b.requests()), (1, 2));
}

#[tokio::test]
async fn refused_handshake_is_unavailable_and_the_next_broker_is_used() {
    let refuser = FakeBroker::start(Script::RefuseHello).await;
    let addrs = vec![refuser.addr.clone()];
    let r = BrokerClient::connect(addrs, config(Duration::from_millis(300))).await;
    let reasons = unavailable_reasons(r);
    // The last pass's reason (or, if the deadline cut a pass short, that).
    assert!(
        reasons
            .iter()
            .all(|r| r.contains("handshake refused: go away") || r.contains("no handshake")),
        "{reasons:?}"
    );
    assert!(refuser.conns() >= 1);
    let good = FakeBroker::start(Script::Normal).await;
    let c = client(&[&refuser, &good], config(LONG)).await;
    assert_eq!(c.next_ids(2).await.expect("ids"), IdRange { lo: 1, hi: 2 });
    assert_eq!(good.requests(), 1);
}

/// A reply nobody waits for (its caller gave up, or a confused broker) is dropped;
/// the connection stays and the real reply reaches its caller.
#[tokio::test]
async fn a_reply_for_an_unknown_request_is_dropped() {
    let b = FakeBroker::start(Script::UnknownIdFirst).await;
    let c = client(&[&b], config(LONG)).await;
    assert_eq!(c.next_ids(2).await.expect("ids"), IdRange { lo: 1, hi: 2 });
    assert_eq!(c.next_ids(1).await.expect("ids"), IdRange { lo: 3, hi: 3 });
    assert_eq!(
        b.conns(),
        1,
        "the stray reply must not break the connection"
    );
}

/// An undecodable frame breaks the connection; the request is resent on a new one
/// (to the second broker), never answered from the garbage.
#[tokio::test]
async fn a_garbage_frame_breaks_the_connection_and_fails_over() {
    let bad = FakeBroker::start(Script::Garbage).await;
    let good = FakeBroker::start(Script::Normal).await;
    let c = client(&[&bad, &good], config(LONG)).await;
    assert_eq!(c.next_ids(4).await.expect("ids"), IdRange { lo: 1, hi: 4 });
    assert_eq!((bad.requests(), good.requests()), (1, 1));

    // With nowhere else to go: resent on new connections, then unavailable at the
    // deadline, saying what was read (or, if the deadline fell while a resent
    // request was out, that no reply came).
    let reasons = resent_until_unavailable(&bad, config(Duration::from_secs(2))).await;
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("undecodable") || r.contains("no reply within")),
        "{reasons:?}"
    );
}

/// A reply that stops halfway breaks the connection at the frame timeout, and the
/// request goes to the second broker well within its deadline.
#[tokio::test]
async fn a_half_sent_reply_times_out_and_fails_over() {
    let stuck = FakeBroker::start(Script::HalfFrame).await;
    let good = FakeBroker::start(Script::Normal).await;
    let config = BrokerClientConfig {
        frame_timeout: Duration::from_millis(200),
        ..config(LONG)
    };
    let c = client(&[&stuck, &good], config.clone()).await;
    assert_eq!(c.next_ids(1).await.expect("ids"), IdRange { lo: 1, hi: 1 });
    assert_eq!((stuck.requests(), good.requests()), (1, 1));

    // Alone, the stuck broker costs the caller its deadline; meanwhile every frame
    // timeout breaks the connection and the request is resent on a new one
    // (without the frame timeout it would wait on the first one: 1 request).
    let config = BrokerClientConfig {
        deadline: Duration::from_secs(3),
        ..config
    };
    resent_until_unavailable(&stuck, config).await;
}

/// A connection closed with the request unanswered: outcome unknown, so the request
/// is resent as a new one elsewhere; with no other broker, the error says so.
#[tokio::test]
async fn a_close_mid_request_fails_over_to_the_second_broker() {
    let closer = FakeBroker::start(Script::CloseOnRequest).await;
    let good = FakeBroker::start(Script::Normal).await;
    let c = client(&[&closer, &good], config(LONG)).await;
    assert_eq!(c.next_ids(5).await.expect("ids"), IdRange { lo: 1, hi: 5 });
    assert_eq!((closer.requests(), good.requests()), (1, 1));
    // The next call starts at the broker that worked.
    assert_eq!(c.next_ids(1).await.expect("ids"), IdRange { lo: 6, hi: 6 });
    assert_eq!(closer.requests(), 1);

    let reasons = resent_until_unavailable(&closer, config(Duration::from_secs(2))).await;
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("broker closed the connection") || r.contains("no reply within")),
        "{reasons:?}"
    );
}

/// A broker's typed error is final (it already retried): returned as is, not
/// resent. Only `BrokersUnavailable` (shutting down, never started) fails over.
#[tokio::test]
async fn typed_errors_are_returned_and_only_shutdown_fails_over() {
    let no_quorum = no_quorum();
    let b = FakeBroker::start(Script::Fail(no_quorum.clone())).await;
    let good = FakeBroker::start(Script::Normal).await;
    let c = client(&[&b, &good], config(LONG)).await;
    assert_eq!(c.next_ids(1).await, Err(no_quorum));
    assert_eq!((b.requests(), good.requests()), (1, 0));

    let draining = IdError::BrokersUnavailable {
        failures: vec![NodeFailure {
            addr: "broker".into(),
            reason: "shutting down".into(),
        }],
    };
    let b = FakeBroker::start(Script::Fail(draining)).await;
    let c = client(&[&b, &good], config(LONG)).await;
    assert_eq!(c.next_ids(2).await.expect("ids"), IdRange { lo: 1, hi: 2 });
    assert_eq!((b.requests(), good.requests()), (1, 1));
}

/// A follower's redirect sends the request, and every later one, to the leader.
#[tokio::test]
async fn a_redirect_moves_the_client_to_the_leader() {
    let leader = FakeBroker::start(Script::Normal).await;
    let follower = FakeBroker::start(Script::Redirect(Some(leader.addr.clone()))).await;
    let c = client(&[&follower, &leader], config(LONG)).await;
    assert_eq!(c.next_ids(2).await.expect("ids"), IdRange { lo: 1, hi: 2 });
    for k in 0..5 {
        let lo = 3 + 2 * k;
        assert_eq!(
            c.next_ids(2).await.expect("ids"),
            IdRange { lo, hi: lo + 1 }
        );
    }
    assert_eq!((follower.requests(), leader.requests()), (1, 6));
}

/// The redirect goes to the broker it names, not merely the next one; a leader not
/// in the list that cannot be reached sends the client on to the broker after the
/// one that redirected (as if the redirect had not been followed).
#[tokio::test]
async fn a_redirect_goes_to_the_named_broker_or_on_if_unreachable() {
    let leader = FakeBroker::start(Script::Normal).await;
    let other = FakeBroker::start(Script::Normal).await;
    let follower = FakeBroker::start(Script::Redirect(Some(leader.addr.clone()))).await;
    let c = client(&[&follower, &other, &leader], config(LONG)).await;
    assert_eq!(c.next_ids(1).await.expect("ids"), IdRange { lo: 1, hi: 1 });
    assert_eq!((other.requests(), leader.requests()), (0, 1));

    let good = FakeBroker::start(Script::Normal).await;
    let stranger = "192.0.2.1:7400".to_string();
    let follower = FakeBroker::start(Script::Redirect(Some(stranger))).await;
    let c = client(&[&follower, &good], config(LONG)).await;
    assert_eq!(c.next_ids(1).await.expect("ids"), IdRange { lo: 1, hi: 1 });
    assert_eq!((follower.requests(), good.requests()), (1, 1));
}

/// One address, a follower's: the client follows the redirect to the leader it was
/// not given, and keeps its connection there (pooled: one connection for every
/// request after the redirect).
#[tokio::test]
async fn a_leader_outside_the_list_is_followed_and_kept() {
    let leader = FakeBroker::start(Script::Normal).await;
    let follower = FakeBroker::start(Script::Redirect(Some(leader.addr.clone()))).await;
    let c = client(&[&follower], config(LONG)).await;
    for k in 0..10 {
        let lo = 1 + 2 * k;
        assert_eq!(
            c.next_ids(2).await.expect("ids"),
            IdRange { lo, hi: lo + 1 }
        );
    }
    assert_eq!((follower.requests(), leader.requests()), (1, 10));
    assert_eq!(leader.conns(), 1);
    assert_eq!(c.learned(), vec![leader.addr.clone()]);
}

/// `closed_list`: a leader outside the list is never connected to; the request fails
/// saying so, and how to allow it.
#[tokio::test]
async fn a_closed_list_refuses_a_leader_outside_it() {
    let leader = FakeBroker::start(Script::Normal).await;
    let follower = FakeBroker::start(Script::Redirect(Some(leader.addr.clone()))).await;
    let closed = BrokerClientConfig {
        closed_list: true,
        ..config(Duration::from_millis(400))
    };
    let c = client(&[&follower], closed).await;
    let reasons = unavailable_reasons(c.next_ids(1).await);
    let want = format!(
        "the leader {} is not among the --broker addresses",
        leader.addr
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains(&want) && r.contains("--broker-closed-list")),
        "{reasons:?}"
    );
    assert_eq!((leader.conns(), leader.requests()), (0, 0));
    assert!(c.learned().is_empty());
}

/// Two brokers naming each other (A says B, B says A): each request stops after
/// [`MAX_REDIRECTS`] redirects with an error naming the path, long before its
/// deadline, whether the brokers are listed or learned.
#[tokio::test]
async fn a_redirect_loop_is_bounded_per_request() {
    // Listed: both in the list.
    let (la, lb) = (fake_listener().await, fake_listener().await);
    let (a_addr, b_addr) = (addr_of(&la), addr_of(&lb));
    let a = FakeBroker::serve_on(la, Script::Redirect(Some(b_addr.clone())));
    let b = FakeBroker::serve_on(lb, Script::Redirect(Some(a_addr.clone())));
    for listed in [vec![&a, &b], vec![&a]] {
        let c = client(&listed, config(LONG)).await;
        for _ in 0..3 {
            let before = a.requests() + b.requests();
            let reasons = unavailable_reasons(c.next_ids(1).await);
            let asked = a.requests() + b.requests() - before;
            assert_eq!(asked, MAX_REDIRECTS + 1, "{reasons:?}");
            let path = [&a_addr, &b_addr].map(|s| s.as_str());
            assert!(
                reasons
                    .iter()
                    .any(|r| r.contains("redirected 4 times in one request")
                        && path.iter().all(|p| r.contains(p))),
                "{reasons:?}"
            );
        }
    }
}

/// "No leader known" (an election under way): the request goes to another broker.
#[tokio::test]
async fn no_known_leader_moves_on_to_the_next_broker() {
    let electing = FakeBroker::start(Script::Redirect(None)).await;
    let good = FakeBroker::start(Script::Normal).await;
    let c = client(&[&electing, &good], config(LONG)).await;
    assert_eq!(c.next_ids(3).await.expect("ids"), IdRange { lo: 1, hi: 3 });
    assert_eq!((electing.requests(), good.requests()), (1, 1));
}

/// While no broker leads, a request waits (pausing between tries) until its deadline,
/// then fails saying why; it never spins: tries are bounded by the backoff.
#[tokio::test]
async fn without_a_leader_a_request_fails_at_its_deadline_saying_why() {
    let a = FakeBroker::start(Script::Redirect(None)).await;
    let b = FakeBroker::start(Script::Redirect(None)).await;
    let c = client(&[&a, &b], config(Duration::from_millis(400))).await;
    let reasons = unavailable_reasons(c.next_ids(1).await);
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    for r in &reasons {
        assert!(r.contains("no leader known"), "{r}");
    }
    assert!(a.requests() >= 1 && b.requests() >= 1);
    // 400 ms with pauses doubling from 5 ms up to 200 ms: a few dozen tries at most.
    assert!(
        a.requests() + b.requests() < 100,
        "{}",
        a.requests() + b.requests()
    );
}

/// A reply with the wrong number of IDs is a protocol error, never a range.
#[tokio::test]
async fn a_wrong_count_is_a_protocol_error() {
    let b = FakeBroker::start(Script::WrongCount).await;
    let c = client(&[&b], config(LONG)).await;
    match c.next_ids(3).await {
        Err(IdError::Protocol { addr, reason }) => {
            assert_eq!(addr, b.addr);
            assert!(reason.contains("unexpected reply"), "{reason}");
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[tokio::test]
async fn stats_are_fetched_and_a_refusal_is_an_error() {
    let refuser = FakeBroker::start(Script::RefuseHello).await;
    match fetch_stats(&refuser.addr).await {
        Err(IdError::Protocol { reason, .. }) => {
            assert!(reason.contains("go away"), "{reason}")
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

/// Callers waiting in the coalescing queue.
fn queued(c: &BrokerClient) -> usize {
    // Callers that joined and are not answered yet (the tests' runtime has one
    // thread, and a caller joins in one poll).
    let q = c.queue.as_ref().expect("coalescing is on");
    COALESCE_QUEUE - q.room.available_permits()
}

/// Waits (polling) until `cond` holds: testkit's one wait, for a plain condition.
#[track_caller]
fn wait_for(what: &str, cond: impl Fn() -> bool) -> impl std::future::Future<Output = ()> {
    testkit::wait_for_async(
        what,
        testkit::WAIT_LIMIT,
        move || std::future::ready(cond()),
    )
}

type Call = tokio::task::JoinHandle<Result<IdRange, IdError>>;

fn call(c: &BrokerClient, n: u64, deadline: Duration) -> Call {
    let c = c.clone();
    tokio::spawn(async move { c.next_ids_until(n, Instant::now() + deadline).await })
}

/// A client with one request out at a time, and a first caller whose request the
/// gated broker holds: callers after it queue up in a known order.
async fn one_out(b: &FakeBroker) -> (BrokerClient, Call) {
    let config = BrokerClientConfig {
        in_flight: 1,
        ..config(LONG)
    };
    let c = client(&[b], config).await;
    let first = call(&c, 1, LONG);
    wait_for("the first request reached the broker", || b.requests() == 1).await;
    (c, first)
}

/// Queues callers for `counts` one after another (each queued before the next
/// calls), with deadline `deadline`.
async fn queue_up(c: &BrokerClient, counts: &[u64], deadline: Duration) -> Vec<Call> {
    let mut calls = Vec::new();
    for &n in counts {
        let before = queued(c);
        calls.push(call(c, n, deadline));
        wait_for("the caller is queued", || queued(c) == before + 1).await;
    }
    calls
}

async fn outcome(call: Call) -> Result<IdRange, IdError> {
    call.await.expect("caller task")
}

/// Asserts that `calls`, for `counts` IDs each, got consecutive ranges from `lo` on,
/// in order.
async fn assert_consecutive(mut lo: u64, counts: &[u64], calls: Vec<Call>) {
    for (n, call) in counts.iter().zip(calls) {
        assert_eq!(outcome(call).await, Ok(IdRange { lo, hi: lo + n - 1 }));
        lo += n;
    }
}

/// Ten callers queued behind a request go out as ONE request for their total, and
/// get consecutive ranges in queue order.
#[tokio::test]
async fn queued_callers_go_as_one_request_split_in_queue_order() {
    let (b, gate) = FakeBroker::start_gated(Script::Normal).await;
    let (c, first) = one_out(&b).await;
    let counts: Vec<u64> = (1..=10).collect();
    let calls = queue_up(&c, &counts, LONG).await;
    gate.add_permits(100);
    assert_eq!(outcome(first).await, Ok(IdRange { lo: 1, hi: 1 }));
    assert_consecutive(2, &counts, calls).await;
    assert_eq!(b.requests(), 2, "11 callers, 2 wire requests");
    let seen = c.coalescing();
    assert_eq!((seen.requests, seen.callers), (2, 11));
}

/// A caller whose deadline passes while queued gets `Deadline` and is never sent; one
/// whose deadline passes while its coalesced request is out gets `Deadline` at its
/// own deadline, its share burned; the caller beside it still gets its IDs.
#[tokio::test]
async fn a_caller_past_its_deadline_gets_deadline_the_others_get_ids() {
    let (b, gate) = FakeBroker::start_gated(Script::Normal).await;
    let (c, first) = one_out(&b).await;
    let mut calls = queue_up(&c, &[1], Duration::from_secs(2)).await;
    let short = queue_up(&c, &[1], Duration::from_millis(100)).await;
    calls.extend(queue_up(&c, &[1], LONG).await);
    let [short] = <[Call; 1]>::try_from(short).expect("one call");
    assert!(matches!(
        outcome(short).await,
        Err(IdError::Deadline { rounds: 0, .. })
    ));
    // The first reply lets the two live callers go, as one request; the broker
    // holds it past the first one's deadline.
    gate.add_permits(1);
    assert_eq!(outcome(first).await, Ok(IdRange { lo: 1, hi: 1 }));
    wait_for("the coalesced request reached the broker", || {
        b.requests() == 2
    })
    .await;
    let [expiring, patient] = <[Call; 2]>::try_from(calls).expect("two calls");
    assert!(matches!(
        outcome(expiring).await,
        Err(IdError::Deadline { rounds: 0, .. })
    ));
    gate.add_permits(100);
    // ID 2 was the expired caller's share: a hole. The one never sent cost nothing.
    assert_eq!(outcome(patient).await, Ok(IdRange { lo: 3, hi: 3 }));
    assert_eq!(c.next_ids(1).await, Ok(IdRange { lo: 4, hi: 4 }));
    assert_eq!(b.requests(), 3);
}

/// A caller whose future is dropped while it is queued is left out of the next
/// request: no ID is asked for it, so it leaves no hole.
#[tokio::test]
async fn a_caller_dropped_while_queued_is_left_out() {
    let (b, gate) = FakeBroker::start_gated(Script::Normal).await;
    let (c, first) = one_out(&b).await;
    let calls = queue_up(&c, &[1, 5, 1], LONG).await;
    let [before, dropped, after] = <[Call; 3]>::try_from(calls).expect("three calls");
    dropped.abort();
    assert!(dropped.await.expect_err("aborted").is_cancelled());
    gate.add_permits(100);
    assert_eq!(outcome(first).await, Ok(IdRange { lo: 1, hi: 1 }));
    assert_eq!(outcome(before).await, Ok(IdRange { lo: 2, hi: 2 }));
    assert_eq!(outcome(after).await, Ok(IdRange { lo: 3, hi: 3 }));
    assert_eq!(b.requests(), 2);
}

/// A queue holding more than the broker's `max_count` (1000 here) goes out as
/// several requests, none above it, still in queue order.
#[tokio::test]
async fn a_queue_above_max_count_is_split_into_several_requests() {
    let (b, gate) = FakeBroker::start_gated(Script::Normal).await;
    let (c, first) = one_out(&b).await;
    let counts = [600, 600, 300, 1000];
    let calls = queue_up(&c, &counts, LONG).await;
    gate.add_permits(100);
    assert_eq!(outcome(first).await, Ok(IdRange { lo: 1, hi: 1 }));
    assert_consecutive(2, &counts, calls).await;
    // [1], [600], [600, 300], [1000].
    assert_eq!(b.requests(), 4);
}

/// Every caller of a failed coalesced request gets its error.
#[tokio::test]
async fn every_caller_of_a_failed_request_gets_the_error() {
    let no_quorum = no_quorum();
    let (b, gate) = FakeBroker::start_gated(Script::Fail(no_quorum.clone())).await;
    let (c, first) = one_out(&b).await;
    let calls = queue_up(&c, &[1, 2, 3], LONG).await;
    gate.add_permits(100);
    assert_eq!(outcome(first).await, Err(no_quorum.clone()));
    for call in calls {
        assert_eq!(outcome(call).await, Err(no_quorum.clone()));
    }
    assert_eq!(b.requests(), 2);
}

/// A connection attempt cut short by the request's deadline keeps the cause an
/// earlier attempt on the same broker saw.
#[test]
fn a_cut_attempt_keeps_the_earlier_cause() {
    let f = |addr: &str, reason: &str| NodeFailure {
        addr: addr.into(),
        reason: reason.into(),
    };
    let mut failures = vec![f("a", "broker a refused the token")];
    note_cut(&mut failures, f("a", "no handshake within 3ms"));
    note_cut(&mut failures, f("a", "no handshake within 1ms"));
    note_cut(&mut failures, f("b", "no handshake within 2ms"));
    let reasons: Vec<&str> = failures.iter().map(|f| f.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "broker a refused the token (the last attempt: no handshake within 3ms)",
            "no handshake within 2ms",
        ]
    );
}

/// With `in_flight` 0 every call is its own request, as before coalescing.
#[tokio::test]
async fn in_flight_zero_sends_every_call_alone() {
    let b = FakeBroker::start(Script::Normal).await;
    let config = BrokerClientConfig {
        in_flight: 0,
        ..config(LONG)
    };
    let c = client(&[&b], config).await;
    let calls: Vec<Call> = (0..8).map(|_| call(&c, 1, LONG)).collect();
    let mut ids = Vec::new();
    for call in calls {
        ids.push(outcome(call).await.expect("ids").lo);
    }
    ids.sort_unstable();
    assert_eq!(ids, (1..=8).collect::<Vec<u64>>());
    assert_eq!(b.requests(), 8);
    assert_eq!(c.coalescing(), Coalescing::default());
}

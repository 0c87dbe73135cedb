//! `QuorumClient`'s combined rounds without Redis: one scripted fake node (register and
//! rendezvous) whose `join` and `close` answers each test chooses, on tokio's paused
//! clock. Checks the ranges a leader, a member, a leader of an open batch and the
//! fallbacks (a vanished leader, an expired batch, a failed batch, a short batch) end
//! with, and the client's counters.

use futures::stream::BoxStream;
use idclient::{
    Close, Combine, Counters, IdRange, IdSource, Join, Leases, NodeError, Nonce, Protocol,
    QuorumClient, Register, Rendezvous, WriteOutcome, WriteReply,
};
use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;

const KEY: &str = "k";
const DEADLINE: Duration = Duration::from_secs(5);

/// What the fake's rendezvous answers to `join`, and a message it publishes on the
/// results channel right after (as another client's leader would).
struct Scripted {
    join: Join,
    publish: Option<String>,
}

#[derive(Default)]
struct State {
    register: u64,
    joins: VecDeque<Scripted>,
    closes: VecDeque<Close>,
    /// Every `join`'s arguments: (n, leases).
    joined: Vec<(u64, Leases)>,
    /// Every `close`'s nonce.
    closed: Vec<Nonce>,
    /// Every `finish`: (nonce, message).
    finished: Vec<(Nonce, String)>,
    subscribers: Vec<mpsc::UnboundedSender<String>>,
    /// How long each `join` takes to answer (a loaded or paused node).
    join_delay: Duration,
    /// Whether the node publishes other batches' results while a `join` waits (a node
    /// that is slow but runs scripts), or nothing (a paused node).
    busy_while_slow: bool,
    /// How many `join`s (the next ones) end with the node's reply timeout after their
    /// delay instead of an answer.
    join_timeouts: u32,
}

/// While a slow `join` waits, the fake publishes another batch's result this often.
const BUSY_EVERY: Duration = Duration::from_millis(20);

/// One node: an honest register and a scripted rendezvous. Cheap to clone (shared state).
#[derive(Clone, Default)]
struct Fake(Arc<Mutex<State>>);

impl Fake {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().expect("fake state lock")
    }

    fn script_join(&self, join: Join, publish: Option<String>) {
        self.state().joins.push_back(Scripted { join, publish });
    }

    /// Scripts a `join` that makes the caller a member of `batch` at `offset`, its
    /// leader's lease ending in `wait`; that leader then publishes `result` ("LO HI" or
    /// "failed") for the batch, or nothing.
    fn follow(&self, batch: Nonce, offset: u64, wait: Duration, result: Option<&str>) {
        let publish = result.map(|r| format!("{batch} {r}"));
        self.script_join(
            Join::Follow {
                batch,
                offset,
                wait,
            },
            publish,
        );
    }

    /// Scripts a `join` that makes the caller the leader of an open batch while batch
    /// `busy` is in flight for up to `wait`; `busy`'s leader then publishes `result`.
    fn lead(&self, busy: Nonce, wait: Duration, result: &str) {
        self.script_join(Join::Lead { busy, wait }, Some(format!("{busy} {result}")));
    }

    /// Scripts a `join` that puts the caller's request alone in flight.
    fn solo(&self) {
        self.script_join(Join::Solo, None);
    }

    fn script_close(&self, close: Close) {
        self.state().closes.push_back(close);
    }

    fn publish(state: &mut State, message: &str) {
        state
            .subscribers
            .retain(|tx| tx.send(message.to_string()).is_ok());
    }
}

impl Register for Fake {
    fn addr(&self) -> &str {
        "fake://0"
    }

    fn conditional_write(
        &self,
        _key: &str,
        lo: u64,
        hi: u64,
        _batch: Option<Nonce>,
    ) -> impl Future<Output = Result<WriteOutcome, NodeError>> + Send {
        let mut s = self.state();
        let reply = if s.register < lo {
            s.register = hi;
            WriteReply::Accepted
        } else {
            WriteReply::Rejected {
                current: s.register,
            }
        };
        std::future::ready(Ok(WriteOutcome {
            reply,
            combining: false,
        }))
    }

    fn read(&self, _key: &str) -> impl Future<Output = Result<u64, NodeError>> + Send {
        std::future::ready(Ok(self.state().register))
    }

    fn warm_up(&self) -> impl Future<Output = Result<(), NodeError>> + Send {
        std::future::ready(Ok(()))
    }
}

impl Rendezvous for Fake {
    fn join(
        &self,
        _key: &str,
        n: u64,
        _nonce: Nonce,
        leases: Leases,
    ) -> impl Future<Output = Result<Join, NodeError>> + Send {
        let fake = self.clone();
        async move {
            let (delay, busy) = {
                let s = fake.state();
                (s.join_delay, s.busy_while_slow)
            };
            let mut waited = Duration::ZERO;
            while waited < delay {
                let step = BUSY_EVERY.min(delay - waited);
                tokio::time::sleep(step).await;
                waited += step;
                if busy {
                    Fake::publish(&mut fake.state(), &format!("{} failed", batch(0x07e4)));
                }
            }
            let mut s = fake.state();
            s.joined.push((n, leases));
            if s.join_timeouts > 0 {
                s.join_timeouts -= 1;
                return Err(NodeError::Unavailable("timed out".to_string()));
            }
            match s.joins.pop_front() {
                Some(Scripted { join, publish }) => {
                    if let Some(message) = publish {
                        Fake::publish(&mut s, &message);
                    }
                    Ok(join)
                }
                None => Err(NodeError::Unavailable("no join scripted".to_string())),
            }
        }
    }

    fn close(
        &self,
        _key: &str,
        nonce: Nonce,
        _lease: Duration,
    ) -> impl Future<Output = Result<Close, NodeError>> + Send {
        let mut s = self.state();
        s.closed.push(nonce);
        let result = s
            .closes
            .pop_front()
            .ok_or_else(|| NodeError::Unavailable("no close scripted".to_string()));
        std::future::ready(result)
    }

    fn finish(
        &self,
        _key: &str,
        nonce: Nonce,
        message: String,
    ) -> impl Future<Output = Result<(), NodeError>> + Send {
        let mut s = self.state();
        Fake::publish(&mut s, &message);
        s.finished.push((nonce, message));
        std::future::ready(Ok(()))
    }

    fn subscribe(
        &self,
        _key: &str,
    ) -> impl Future<Output = Result<BoxStream<'static, String>, NodeError>> + Send {
        let (tx, rx) = mpsc::unbounded_channel();
        self.state().subscribers.push(tx);
        let stream =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        std::future::ready(Ok(Box::pin(stream) as BoxStream<'static, String>))
    }
}

/// A client over the one fake node that combines from its first request on.
fn client(fake: &Fake) -> QuorumClient<Fake> {
    QuorumClient::with_nodes(vec![fake.clone()], KEY, Protocol::Fast, DEADLINE)
        .expect("one node, a key: a valid client")
        .with_combine(Combine::Always)
        .with_jitter_seed(7)
}

fn range(lo: u64, hi: u64) -> IdRange {
    IdRange { lo, hi }
}

/// A batch name as the rendezvous would hand it out.
fn batch(n: u128) -> Nonce {
    Nonce(n)
}

#[track_caller]
fn assert_counters(c: &QuorumClient<Fake>, rounds: u64, batches: u64, combined: u64) {
    let got = c.counters();
    assert_eq!(
        (got.rounds, got.batches, got.combined, got.errors),
        (rounds, batches, combined, 0),
        "rounds, batches, combined, errors in {got:?}"
    );
}

/// Asserts that the one batch finished published `lo..=hi`; returns the batch's nonce.
#[track_caller]
fn assert_finished_once(s: &State, lo: u64, hi: u64) -> Nonce {
    assert_eq!(s.finished.len(), 1);
    let (nonce, message) = &s.finished[0];
    assert_eq!(message, &format!("{nonce} {lo} {hi}"));
    *nonce
}

#[tokio::test(start_paused = true)]
async fn a_solo_batch_runs_its_own_round_and_publishes_it() {
    let fake = Fake::default();
    fake.solo();
    let c = client(&fake);
    assert_eq!(c.next_ids(5).await, Ok(range(1, 5)));
    assert_counters(&c, 1, 1, 0);
    let s = fake.state();
    assert_eq!(s.register, 5);
    assert_eq!(s.joined.len(), 1);
    assert_eq!(s.joined[0].0, 5);
    assert_finished_once(&s, 1, 5);
}

#[tokio::test(start_paused = true)]
async fn a_member_takes_its_offset_of_the_published_range() {
    let fake = Fake::default();
    // Another client's leader publishes IDs 11..=30; this member joined at offset 5.
    fake.follow(batch(0xb), 5, Duration::from_millis(50), Some("11 30"));
    let c = client(&fake);
    assert_eq!(c.next_ids(3).await, Ok(range(16, 18)));
    assert_counters(&c, 0, 0, 1);
    // The member learned the register's progress from the result: its next guess is 31.
    fake.state().register = 30;
    fake.solo();
    assert_eq!(c.next_ids(1).await, Ok(range(31, 31)));
    assert_counters(&c, 1, 1, 1);
}

#[tokio::test(start_paused = true)]
async fn the_leader_of_an_open_batch_reserves_it_all_and_takes_offset_zero() {
    let fake = Fake::default();
    // The batch in flight ends: its leader publishes 1..=10.
    fake.lead(batch(0xbe5), Duration::from_millis(20), "1 10");
    // Members joined the open batch meanwhile: 4 IDs ours, 6 theirs.
    fake.script_close(Close::Closed { ids: 10 });
    let c = client(&fake);
    assert_eq!(c.next_ids(4).await, Ok(range(11, 14)));
    assert_counters(&c, 1, 1, 0);
    let s = fake.state();
    assert_eq!(s.register, 20, "the whole batch is reserved");
    assert_eq!(s.closed.len(), 1);
    let nonce = assert_finished_once(&s, 11, 20);
    assert_eq!(nonce, s.closed[0], "finishes the batch it closed");
}

#[tokio::test(start_paused = true)]
async fn a_member_whose_leader_vanishes_joins_again_after_the_lease() {
    let fake = Fake::default();
    // The leader's lease ends in 30 ms and nothing is ever published.
    fake.follow(batch(0xdead), 0, Duration::from_millis(30), None);
    fake.solo();
    let c = client(&fake);
    let started = tokio::time::Instant::now();
    assert_eq!(c.next_ids(2).await, Ok(range(1, 2)));
    // Virtual time: the member waited out the lease (plus a grace), not its deadline.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(30) && waited < DEADLINE,
        "{waited:?}"
    );
    assert_counters(&c, 1, 1, 0);
    assert_eq!(fake.state().joined.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_open_batch_expired_joins_again() {
    let fake = Fake::default();
    fake.lead(batch(0xbe5), Duration::from_millis(5), "failed");
    fake.script_close(Close::Gone);
    fake.solo();
    let c = client(&fake);
    assert_eq!(c.next_ids(3).await, Ok(range(1, 3)));
    assert_counters(&c, 1, 1, 0);
    let s = fake.state();
    assert_eq!((s.joined.len(), s.closed.len()), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn a_failed_batch_sends_its_members_to_their_own_rounds() {
    let fake = Fake::default();
    fake.follow(batch(0xfa11), 0, Duration::from_millis(50), Some("failed"));
    let c = client(&fake);
    assert_eq!(c.next_ids(2).await, Ok(range(1, 2)));
    assert_counters(&c, 1, 0, 0);
    assert!(
        fake.state().finished.is_empty(),
        "no batch led, none finished"
    );
}

#[tokio::test(start_paused = true)]
async fn a_result_that_does_not_cover_a_member_is_not_taken() {
    let fake = Fake::default();
    // The member's offset 8 plus 5 IDs lie outside 1..=10.
    fake.follow(batch(0xc0), 8, Duration::from_millis(50), Some("1 10"));
    fake.solo();
    let c = client(&fake);
    // Learned 10 from the result, so its own batch starts above it.
    assert_eq!(c.next_ids(5).await, Ok(range(11, 15)));
    assert_counters(&c, 1, 1, 0);
}

#[tokio::test(start_paused = true)]
async fn a_short_batch_is_not_led_and_the_rendezvous_is_left_alone() {
    let fake = Fake::default();
    fake.lead(batch(0xbe5), Duration::from_millis(5), "1 1");
    // The rendezvous says the batch holds fewer IDs than this leader's own share.
    fake.script_close(Close::Closed { ids: 3 });
    let c = client(&fake);
    assert_eq!(c.next_ids(4).await, Ok(range(2, 5)));
    assert_counters(&c, 1, 0, 0);
    // The rendezvous counts as failed: the next request runs its own round at once.
    assert_eq!(c.next_ids(1).await, Ok(range(6, 6)));
    let s = fake.state();
    assert_eq!((s.joined.len(), s.closed.len()), (1, 1));
    assert!(s.finished.is_empty());
    drop(s);
    assert_counters(&c, 2, 0, 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_batch_runs_an_ordinary_round() {
    let fake = Fake::default();
    fake.script_join(Join::Full, None);
    let c = client(&fake);
    assert_eq!(c.next_ids(7).await, Ok(range(1, 7)));
    let got: Counters = c.counters();
    assert_eq!((got.requests, got.rounds, got.batches), (1, 1, 0));
}

/// The issue 47 stall: a rendezvous node that answers, only slower than the patience
/// (two leases: 50 ms for a client that has not timed a round yet), because its queue
/// of joins is long or its CPU starved, while it keeps publishing other batches' results.
/// Counting it failed sent every client of a loaded quorum to the fallback, equally
/// loaded, then to contended rounds of their own for a second: the collapse. The client
/// must wait for the answer and go on combining.
#[tokio::test(start_paused = true)]
async fn a_slow_rendezvous_that_publishes_is_waited_for_not_left() {
    let fake = Fake::default();
    {
        let mut s = fake.state();
        s.join_delay = Duration::from_millis(200);
        s.busy_while_slow = true;
    }
    fake.solo();
    fake.solo();
    let c = client(&fake);
    assert_eq!(c.next_ids(2).await, Ok(range(1, 2)));
    // Still combining: the next request joins too, instead of running its own round.
    assert_eq!(c.next_ids(1).await, Ok(range(3, 3)));
    let got = c.counters();
    assert_eq!(
        (
            got.batches,
            got.uncombined,
            got.to_own_rounds,
            got.rendezvous_slow
        ),
        (2, 0, 0, 0),
        "batches, uncombined, to own rounds, slow in {got:?}"
    );
    assert!(got.rendezvous_slow_alive >= 2, "{got:?}");
    assert_eq!(fake.state().joined.len(), 2);
}

/// A rendezvous node that answers nothing and publishes nothing (paused) still counts as
/// failed after the patience: the request runs its own round, and so does the next.
#[tokio::test(start_paused = true)]
async fn a_silent_rendezvous_is_left_after_its_patience() {
    let fake = Fake::default();
    fake.state().join_delay = Duration::from_secs(60);
    fake.solo();
    let c = client(&fake);
    let started = tokio::time::Instant::now();
    assert_eq!(c.next_ids(2).await, Ok(range(1, 2)));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(c.next_ids(1).await, Ok(range(3, 3)));
    let got = c.counters();
    assert_eq!(
        (
            got.batches,
            got.rendezvous_slow,
            got.to_own_rounds,
            got.uncombined
        ),
        (0, 1, 1, 2),
        "batches, slow, to own rounds, uncombined in {got:?}"
    );
    assert!(fake.state().joined.is_empty(), "no join ever answered");
}

/// Publishes another batch's result on `fake`'s channel every [`BUSY_EVERY`], as a busy
/// rendezvous does while other clients' batches finish.
fn keep_publishing(fake: &Fake) -> tokio::task::JoinHandle<()> {
    let fake = fake.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(BUSY_EVERY).await;
            Fake::publish(&mut fake.state(), &format!("{} failed", batch(0x07e4)));
        }
    })
}

/// The cause measured in issue 47 (scripts/bench-stall.sh): under load, leaders outlive
/// their leases, and a request whose waits ended twice without its batch's result left
/// the rendezvous as stuck, though it kept finishing other batches; hundreds of clients
/// then ran contended rounds of their own. A wait during which the rendezvous published
/// is no stall: the request joins again, as often as it takes, and keeps combining.
#[tokio::test(start_paused = true)]
async fn leaders_past_their_lease_at_a_busy_rendezvous_do_not_make_it_stuck() {
    let fake = Fake::default();
    let publisher = keep_publishing(&fake);
    for (n, nonce) in [0x51, 0x52, 0x53].into_iter().enumerate() {
        fake.follow(batch(nonce), n as u64, Duration::from_millis(30), None);
    }
    fake.solo();
    let c = client(&fake);
    assert_eq!(c.next_ids(1).await, Ok(range(1, 1)));
    publisher.abort();
    let got = c.counters();
    assert_eq!(
        (got.batches, got.rendezvous_stalls, got.rendezvous_left),
        (1, 3, 0),
        "batches, stalls, left in {got:?}"
    );
    assert_eq!((got.uncombined, got.to_own_rounds), (0, 0), "{got:?}");
    assert_eq!(fake.state().joined.len(), 4);
}

/// A rendezvous that publishes nothing while two leaders in a row outlive their leases
/// is stuck (a stray mark): the request leaves it for its own round. It is the only
/// rendezvous (or the fallback), so the client is not sent to own rounds for a while:
/// its next request combines again.
#[tokio::test(start_paused = true)]
async fn leaders_past_their_lease_at_a_silent_rendezvous_make_it_stuck() {
    let fake = Fake::default();
    fake.follow(batch(0x51), 0, Duration::from_millis(30), None);
    fake.follow(batch(0x52), 0, Duration::from_millis(30), None);
    fake.solo();
    let c = client(&fake);
    assert_eq!(c.next_ids(1).await, Ok(range(1, 1)));
    let got = c.counters();
    assert_eq!(
        (
            got.batches,
            got.rendezvous_left,
            got.uncombined,
            got.to_own_rounds
        ),
        (0, 1, 1, 0),
        "batches, left, uncombined, to own rounds in {got:?}"
    );
    assert_eq!(fake.state().joined.len(), 2);
    assert_eq!(c.next_ids(1).await, Ok(range(2, 2)));
    assert_eq!(c.counters().batches, 1, "combining again");
}

/// A join that meets the node's reply timeout while the node keeps publishing other
/// batches' results (what 512 callers on 2 loaded cores did to the rendezvous node in
/// issue 47: joins queued past 500 ms) is no failed rendezvous: the request joins again
/// at the same node, and does not move to the fallback or to rounds of its own.
#[tokio::test(start_paused = true)]
async fn a_join_past_the_reply_timeout_at_a_busy_rendezvous_joins_again() {
    let fake = Fake::default();
    {
        let mut s = fake.state();
        s.join_delay = Duration::from_millis(100);
        s.busy_while_slow = true;
        s.join_timeouts = 1;
    }
    fake.solo();
    let c = client(&fake);
    assert_eq!(c.next_ids(1).await, Ok(range(1, 1)));
    let got = c.counters();
    assert_eq!(
        (
            got.batches,
            got.uncombined,
            got.to_fallback,
            got.to_own_rounds
        ),
        (1, 0, 0, 0),
        "batches, uncombined, to fallback, to own rounds in {got:?}"
    );
    assert_eq!(
        (got.rendezvous_slow, got.rendezvous_errors),
        (0, 0),
        "{got:?}"
    );
    // Both joins outlived the 50 ms patience while the node published.
    assert_eq!(got.rendezvous_slow_alive, 2, "{got:?}");
    assert_eq!(fake.state().joined.len(), 2);
}

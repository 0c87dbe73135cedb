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
}

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
        let mut s = self.state();
        s.joined.push((n, leases));
        let result = match s.joins.pop_front() {
            Some(Scripted { join, publish }) => {
                if let Some(message) = publish {
                    Fake::publish(&mut s, &message);
                }
                Ok(join)
            }
            None => Err(NodeError::Unavailable("no join scripted".to_string())),
        };
        std::future::ready(result)
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

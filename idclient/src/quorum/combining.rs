//! Combined rounds (docs/idclient.md, "Contention: combined rounds"): under contention
//! requests share one round through a rendezvous node instead of racing each other.
//!
//! A small state machine per request: `join_step` joins and hands over to `follow` (a
//! member), `lead_open_batch` (the leader of an open batch) or `lead` (running the
//! batch), each of which answers with what comes next ([`Next`]). [`CombineState`] is
//! what the client keeps between requests: whether it combines, and where.

use super::counters::bump;
use super::{Combine, QuorumClient};
use crate::combine::{self, WaitEnd};
use crate::register::{NodeError, Register, Rendezvous};
use crate::rendezvous::{member_range, BatchResult, Close, Join, Leases, Nonce};
use crate::script::MAX_RENDEZVOUS_TTL_MS;
use crate::{IdError, IdRange, MovingAverage};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::broadcast::Receiver;
use tokio::time::Instant;

/// Solo batches in a row (no other client at the rendezvous) after which a client stops
/// combining and goes back to plain rounds.
pub const SOLO_STREAK: u32 = 16;

/// A batch leader's lease is this many measured round times (see `QuorumClient::lease`):
/// room for a few lost rounds and their backoff. A round that needs longer is in trouble,
/// and its members had better try on their own than wait for a leader that may be gone.
pub const LEASE_ROUNDS: u32 = 16;

/// The shortest lease: scheduling noise on a busy machine must not end healthy batches.
pub const MIN_LEASE: Duration = Duration::from_millis(25);

/// The longest lease unless set from the reply timeout (2x): a leader cut off from the
/// nodes keeps its members waiting no longer than one of its node replies could take.
pub const DEFAULT_MAX_LEASE: Duration = Duration::from_secs(1);

/// After the preferred rendezvous node failed (down, paused, unreachable, stuck), clients
/// combine at the fallback node for this long before they try it again; after both
/// failed, they run their own rounds for this long.
pub const RENDEZVOUS_RETRY: Duration = Duration::from_secs(1);

/// Rendezvous waits that ended without progress (a member's leader vanished, a batch
/// stayed in flight past its lease) one request tolerates before it runs its own rounds
/// and the client leaves the rendezvous alone for [`RENDEZVOUS_RETRY`]: one is a crashed
/// leader, two in a row a stuck rendezvous (a stray key, an overloaded node).
pub const MAX_STALLS: u32 = 2;

/// A rendezvous call (one script, no fsync) may take this many leases before the client
/// gives up on the rendezvous: a paused node must not hold requests for a reply timeout.
pub const RENDEZVOUS_PATIENCE_LEASES: u32 = 2;

/// A rendezvous call may also take this many of the rendezvous calls' own measured
/// times: under hundreds of callers the node's queue of joins, not the round, sets how
/// long a healthy reply takes, and a patience of rounds alone counted it failed.
pub const RENDEZVOUS_PATIENCE_CALLS: u32 = 8;

/// A leader polling `close` (its results subscription ended) waits at least this long
/// between calls, so a batch in flight without expiry cannot make it spin.
pub const MIN_POLL: Duration = Duration::from_millis(1);

/// The longest lease any client asks for, whatever its reply timeout: the rendezvous
/// script deletes keys that hold longer as stray (`script::MAX_RENDEZVOUS_TTL_MS`, 60 s).
pub const MAX_LEASE: Duration = Duration::from_secs(25);

// The rendezvous script keeps a key for at most MAX_RENDEZVOUS_TTL_MS; a batch lease
// (two leases) must fit, or the script would delete live batches as stray.
const _: () = assert!(MAX_LEASE.as_millis() * 2 <= MAX_RENDEZVOUS_TTL_MS as u128);

/// How long a member waits past its leader's lease before joining again: slack for the
/// time a reply takes to travel, not for the leader.
pub const LEADER_GRACE: Duration = Duration::from_millis(10);

/// Where a client combines. Every client on the same nodes prefers the same node, and
/// when it fails they all see it fail and move to the same fallback: combining goes on
/// through the failure instead of falling to contended own rounds. The rendezvous only
/// decides who writes, so clients that disagree for a moment contend, safely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Venue {
    /// At the node with the smallest address.
    Preferred,
    /// At the node with the second smallest address, until the preferred one is tried
    /// again.
    Fallback { until: Instant },
    /// Both failed: own rounds until then.
    Off { until: Instant },
}

/// Why a rendezvous call gave no answer.
enum Stop {
    /// The request's deadline passed.
    Deadline,
    /// The rendezvous failed or is too slow (already marked failed).
    Unavailable,
    /// No reply in time, but the node published results meanwhile: it runs scripts,
    /// slowly (not marked failed; the request joins again).
    Slow,
}

/// One request's way through the rendezvous (see `QuorumClient::combined`).
struct Combining {
    /// The rendezvous node.
    rv: usize,
    /// The IDs this request asks for.
    n: u64,
    deadline: Instant,
    started: Instant,
    /// How long one rendezvous call may take (see `QuorumClient::rendezvous_patience`).
    patience: Duration,
    /// Waits that ended without progress so far (see [`MAX_STALLS`]).
    stalls: u32,
    /// Messages the rendezvous had published when this request began there
    /// (`combine::Results::heard`): more since then means it is making progress.
    heard: u64,
    /// The longest wait an answer of the rendezvous is believed.
    longest: Duration,
}

/// Where a step of combining leads.
enum Next {
    /// The request's answer.
    Done(Result<IdRange, IdError>),
    /// Join again: this batch gave the request nothing, but the rendezvous works.
    Rejoin,
    /// This rendezvous failed (marked failed already): the request moves on to the next
    /// one (the fallback), if it has not failed too.
    Unavailable,
    /// Leave the rendezvous: the caller runs its own rounds.
    OwnRounds,
}

impl Combining {
    /// The request's deadline passed.
    fn past_deadline(&self) -> Next {
        Next::Done(Err(IdError::Deadline {
            deadline: self.deadline.saturating_duration_since(self.started),
            rounds: 0,
        }))
    }

    /// A rendezvous call gave no answer (see [`Stop`]).
    fn stopped(&self, stop: Stop) -> Next {
        match stop {
            Stop::Deadline => self.past_deadline(),
            Stop::Unavailable => Next::Unavailable,
            Stop::Slow => Next::Rejoin,
        }
    }

    /// Until when to wait for a batch whose lease ends in `wait`: never beyond the
    /// deadline, nor beyond what any leader could hold, plus a grace for the reply's way.
    fn until(&self, wait: Duration) -> Instant {
        self.deadline
            .min(Instant::now() + wait.min(self.longest) + LEADER_GRACE)
    }
}

/// What a client keeps between requests about combining: whether it does (see
/// [`Combine`]), and where (see [`Venue`]).
pub(super) struct CombineState {
    /// When to share rounds (configured).
    pub(super) mode: Combine,
    /// Fast protocol: another client writes the register too, so requests go through
    /// combined rounds. Set by a round lost to another writer; cleared after
    /// [`SOLO_STREAK`] batches that found nobody else.
    pub(super) contended: AtomicBool,
    solo_streak: AtomicU32,
    /// The rendezvous nodes of combined rounds, preferred first: the nodes with the
    /// smallest and second smallest address, so clients configured with the same nodes
    /// in any order meet at the same one, and move to the same one when it fails.
    pub(super) rendezvous: [usize; 2],
    /// Which rendezvous is in use.
    venue: Mutex<Venue>,
    results: combine::Results,
    /// How long a rendezvous call takes (answered calls only, so a paused node's
    /// silence does not lengthen the patience it is found with).
    call_time: MovingAverage,
    /// Upper bound of a batch leader's lease (`QuorumClient::lease`).
    pub(super) max_lease: Duration,
}

impl CombineState {
    /// Combining when contended ([`Combine::Auto`]) at `rendezvous` (preferred first),
    /// leases up to [`DEFAULT_MAX_LEASE`].
    pub(super) fn new(rendezvous: [usize; 2]) -> CombineState {
        CombineState {
            mode: Combine::Auto,
            contended: AtomicBool::new(false),
            solo_streak: AtomicU32::new(0),
            rendezvous,
            venue: Mutex::new(Venue::Preferred),
            results: combine::Results::default(),
            call_time: MovingAverage::new(super::INITIAL_ROUND),
            max_lease: DEFAULT_MAX_LEASE,
        }
    }
}

/// Leases and where to combine: these need only the rounds' timing.
impl<N: Register> QuorumClient<N> {
    /// How long a rendezvous call may take, and a member may wait for the results
    /// channel: [`RENDEZVOUS_PATIENCE_LEASES`] leases or [`RENDEZVOUS_PATIENCE_CALLS`]
    /// measured calls, whichever is longer, at most the reply timeout. A call is one
    /// script without fsync, so a node silent for longer is paused or gone (a slow one
    /// that publishes is waited for, see `ask`).
    fn rendezvous_patience(&self) -> Duration {
        let calls = self.combine.call_time.get() * RENDEZVOUS_PATIENCE_CALLS;
        (self.lease() * RENDEZVOUS_PATIENCE_LEASES)
            .max(calls)
            .min(self.reply_timeout)
    }

    /// How long a batch leader may take for its round before its members stop waiting and
    /// join again (an open batch may first wait as long for the batch in flight):
    /// [`LEASE_ROUNDS`] measured rounds, within [`MIN_LEASE`] and twice the reply timeout.
    /// Short, because a vanished leader (a crashed client, a killed broker) costs every
    /// member its lease; a leader that outlives it is safe, its members just stop waiting.
    fn lease(&self) -> Duration {
        let round = self.round_time.get();
        (round * LEASE_ROUNDS).clamp(MIN_LEASE, self.combine.max_lease.max(MIN_LEASE))
    }

    /// The rendezvous node to combine at now, if any (see [`Venue`]).
    pub(super) fn rendezvous_now(&self) -> Option<usize> {
        let mut state = self.combine.venue.lock().unwrap_or_else(|p| p.into_inner());
        match *state {
            Venue::Fallback { until } | Venue::Off { until } if Instant::now() >= until => {
                *state = Venue::Preferred;
            }
            _ => {}
        }
        match *state {
            Venue::Preferred => Some(self.combine.rendezvous[0]),
            Venue::Fallback { .. } => Some(self.combine.rendezvous[1]),
            Venue::Off { .. } => None,
        }
    }

    /// The rendezvous at node `rv` failed (down, paused, too slow, stuck): the preferred
    /// one hands over to the fallback; a failed fallback means own rounds for a while.
    fn rendezvous_failed(&self, rv: usize) {
        let mut state = self.combine.venue.lock().unwrap_or_else(|p| p.into_inner());
        let until = Instant::now() + RENDEZVOUS_RETRY;
        *state = match *state {
            // Another task saw the preferred node fail and moved already.
            Venue::Fallback { .. } if rv != self.combine.rendezvous[1] => return,
            Venue::Off { .. } => return,
            Venue::Preferred
                if rv == self.combine.rendezvous[0] && rv != self.combine.rendezvous[1] =>
            {
                bump(&self.counters.to_fallback, 1);
                Venue::Fallback { until }
            }
            _ => {
                bump(&self.counters.to_own_rounds, 1);
                Venue::Off { until }
            }
        };
    }
}

/// Combined rounds: these need the node's rendezvous too.
impl<N: Register + Rendezvous> QuorumClient<N> {
    /// `n` IDs through combined rounds (see [`crate::combine`]). `None`: no rendezvous
    /// to be had, or the batch this request was in failed; the caller runs its own rounds.
    ///
    /// A small state machine: [`Self::join_step`] joins and dispatches on the answer to
    /// [`Self::follow`] (a member), [`Self::lead_open_batch`] (the leader of an open
    /// batch) or [`Self::lead`] (a batch of its own); each says what comes next.
    pub(super) async fn combined(
        &self,
        n: u64,
        deadline: Instant,
        started: Instant,
    ) -> Option<Result<IdRange, IdError>> {
        // A rendezvous that fails during the request (down, paused, stuck) is marked
        // failed and the request moves on to the fallback, where the other clients go
        // too: falling to its own rounds instead would have it contend with every
        // batch, and under load lose round after round until its deadline. Each node
        // is tried once per request, so this ends.
        let mut tried: [Option<usize>; 2] = [None; 2];
        for slot in 0..tried.len() {
            let rv = self.rendezvous_now()?;
            if tried.contains(&Some(rv)) {
                return None;
            }
            tried[slot] = Some(rv);
            match self.combined_at(rv, n, deadline, started).await {
                Next::Done(result) => return Some(result),
                Next::Unavailable => continue,
                Next::OwnRounds | Next::Rejoin => return None,
            }
        }
        None
    }

    /// `n` IDs through combined rounds at the rendezvous node `rv`, joining again as
    /// long as it makes progress; [`Next::Unavailable`] when it failed.
    async fn combined_at(&self, rv: usize, n: u64, deadline: Instant, started: Instant) -> Next {
        let patience = self.rendezvous_patience();
        let rx = tokio::time::timeout(
            patience,
            self.combine
                .results
                .receiver(rv, &self.nodes[rv], &self.key),
        )
        .await;
        let Ok(Some(mut rx)) = rx else {
            tracing::debug!(
                node = self.nodes[rv].addr(),
                "rendezvous unavailable: no results channel within {patience:?}"
            );
            let why = match rx {
                Err(_) => &self.counters.rendezvous_slow,
                Ok(_) => &self.counters.rendezvous_errors,
            };
            bump(why, 1);
            self.rendezvous_failed(rv);
            return Next::Unavailable;
        };
        let mut c = Combining {
            rv,
            n,
            deadline,
            started,
            patience,
            stalls: 0,
            heard: self.combine.results.heard(rv),
            // No wait the rendezvous announces is believed beyond what any leader could hold.
            longest: self.combine.max_lease * 2 + LEADER_GRACE,
        };
        loop {
            match self.join_step(&mut c, &mut rx).await {
                Next::Rejoin => {}
                next => return next,
            }
        }
    }

    /// One `join` at the rendezvous, and what its answer leads to.
    async fn join_step(&self, c: &mut Combining, rx: &mut Receiver<BatchResult>) -> Next {
        let now = Instant::now();
        if now >= c.deadline {
            return c.past_deadline();
        }
        if c.stalls >= MAX_STALLS {
            return self.leave_stuck(c, "join", format!("{} waits without progress", c.stalls));
        }
        let nonce = Nonce::random();
        let remaining = c.deadline - now;
        let lease = self.lease();
        let leases = Leases {
            round: lease.min(remaining),
            batch: (lease * 2).min(remaining),
        };
        let join = self.nodes[c.rv].join(&self.key, c.n, nonce, leases);
        match self.ask(c.rv, "join", c.deadline, c.patience, join).await {
            Err(stop) => c.stopped(stop),
            Ok(Join::Full) => Next::OwnRounds,
            Ok(Join::Solo) => {
                self.note_solo_batch();
                Next::Done(self.lead(c, nonce, c.n).await)
            }
            Ok(Join::Follow {
                batch,
                offset,
                wait,
            }) => {
                self.combine.solo_streak.store(0, Ordering::Relaxed);
                self.follow(c, rx, batch, offset, wait).await
            }
            Ok(Join::Lead { busy, wait }) => {
                self.combine.solo_streak.store(0, Ordering::Relaxed);
                self.lead_open_batch(c, rx, nonce, busy, wait).await
            }
        }
    }

    /// A batch that found nobody else: after [`SOLO_STREAK`] in a row (with
    /// [`Combine::Auto`]), stop paying for the rendezvous.
    fn note_solo_batch(&self) {
        if self.combine.mode == Combine::Auto
            && self.combine.solo_streak.fetch_add(1, Ordering::Relaxed) + 1 >= SOLO_STREAK
        {
            self.combine.solo_streak.store(0, Ordering::Relaxed);
            self.combine.contended.store(false, Ordering::Relaxed);
        }
    }

    /// A member of `batch` at `offset`: waits for the leader's result (until the leader's
    /// lease `wait` ends) and takes its share of it.
    async fn follow(
        &self,
        c: &mut Combining,
        rx: &mut Receiver<BatchResult>,
        batch: Nonce,
        offset: u64,
        wait: Duration,
    ) -> Next {
        let result = combine::await_result(rx, batch, c.until(wait), |r| self.learn(r)).await;
        match result {
            Ok(BatchResult {
                range: Some(range), ..
            }) => match member_range(range, offset, c.n) {
                Some(mine) => {
                    bump(&self.counters.combined, 1);
                    Next::Done(Ok(mine))
                }
                None => {
                    tracing::warn!(%batch, ?range, offset, n = c.n, "batch result does not cover this member; joining again");
                    Next::Rejoin
                }
            },
            // The batch's round failed (the leader retried until its deadline, or met an
            // error retrying cannot fix): our own rounds report why.
            Ok(BatchResult { range: None, .. }) => Next::OwnRounds,
            // The connection to the rendezvous ended (the node died or restarted): its
            // batches are gone with it.
            Err(WaitEnd::Closed) => {
                bump(&self.counters.rendezvous_errors, 1);
                self.rendezvous_failed(c.rv);
                Next::Unavailable
            }
            // The leader vanished (or is slow): its batch's IDs, if any, stay unused.
            Err(WaitEnd::TimedOut) => {
                self.no_progress(c);
                Next::Rejoin
            }
        }
    }

    /// The leader of the open batch `nonce`: waits for batch `busy` in flight (its lease
    /// ends in `wait`), then closes its own batch and runs it.
    async fn lead_open_batch(
        &self,
        c: &mut Combining,
        rx: &mut Receiver<BatchResult>,
        nonce: Nonce,
        mut busy: Nonce,
        mut wait: Duration,
    ) -> Next {
        loop {
            self.wait_in_flight(c, rx, busy, wait).await;
            let now = Instant::now();
            if now >= c.deadline {
                return c.past_deadline();
            }
            let lease = self.lease().min(c.deadline - now);
            let close = self.nodes[c.rv].close(&self.key, nonce, lease);
            match self.ask(c.rv, "close", c.deadline, c.patience, close).await {
                // The total comes from the rendezvous node: a batch that cannot hold our
                // own share is no batch to lead.
                Ok(Close::Closed { ids }) if ids < c.n => {
                    let reason = format!("batch closed with {ids} IDs, below our own {}", c.n);
                    return self.leave(c, "close", reason);
                }
                Ok(Close::Closed { ids }) => return Next::Done(self.lead(c, nonce, ids).await),
                Ok(Close::Busy { busy: b, .. }) if b == busy => {
                    // Still in flight after its lease: no progress, unless the rendezvous
                    // publishes other results (then wait another lease for it).
                    if !self.no_progress(c) {
                        wait = self.lease();
                        continue;
                    }
                    if c.stalls >= MAX_STALLS {
                        let reason = format!("batch {busy} in flight past its lease");
                        return self.leave_stuck(c, "close", reason);
                    }
                    wait = MIN_POLL;
                }
                Ok(Close::Busy { busy: b, wait: w }) => (busy, wait) = (b, w),
                // Our open batch expired while we waited for the one in flight: no
                // progress either. (Uncounted, a stray mark that outlasts every lease had
                // leaders join, wait and find their batch expired, over and over until
                // their deadline.)
                Ok(Close::Gone) => {
                    self.no_progress(c);
                    return Next::Rejoin;
                }
                Err(stop) => return c.stopped(stop),
            }
        }
    }

    /// Waits for the result of batch `busy` in flight, at most until its lease `wait`
    /// ends; polls instead (sleeps) when the results subscription has ended.
    async fn wait_in_flight(
        &self,
        c: &Combining,
        rx: &mut Receiver<BatchResult>,
        busy: Nonce,
        wait: Duration,
    ) {
        let result = combine::await_result(rx, busy, c.until(wait), |r| self.learn(r)).await;
        if result == Err(WaitEnd::Closed) {
            tokio::time::sleep(wait.clamp(MIN_POLL, c.longest)).await;
        }
    }

    /// A wait of request `c` ended without the batch's result. It counts towards
    /// [`MAX_STALLS`] (and says so) only if the rendezvous has published nothing since
    /// the request began there: a stuck rendezvous (a stray mark) publishes nothing,
    /// while a busy one finishes other batches, and leaving it would send clients to
    /// the fallback, as loaded, then to contended rounds of their own (issue 47). A node
    /// paused mid-request is found by the calls that follow, which it leaves unanswered.
    fn no_progress(&self, c: &mut Combining) -> bool {
        bump(&self.counters.rendezvous_stalls, 1);
        let stuck = self.combine.results.heard(c.rv) == c.heard;
        if stuck {
            c.stalls += 1;
        }
        stuck
    }

    /// A published batch result teaches the register's progress (the next fast guess).
    fn learn(&self, result: &BatchResult) {
        if let Some(range) = result.range {
            self.last_known.fetch_max(range.hi, Ordering::Relaxed);
        }
    }

    /// Leaves the rendezvous (marked failed: the fallback, or own rounds, for a while)
    /// because `op` made no progress.
    fn leave(&self, c: &Combining, op: &str, reason: String) -> Next {
        let node = self.nodes[c.rv].addr();
        tracing::debug!(node, op, error = %reason, "rendezvous unavailable");
        bump(&self.counters.rendezvous_left, 1);
        self.rendezvous_failed(c.rv);
        Next::Unavailable
    }

    /// Leaves a rendezvous that answers but makes no progress (see [`MAX_STALLS`]): the
    /// preferred one is marked failed (a stray mark there: the fallback); at the
    /// fallback (or the only one) this request alone runs its own rounds, and combining
    /// goes on. Marking the fallback failed too sent whole clients to contended rounds
    /// of their own for [`RENDEZVOUS_RETRY`], which collapsed (issue 47).
    fn leave_stuck(&self, c: &Combining, op: &str, reason: String) -> Next {
        let [preferred, fallback] = self.combine.rendezvous;
        if c.rv == preferred && preferred != fallback {
            return self.leave(c, op, reason);
        }
        let node = self.nodes[c.rv].addr();
        tracing::debug!(node, op, error = %reason, "rendezvous makes no progress: own rounds for this request");
        bump(&self.counters.rendezvous_left, 1);
        Next::OwnRounds
    }

    /// Runs the batch `nonce` of `ids` IDs (the leader's own share first) and publishes
    /// the outcome to its members. The leader's share is checked like a member's.
    async fn lead(&self, c: &Combining, nonce: Nonce, ids: u64) -> Result<IdRange, IdError> {
        bump(&self.counters.batches, 1);
        let (n, deadline, started) = (c.n, c.deadline, c.started);
        let result = self.own_rounds(ids, deadline, started, Some(nonce)).await;
        let message = BatchResult {
            batch: nonce,
            range: result.as_ref().ok().copied(),
        }
        .message();
        // The result is ours already: a paused rendezvous must not hold it for a reply
        // timeout. Unpublished, the members stop waiting at the lease and join again.
        let patience = self.rendezvous_patience();
        let finish = self.nodes[c.rv].finish(&self.key, nonce, message);
        let _ = self.ask(c.rv, "finish", deadline, patience, finish).await;
        // The leader's share is checked like a member's: offset 0 of the batch's range.
        match result.map(|range| (range, member_range(range, 0, n))) {
            Ok((_, Some(mine))) => Ok(mine),
            Ok((range, None)) => {
                tracing::error!(
                    ?range,
                    n,
                    "batch range does not hold the leader's share; own round instead"
                );
                self.own_rounds(n, deadline, started, None).await
            }
            Err(e) => Err(e),
        }
    }

    /// One rendezvous call, given `patience` (and the deadline) to answer. A call that
    /// fails, or gets no reply in time while the node publishes nothing on its results
    /// channel (paused, gone), marks the rendezvous failed: the fallback, or own rounds,
    /// for a while. A node that publishes runs scripts, only slowly (a queue of joins, a
    /// starved CPU, an fsync): the call waits on, a patience at a time, up to the reply
    /// timeout, and then the request joins again ([`Stop::Slow`]); leaving a loaded
    /// rendezvous sends clients to contended rounds of their own, which collapse (issue
    /// 47).
    async fn ask<T>(
        &self,
        rv: usize,
        op: &'static str,
        deadline: Instant,
        patience: Duration,
        call: impl std::future::Future<Output = Result<T, NodeError>>,
    ) -> Result<T, Stop> {
        let sent = Instant::now();
        let longest = deadline.min(sent + self.reply_timeout.max(patience));
        let first = self.combine.results.heard(rv);
        let mut heard = first;
        let mut until = deadline.min(sent + patience);
        let mut late = false;
        tokio::pin!(call);
        let error = loop {
            match tokio::time::timeout_at(until, &mut call).await {
                Ok(Ok(value)) => {
                    self.combine.call_time.record(sent.elapsed());
                    return Ok(value);
                }
                // The node's own reply timeout: no reply in time, as below.
                Ok(Err(NodeError::Unavailable(reason))) if reason == "timed out" => {}
                Ok(Err(e)) => {
                    bump(&self.counters.rendezvous_errors, 1);
                    break format!("{e:?}");
                }
                Err(_) if Instant::now() >= deadline => return Err(Stop::Deadline),
                Err(_) => {
                    let now_heard = self.combine.results.heard(rv);
                    if now_heard != heard && until < longest {
                        if !late {
                            late = true;
                            bump(&self.counters.rendezvous_slow_alive, 1);
                        }
                        heard = now_heard;
                        until = longest.min(Instant::now() + patience);
                        continue;
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(Stop::Deadline);
            }
            if self.combine.results.heard(rv) != first {
                if !late {
                    bump(&self.counters.rendezvous_slow_alive, 1);
                }
                tracing::debug!(
                    node = self.nodes[rv].addr(),
                    op,
                    "rendezvous slow: no reply within {:?}, but it publishes; joining again",
                    sent.elapsed()
                );
                return Err(Stop::Slow);
            }
            bump(&self.counters.rendezvous_slow, 1);
            break format!("no reply within {:?}", sent.elapsed());
        };
        tracing::debug!(node = self.nodes[rv].addr(), op, %error, "rendezvous unavailable");
        self.rendezvous_failed(rv);
        Err(Stop::Unavailable)
    }
}

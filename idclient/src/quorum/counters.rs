//! The client's counters: totals for benchmarks and logs, and per node for metrics.

use super::QuorumClient;
use crate::register::Register;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters for benchmarks and logs (monotonic since the client was created).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// `next_ids` calls.
    pub requests: u64,
    /// Conditional-write rounds sent.
    pub rounds: u64,
    /// Node replies that rejected a write.
    pub rejects: u64,
    /// Rounds retried after a loss.
    pub retries: u64,
    /// IDs of lost rounds that some node accepted: an upper bound on the holes this
    /// client left.
    pub burned: u64,
    /// Calls that ended in an error.
    pub errors: u64,
    /// Requests served by a batch that another client led (combined rounds).
    pub combined: u64,
    /// Batches this client led (its own request, and its members' if any).
    pub batches: u64,
    /// Rendezvous calls (join, close, finish, subscribe) that got no reply within their
    /// patience while the node published nothing (or within the reply timeout): the
    /// rendezvous counted as failed.
    pub rendezvous_slow: u64,
    /// Rendezvous calls without a reply within their patience while the node published
    /// results: slow, not paused or gone, so not counted as failed. The call waits on
    /// (up to the reply timeout), then the request joins again.
    pub rendezvous_slow_alive: u64,
    /// Rendezvous calls that failed (an error reply, a broken connection), and results
    /// subscriptions that ended: the rendezvous counted as failed.
    pub rendezvous_errors: u64,
    /// Rendezvous waits that ended without the batch's result (a leader past its lease,
    /// a batch in flight past its lease, an open batch expired); only those at a
    /// rendezvous that published nothing meanwhile count towards leaving it.
    pub rendezvous_stalls: u64,
    /// Requests that left a rendezvous for lack of progress (two waits without it, a
    /// short batch): the rendezvous counted as failed.
    pub rendezvous_left: u64,
    /// Moves from the preferred rendezvous node to the fallback.
    pub to_fallback: u64,
    /// Moves to own rounds for a while: both rendezvous nodes failed.
    pub to_own_rounds: u64,
    /// Requests of a contended client that ran their own rounds (no rendezvous, a failed
    /// or full batch).
    pub uncombined: u64,
}

/// Field by field: the counters of several clients added up (a benchmark's total).
impl std::ops::AddAssign for Counters {
    fn add_assign(&mut self, c: Counters) {
        let Counters {
            requests,
            rounds,
            rejects,
            retries,
            burned,
            errors,
            combined,
            batches,
            rendezvous_slow,
            rendezvous_slow_alive,
            rendezvous_errors,
            rendezvous_stalls,
            rendezvous_left,
            to_fallback,
            to_own_rounds,
            uncombined,
        } = c;
        self.requests += requests;
        self.rounds += rounds;
        self.rejects += rejects;
        self.retries += retries;
        self.burned += burned;
        self.errors += errors;
        self.combined += combined;
        self.batches += batches;
        self.rendezvous_slow += rendezvous_slow;
        self.rendezvous_slow_alive += rendezvous_slow_alive;
        self.rendezvous_errors += rendezvous_errors;
        self.rendezvous_stalls += rendezvous_stalls;
        self.rendezvous_left += rendezvous_left;
        self.to_fallback += to_fallback;
        self.to_own_rounds += to_own_rounds;
        self.uncombined += uncombined;
    }
}

/// One node's failures seen by this client's rounds (monotonic), for per-node metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCounters {
    /// The node's shown address ([`Register::addr`]: never a password).
    pub addr: String,
    /// Replies that were errors (unreachable, refused, broken connection, bad node),
    /// its own reply timeouts excluded.
    pub errors: u64,
    /// Calls that timed out: the node's reply timeout, or no reply before the round's
    /// deadline.
    pub timeouts: u64,
}

#[derive(Default)]
struct NodeAtomics {
    errors: AtomicU64,
    timeouts: AtomicU64,
}

#[derive(Default)]
pub(super) struct AtomicCounters {
    pub(super) requests: AtomicU64,
    pub(super) rounds: AtomicU64,
    pub(super) rejects: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) burned: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) combined: AtomicU64,
    pub(super) batches: AtomicU64,
    pub(super) rendezvous_slow: AtomicU64,
    pub(super) rendezvous_slow_alive: AtomicU64,
    pub(super) rendezvous_errors: AtomicU64,
    pub(super) rendezvous_stalls: AtomicU64,
    pub(super) rendezvous_left: AtomicU64,
    pub(super) to_fallback: AtomicU64,
    pub(super) to_own_rounds: AtomicU64,
    pub(super) uncombined: AtomicU64,
    /// Per node, in `nodes` order.
    nodes: Vec<NodeAtomics>,
}

pub(super) fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

impl AtomicCounters {
    /// All zero, for `nodes` nodes.
    pub(super) fn new(nodes: usize) -> AtomicCounters {
        AtomicCounters {
            nodes: (0..nodes).map(|_| NodeAtomics::default()).collect(),
            ..AtomicCounters::default()
        }
    }
}

impl<N: Register> QuorumClient<N> {
    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters {
            requests: get(&c.requests),
            rounds: get(&c.rounds),
            rejects: get(&c.rejects),
            retries: get(&c.retries),
            burned: get(&c.burned),
            errors: get(&c.errors),
            combined: get(&c.combined),
            batches: get(&c.batches),
            rendezvous_slow: get(&c.rendezvous_slow),
            rendezvous_slow_alive: get(&c.rendezvous_slow_alive),
            rendezvous_errors: get(&c.rendezvous_errors),
            rendezvous_stalls: get(&c.rendezvous_stalls),
            rendezvous_left: get(&c.rendezvous_left),
            to_fallback: get(&c.to_fallback),
            to_own_rounds: get(&c.to_own_rounds),
            uncombined: get(&c.uncombined),
        }
    }

    /// Each node's failures so far, in configured order.
    pub fn node_counters(&self) -> Vec<NodeCounters> {
        self.nodes
            .iter()
            .zip(&self.counters.nodes)
            .map(|(node, c)| NodeCounters {
                addr: node.addr().to_string(),
                errors: c.errors.load(Ordering::Relaxed),
                timeouts: c.timeouts.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Counts a failure of the node at `i` (a timeout or another error).
    pub(super) fn count_node_failure(&self, i: usize, timeout: bool) {
        if let Some(c) = self.counters.nodes.get(i) {
            bump(if timeout { &c.timeouts } else { &c.errors }, 1);
        }
    }
}

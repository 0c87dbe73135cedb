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

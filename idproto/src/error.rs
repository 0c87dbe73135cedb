//! The one error type of the ID client.

use std::fmt;
use std::time::Duration;

/// Why one node did not take part in a round.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeFailure {
    /// The node's address (`redis://host:port`), never with its password (see `NodeAddr`).
    pub addr: String,
    /// What went wrong (connect refused, timeout, redis error, ...).
    pub reason: String,
}

impl fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.addr, self.reason)
    }
}

fn list(failures: &[NodeFailure]) -> String {
    if failures.is_empty() {
        return "none".to_string();
    }
    failures
        .iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Everything that can go wrong getting IDs. An error never carries IDs: a request that
/// fails may have burned IDs (a hole), but none of them is ever handed out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum IdError {
    /// Fewer than a majority of nodes could be reached before the deadline.
    #[error("no quorum: {reachable} of {total} nodes answered, {needed} needed (failed: {})", list(.failures))]
    NoQuorum {
        needed: usize,
        reachable: usize,
        total: usize,
        failures: Vec<NodeFailure>,
    },

    /// The deadline passed: every round was lost to contention (a majority answered but
    /// another client won), or (`rounds` = 0) the request waited out its deadline at a broker.
    #[error("deadline of {deadline:?} exceeded after {rounds} lost round(s)")]
    Deadline { deadline: Duration, rounds: u64 },

    /// A node does not persist every write before replying; using it could repeat IDs.
    #[error("node {addr} is unsafe: {reason} (a node must run with appendonly yes, appendfsync always, no-appendfsync-on-rewrite no, maxmemory-policy noeviction; --unsafe-skip-durability-check overrides at your own risk)")]
    UnsafeNode { addr: String, reason: String },

    /// A node's register holds something that is not a canonical decimal u64.
    #[error("node {addr}: key `{key}` holds {value:?}, which is not a canonical decimal u64 (refusing to guess: fix or delete the key by hand)")]
    BadValue {
        addr: String,
        key: String,
        value: String,
    },

    /// The register reached u64::MAX: no more IDs can be generated.
    #[error(
        "node {addr}: the register is exhausted (cannot reserve {count} more IDs above {current})"
    )]
    Exhausted {
        addr: String,
        current: u64,
        count: u64,
    },

    /// The configuration is unusable (bad URL, even node count, ...).
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The request itself is invalid (count 0 or above the limit).
    #[error("invalid request: {0}")]
    BadRequest(String),

    /// Every broker failed (connection refused, broken, timed out) before the deadline.
    #[error("no broker reachable (failed: {})", list(.failures))]
    BrokersUnavailable { failures: Vec<NodeFailure> },

    /// A broker broke the wire protocol (bad frame, wrong version, unexpected reply).
    #[error("broker {addr}: protocol error: {reason}")]
    Protocol { addr: String, reason: String },
}

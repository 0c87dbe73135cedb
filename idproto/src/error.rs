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

/// The text of [`IdError::NoQuorum`]: how many nodes answered, of how many, and (after
/// a write round) how many of those accepted, against how many were needed, then why
/// each other node did not answer: "no quorum: 2 of 5 nodes answered, 1 accepted, 3
/// needed; ...". A round that enough nodes answered but too few accepted (another client
/// won) is no "no quorum" but contention, retried until the deadline
/// ([`IdError::Deadline`]).
fn no_quorum(
    needed: usize,
    answered: usize,
    accepted: Option<usize>,
    total: usize,
    failures: &[NodeFailure],
) -> String {
    let unanswered = total.saturating_sub(answered);
    let accepted = accepted.map_or(String::new(), |a| format!(", {a} accepted"));
    let mut text = format!(
        "no quorum: {answered} of {total} nodes answered{accepted}, {needed} needed; {unanswered} did not (failed: {}",
        list(failures)
    );
    let not_waited = unanswered.saturating_sub(failures.len());
    if not_waited > 0 {
        text.push_str(&format!("; {not_waited} not asked, or not waited for"));
    }
    text.push(')');
    text
}

/// Everything that can go wrong getting IDs. An error never carries IDs: a request that
/// fails may have burned IDs (a hole), but none of them is ever handed out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum IdError {
    /// Fewer than a majority of nodes answered before the deadline. `reachable` counts
    /// the nodes that answered (an accept, a reject or a value), `accepted` those of
    /// them that accepted a write round's reservation (`None` for a read, which nobody
    /// accepts), `failures` the nodes that failed; the rest were not asked (a majority
    /// read asks only a majority), or not waited for once the outcome was certain.
    #[error("{}", no_quorum(*.needed, *.reachable, *.accepted, *.total, .failures))]
    NoQuorum {
        /// Nodes a round needs: a majority, N / 2 + 1 of the N configured.
        needed: usize,
        /// Nodes that answered (an accept, a reject or a value).
        reachable: usize,
        /// Nodes that accepted the write round's reservation; `None` for a read.
        accepted: Option<usize>,
        /// Nodes configured (N).
        total: usize,
        /// The nodes that failed, and why; nodes not asked or not waited for are absent.
        failures: Vec<NodeFailure>,
    },

    /// The deadline passed: every round was lost to contention (a majority answered but
    /// another client won), or (`rounds` = 0) the request waited out its deadline at a broker.
    #[error("deadline of {deadline:?} exceeded after {rounds} lost round(s)")]
    Deadline {
        /// The request's whole deadline, from its start (not per round).
        deadline: Duration,
        /// Rounds lost to contention before it passed; 0 when it expired at a broker.
        rounds: u64,
    },

    /// A node does not persist every write before replying; using it could repeat IDs.
    #[error("node {addr} is unsafe: {reason} (a node must run with appendonly yes, appendfsync always, no-appendfsync-on-rewrite no, maxmemory-policy noeviction; --unsafe-skip-durability-check overrides at your own risk)")]
    UnsafeNode {
        /// The node's address, never with its password.
        addr: String,
        /// The setting that is wrong, as the node reported it (e.g. `appendfsync everysec`).
        reason: String,
    },

    /// A node's register holds something that is not a canonical decimal u64.
    #[error("node {addr}: key `{key}` holds {value:?}, which is not a canonical decimal u64 (refusing to guess: fix or delete the key by hand)")]
    BadValue {
        /// The node's address, never with its password.
        addr: String,
        /// The register's key (`current` unless `--key` changed it).
        key: String,
        /// What the key holds, verbatim.
        value: String,
    },

    /// The register reached u64::MAX: no more IDs can be generated.
    #[error(
        "node {addr}: the register is exhausted (cannot reserve {count} more IDs above {current})"
    )]
    Exhausted {
        /// The node's address, never with its password.
        addr: String,
        /// The register's value on that node: the last ID reserved there.
        current: u64,
        /// IDs the request asked for, which would pass u64::MAX.
        count: u64,
    },

    /// The configuration is unusable (bad URL, even node count, ...).
    #[error("invalid configuration: {0}")]
    Config(
        /// What is wrong, for a person to read.
        String,
    ),

    /// The request itself is invalid (count 0 or above the limit).
    #[error("invalid request: {0}")]
    BadRequest(
        /// What is wrong, for a person to read.
        String,
    ),

    /// Every broker failed (connection refused, broken, timed out) before the deadline.
    #[error("no broker reachable (failed: {})", list(.failures))]
    BrokersUnavailable {
        /// Every broker tried, with why it failed (`addr` is the broker's host:port).
        failures: Vec<NodeFailure>,
    },

    /// A broker broke the wire protocol (bad frame, wrong version, unexpected reply).
    #[error("broker {addr}: protocol error: {reason}")]
    Protocol {
        /// The broker's address (host:port).
        addr: String,
        /// What was wrong with what it sent.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(addr: &str, reason: &str) -> NodeFailure {
        NodeFailure {
            addr: addr.into(),
            reason: reason.into(),
        }
    }

    /// The "no quorum" text says how many answered, of how many, how many of them
    /// accepted (a write round), how many were needed, and why the others did not:
    /// never "3 answered, 3 needed" for a round that failed.
    #[test]
    fn no_quorum_says_who_answered_who_failed_and_how_many_were_needed() {
        let e = IdError::NoQuorum {
            needed: 3,
            reachable: 1,
            accepted: None,
            total: 5,
            failures: vec![
                failure("redis://a:1", "connection refused"),
                failure("redis://b:2", "timed out"),
            ],
        };
        assert_eq!(
            e.to_string(),
            "no quorum: 1 of 5 nodes answered, 3 needed; 4 did not (failed: redis://a:1: connection refused; redis://b:2: timed out; 2 not asked, or not waited for)"
        );
        let e = IdError::NoQuorum {
            needed: 2,
            reachable: 0,
            accepted: None,
            total: 3,
            failures: vec![
                failure("redis://a:1", "connection refused"),
                failure("redis://b:2", "connection refused"),
                failure("redis://c:3", "no reply before the deadline"),
            ],
        };
        assert_eq!(
            e.to_string(),
            "no quorum: 0 of 3 nodes answered, 2 needed; 3 did not (failed: redis://a:1: connection refused; redis://b:2: connection refused; redis://c:3: no reply before the deadline)"
        );
        // A write round says how many of the nodes that answered accepted.
        let e = IdError::NoQuorum {
            needed: 3,
            reachable: 2,
            accepted: Some(1),
            total: 5,
            failures: vec![
                failure("redis://c:3", "connection refused"),
                failure("redis://d:4", "connection refused"),
                failure("redis://e:5", "no reply before the deadline"),
            ],
        };
        assert_eq!(
            e.to_string(),
            "no quorum: 2 of 5 nodes answered, 1 accepted, 3 needed; 3 did not (failed: redis://c:3: connection refused; redis://d:4: connection refused; redis://e:5: no reply before the deadline)"
        );
    }
}

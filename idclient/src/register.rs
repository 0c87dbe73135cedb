//! What the quorum client needs of a node, as two traits: [`Register`] (the conditional
//! write and the read, on which safety rests) and [`Rendezvous`] (join, close, finish and
//! the results channel of combined rounds, which only decide who writes). The Redis
//! [`crate::Node`] implements both; so does the simulation's node (`testkit::sim`), and
//! the tests' scripted fakes.
//!
//! Imports only the rendezvous protocol types (`rendezvous.rs`, a leaf), so the node, the
//! combining code and the quorum client can all depend on it without a cycle.

use crate::rendezvous::{Close, Join, Leases, Nonce};
use futures::stream::BoxStream;
use std::future::Future;
use std::time::Duration;

/// The most IDs one request may reserve, and one combined batch may hold: a typo must
/// not burn the ID space.
pub const MAX_COUNT: u64 = 1 << 32;

/// What one node said, or why it said nothing usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeError {
    /// Unreachable, timed out, connection broken, or an unexpected Redis error.
    Unavailable(String),
    /// The node does not persist every write before replying.
    Unsafe(String),
    /// The register is not a canonical decimal u64.
    BadValue(String),
    /// Not an independent node: a replica, or the same server as another node of the
    /// quorum. No flag overrides this: such a quorum tolerates fewer failures than it
    /// claims, or cannot be written at all.
    NotIndependent(String),
}

/// Reply of the conditional write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteReply {
    /// The register was below LO and now holds HI.
    Accepted,
    /// The register was not below LO; it holds `current`.
    Rejected {
        /// The register's value on that node, at least LO.
        current: u64,
    },
}

/// A conditional write's reply, and whether the node is the rendezvous of a combined
/// batch in flight (see [`Rendezvous`]): then the writer is not alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Whether the write was accepted, or the node's value if not.
    pub reply: WriteReply,
    /// The node holds a combined batch in flight (its in-flight key has a lease left).
    pub combining: bool,
}

/// One register of the quorum, as the quorum client sees it. [`crate::Node`] (Redis) is the
/// production implementation; `testkit::sim` has an in-memory one for the deterministic
/// simulation. The client's safety rests on exactly these semantics: the register only
/// grows, and survives restarts.
pub trait Register: Send + Sync {
    /// The node's address, for error messages: never a password (see [`crate::NodeAddr`]).
    fn addr(&self) -> &str;

    /// "If current < lo then current = hi": [`WriteReply::Accepted`], else
    /// [`WriteReply::Rejected`] with the register's value; and whether a combined batch
    /// other than `batch` (the writer's own, if it leads one) is in flight here.
    ///
    /// # Errors
    /// Unavailable, or a register that is not a canonical u64.
    fn conditional_write(
        &self,
        key: &str,
        lo: u64,
        hi: u64,
        batch: Option<Nonce>,
    ) -> impl Future<Output = Result<WriteOutcome, NodeError>> + Send;

    /// The register's value (missing = 0).
    ///
    /// # Errors
    /// Unavailable, or a register that is not a canonical u64.
    fn read(&self, key: &str) -> impl Future<Output = Result<u64, NodeError>> + Send;

    /// Makes sure the node is usable (connected, durable) before the first round.
    ///
    /// # Errors
    /// As the first round would see it.
    fn warm_up(&self) -> impl Future<Output = Result<(), NodeError>> + Send;
}

/// The rendezvous of combined rounds on one node (docs/idclient.md, "Contention"): where
/// contending clients meet to share rounds. Volatile and never part of the decision: a
/// node whose rendezvous misbehaves costs waiting and holes, never a duplicate.
pub trait Rendezvous: Send + Sync {
    /// `join`: add `n` IDs to the open batch (unless it would then hold more than
    /// [`MAX_COUNT`]: [`Join::Full`]), or open one (as `nonce`), or run alone.
    ///
    /// # Errors
    /// Unavailable, or a reply that is not one of [`Join`]'s.
    fn join(
        &self,
        key: &str,
        n: u64,
        nonce: Nonce,
        leases: Leases,
    ) -> impl Future<Output = Result<Join, NodeError>> + Send;

    /// `close`: the leader of batch `nonce` closes it once nothing is in flight.
    ///
    /// # Errors
    /// Unavailable, or a reply that is not one of [`Close`]'s.
    fn close(
        &self,
        key: &str,
        nonce: Nonce,
        lease: Duration,
    ) -> impl Future<Output = Result<Close, NodeError>> + Send;

    /// `finish`: batch `nonce` is done; publish `message` to the waiting clients.
    ///
    /// # Errors
    /// Unavailable.
    fn finish(
        &self,
        key: &str,
        nonce: Nonce,
        message: String,
    ) -> impl Future<Output = Result<(), NodeError>> + Send;

    /// The results channel: every message published by `finish` from the moment this
    /// resolves, until the connection ends.
    ///
    /// # Errors
    /// Unavailable.
    fn subscribe(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<BoxStream<'static, String>, NodeError>> + Send;
}

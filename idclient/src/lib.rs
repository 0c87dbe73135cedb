//! idclient: globally ordered, never-repeated IDs from a majority of independent Redis nodes.
//!
//! Every ID handed out is greater than every ID handed out before it, anywhere, and no ID
//! is handed out twice, through crashes, pauses and partitions (see `docs/` and DESIGN.md).
//!
//! This crate is the client only. Its modules, private, in dependency order (none imports
//! one that imports it back):
//! - `rendezvous`: the rendezvous protocol of combined rounds as data ([`Nonce`],
//!   [`Leases`], [`Join`], [`Close`], the published batch result); a leaf.
//! - `register`: what the client needs of a node, two traits: [`Register`] (the
//!   conditional write and the read) and [`Rendezvous`] (join, close, finish, results).
//! - `script` (the Lua scripts), `node` (one Redis node: [`Node`], implementing both).
//! - `node::heartbeat`: the broker leader's volatile heartbeat on the nodes
//!   ([`Heartbeat`], [`refresh_heartbeat`], [`read_heartbeats`], [`resign_heartbeat`],
//!   generic over [`HeartbeatNode`], what they need of one node).
//! - `combine`: a client's subscription to batch results, and waiting for one.
//! - `quorum`: [`QuorumClient`], the direct client. One conditional-write round per
//!   request ([`Protocol::Fast`], the default) or read-then-write ([`Protocol::Classic`]);
//!   under contention it shares rounds through a rendezvous node ([`Combine`]).
//! - `backoff`: the one seedable backoff of every retry loop; `average`: the one moving
//!   average ([`MovingAverage`]) of round times.
//! - [`broker_client`] (public): [`BrokerClient`](broker_client::BrokerClient), the client
//!   of `idbroker`, with its config and `fetch_stats`.
//! - [`broker_tls`] (public): TLS to the brokers' own listeners ([`BrokerTls`]), and a
//!   connection's halves, plain or TLS, which the broker's connections use too.
//!
//! What is public, and why:
//! - the client: [`QuorumClient`], [`ClientConfig`] (with [`TlsConfig`] and [`ClientCert`]
//!   for `rediss://` nodes), [`Protocol`], [`Combine`],
//!   [`Counters`], and [`check_nodes`] / [`NodeCheck`] (`idctl check`);
//! - the limits callers size things by: [`MAX_COUNT`] (the broker caps its rounds by it),
//!   [`BACKOFF_CAP`] (a CLI default), and the lease bounds [`MIN_LEASE`], [`MAX_LEASE`] and
//!   [`SOLO_STREAK`], which tests and the simulation check behaviour against;
//! - [`MovingAverage`], which the broker's window times its rounds with too;
//! - the node contract, for other node types (the simulation's `testkit::sim::SimNode`,
//!   tests' fakes): [`Register`], [`Rendezvous`], [`HeartbeatNode`], [`NodeError`], [`WriteReply`],
//!   [`WriteOutcome`] and the rendezvous types above; and the Redis node itself, [`Node`],
//!   with what it shows ([`NodeAddr`], never a password) and reports ([`Identity`]);
//! - the types every part shares ([`IdRange`], [`IdSource`], [`IdError`],
//!   [`NodeFailure`]), which live in `idproto` and are re-exported here.
//!
//! Everything else (round tallies, the combining state machine, the scripts, the
//! subscription plumbing) is internal. The tooling (local quorum launcher, history
//! checker, simulation, bench driver, `idctl`) lives in `idtools`.

mod average;
mod backoff;
pub mod broker_client;
pub mod broker_tls;
mod combine;
mod node;
mod quorum;
mod register;
mod rendezvous;
mod script;
pub mod shares;

pub use average::MovingAverage;
pub use broker_tls::BrokerTls;
pub use idproto::auth::Token;
pub use idproto::{error, IdError, IdRange, IdSource, NodeFailure};
pub use node::heartbeat::{
    read_heartbeats, refresh_heartbeat, refresh_heartbeat_trusting, resign_heartbeat, Heartbeat,
    HeartbeatAuth, HeartbeatNode, Refresh,
};
pub use node::{ClientCert, Identity, Node, NodeAddr, TlsConfig};
pub use quorum::{
    check_nodes, ClientConfig, Combine, Counters, NodeCheck, NodeCounters, Protocol, QuorumClient,
    BACKOFF_CAP, MAX_LEASE, MIN_LEASE, MIN_READ_HEDGE, READ_HEDGE_READS, SOLO_STREAK,
};
pub use register::{NodeError, Register, Rendezvous, WriteOutcome, WriteReply, MAX_COUNT};
pub use rendezvous::{Close, Join, Leases, Nonce};

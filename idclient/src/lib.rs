//! idclient: globally ordered, never-repeated IDs from a majority of independent Redis nodes.
//!
//! Every ID handed out is greater than every ID handed out before it, anywhere, and no ID
//! is handed out twice, through crashes, pauses and partitions (see `docs/` and DESIGN.md).
//!
//! This crate is the client only:
//! - [`QuorumClient`]: the direct client. One conditional-write round per request
//!   ([`Protocol::Fast`], the default) or read-then-write ([`Protocol::Classic`]); under
//!   contention it shares rounds through a rendezvous node ([`combine`]).
//! - [`node`] and [`script`]: one Redis node and the Lua scripts that run on it.
//! - [`broker_client::BrokerClient`]: the client of `idbroker`.
//!
//! The types every part shares ([`IdRange`], [`IdSource`], [`IdError`]) live in `idproto`
//! and are re-exported here. The tooling (local quorum launcher, history checker,
//! simulation, bench driver, `idctl`) lives in `idtools`.

pub mod backoff;
pub mod broker_client;
pub mod combine;
pub mod node;
pub mod quorum;
pub mod script;

pub use idproto::{error, IdError, IdRange, IdSource, NodeFailure};
pub use quorum::{ClientConfig, Combine, Counters, Protocol, QuorumClient};

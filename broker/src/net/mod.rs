//! The network side: listeners, connections and their protocols, with no ID logic.
//!
//! - `binary`: one binary-protocol connection (`docs/wire-protocol.md`).
//! - `resp`: one RESP connection (any Redis client, `QLIST.NEXT`).
//! - `tls`: TLS under both protocols ([`ListenTls`]).
//! - `forward`: a follower's forwarding of RESP requests to the leader.
//!
//! Connections reach the serving side ([`crate::serve`]) only through the batch queue
//! and the source's trait.

pub(crate) mod accept;
pub(crate) mod binary;
pub(crate) mod forward;
pub(crate) mod resp;
pub(crate) mod tls;

pub use tls::ListenTls;

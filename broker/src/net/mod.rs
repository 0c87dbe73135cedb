//! The network side: listeners, connections and their protocols, with no ID logic.
//!
//! - `accept`: the accept loop, connection slots and eviction at the cap.
//! - `session`: what connections of both protocols share: their context, the slot they
//!   hold, the bounded wait for bytes, the path of a request into the batch queue.
//! - `binary`: one binary-protocol connection (`docs/wire-protocol.md`).
//! - `resp`: one RESP connection (any Redis client, `QLIST.NEXT`).
//! - `tls`: TLS under both protocols (the handshakes; the setting is [`ListenTls`](crate::ListenTls)).
//! - `refuse`: refusals, in the client's protocol (at the cap, plain TCP on TLS).
//! - `forward`: a follower's forwarding of RESP requests to the leader.
//!
//! Connections reach the serving side ([`crate::serve`]) only through the batch queue
//! and the source's trait.

pub(crate) mod accept;
pub(crate) mod binary;
pub(crate) mod forward;
pub(crate) mod refuse;
pub(crate) mod resp;
pub(crate) mod session;
pub(crate) mod tls;

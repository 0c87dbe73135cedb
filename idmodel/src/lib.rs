//! An exhaustive model of qlist's broker protocol, checked with `stateright`
//! (docs/model.md): brokers (election in terms, heartbeats, windows reserved, confirmed
//! by a majority read, served, stepping down), Redis nodes (the conditional
//! set-if-less-than write, the term register, the volatile heartbeat; crashes that keep
//! durable state, restarts), clients (requests, redirects, retries whose outcome is
//! unknown) and a network that delays, reorders, drops and duplicates every message.
//! A process pause of any length needs no action of its own: a paused actor simply
//! takes no step while the others take theirs, and BFS tries every such interleaving.
//!
//! A modelled broker decides through [`broker::serve::rules::Rules`], and most of its
//! guards are functions the broker itself calls; three are not (docs/model.md, "The same
//! logic, not a copy"): `serves_unconfirmed` and `read_usable` are structural in the
//! broker (it always reads after a batch closed and waits for the read), and `granted`
//! states the majority the ID client's quorum round counts when the broker claims a term.
//! For those three the model states the rule and its mutant removes it there. [`Config::rules`] may carry
//! a [`Mutant`](broker::serve::rules::Mutant) (one guard removed) for the negative tests.
//!
//! The main types: [`Config`] (the bounds, and the [`stateright::Model`]), [`State`],
//! [`Action`]. The properties are those `Config`'s `Model::properties` returns, by the names in [`props`].
//!
//! Liveness is checked bounded: [`Config::quiet`] is the model once faults stop, and
//! [`Config::quiet_run`] runs it on one fair schedule; with [`Config::liveness`] set,
//! every state the search reaches must lead to an answer within that many quiet steps.
//!
//! [`follow`] is a second, separate model: producers publishing segments and checkpoints
//! with claims, and a follower emitting the stable prefix up to the watermark (issue #45).

pub mod follow;
mod model;

pub use model::*;

//! Serving IDs, with no socket code: what a batch of requests gets from the quorum.
//!
//! - [`source`]: [`source::RoundSource`], the trait every way of serving implements,
//!   with what the network side may ask of it ([`source::Admit`],
//!   [`source::Leadership`]).
//! - `queue`: the batch queue, what connections hand the batcher and get back.
//! - [`batcher`]: group commit; one round (or a few pipelined ones) per batch of
//!   queued requests, split in arrival order.
//! - [`window`]: [`window::WindowSource`], batches served from confirmed windows.
//! - [`rules`]: every decision of the election, the window and admission as a pure
//!   function, shared with the model checker (`idmodel/`).
//! - [`election`]: leader election among window-serving brokers; and
//!   [`leader_source::LeaderSource`], which serves windows only while elected.
//!
//! The network side (`net`) reaches this side only through the batch queue and
//! the source's trait; nothing here imports it.

pub mod batcher;
pub mod election;
pub mod leader_source;
pub(crate) mod queue;
pub mod rules;
pub mod source;
pub mod window;

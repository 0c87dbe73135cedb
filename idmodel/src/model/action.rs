//! The steps of the model: one of an actor, or of the network.

use super::Env;

/// One step of one actor, or of the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Delivers a message. One to a node is applied there and its answer reaches the
    /// broker in the same step (a delay in between is a delay of the request).
    Deliver(Env),
    /// A node applies a request, and its answer is lost: the outcome is unknown.
    Lose(Env),
    /// A request to a node is sent twice: the copy may land any time later.
    Duplicate(Env),
    Crash(u8),
    Restart(u8),
    /// Follower: read the heartbeats.
    Watch(u8),
    /// Follower after a heartbeat read: its election timeout ran out.
    Stand(u8),
    /// Leader: refresh the heartbeat.
    Refresh(u8),
    /// Leader whose refresh no majority took for an election timeout.
    Overdue(u8),
    /// Leader whose window died: read the term register.
    CheckTerm(u8),
    /// Close a batch of the admitted requests and start serving it.
    Close(u8),
    /// The election operation in flight timed out (its outcome unknown).
    ElectTimeout(u8),
    /// The batch's operation timed out (its outcome unknown).
    ServeTimeout(u8),
    /// A client sends its next request.
    Request(u8),
    /// A client's request timed out: it sends it to the next broker (the first may
    /// still answer).
    Retry(u8),
}

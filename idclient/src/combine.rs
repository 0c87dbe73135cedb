//! Combined rounds: what direct clients do under contention instead of fighting.
//!
//! Contending clients that each send their own conditional write collide: one write wins
//! per node per fsync, the others are rejected and back off, and every rejected write
//! costs each node a script run. So once a client has lost a round to another writer it
//! meets the others at a rendezvous on one node (the one with the smallest address) and
//! they share rounds, the way the broker's callers do (DESIGN.md, "The broker"):
//!
//! - A request *joins* the open batch and gets its offset in it, or opens a batch and
//!   leads it, or (no batch open, none in flight) runs a batch of its own at once.
//! - A leader *closes* its batch when no batch is in flight (at most one round at a time,
//!   so batches grow while a round runs), reserves the batch's whole range in one
//!   ordinary quorum round (the conditional write, retried as usual), and *finishes*: it
//!   publishes the range, or the failure, to the members.
//! - A member takes the IDs at its offset from the published range. If the leader fails
//!   or vanishes, the member stops waiting when the leader's deadline has passed and joins
//!   again.
//!
//! Safety still comes from the conditional write alone: a member's IDs lie inside a range
//! that a majority accepted, offsets within a batch are handed out by one atomic script
//! and never overlap, and the batch was closed (so the round started) after every member
//! had joined, hence after it was invoked: its IDs are above every ID returned before.
//! The rendezvous is volatile (no AOF, keys expire) and only decides who writes; a lost
//! or restarted rendezvous node costs waiting and holes, never a duplicate. Without it
//! (first node down, paused or stuck) clients combine at the second node, and without
//! both they fall back to their own rounds with backoff. The simulation's nodes model
//! the rendezvous too (`idtools::sim`), checked against the Lua script on a real
//! redis-server by idclient/tests/script.rs.
//!
//! Where the code is: the protocol's types are `rendezvous.rs`, the node's side the
//! [`Rendezvous`] trait (`register.rs`), the client's state machine (join, then follow,
//! lead an open batch, or lead a batch of its own) `QuorumClient::combined` in
//! `quorum.rs`; this module holds a client's subscription to the results and the wait
//! for one batch's result.

use crate::register::{Register, Rendezvous};
use crate::rendezvous::{BatchResult, Nonce};
use futures::StreamExt;
use tokio::sync::broadcast;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// One client's subscription to the results channel, shared by its tasks: a task that is
/// about to join takes a receiver first, so it cannot miss its batch's result.
#[derive(Default)]
pub struct Results {
    /// The subscription: which node, its sender, and the task that feeds it.
    live: tokio::sync::Mutex<Option<(usize, broadcast::WeakSender<BatchResult>, AbortHandle)>>,
}

/// Results a slow task may fall behind by before it loses some (it then waits until its
/// timeout and joins again).
const BACKLOG: usize = 4096;

impl Results {
    /// A receiver of every result from now on at node number `index`, subscribing first
    /// if needed (and ending a subscription to another node). `None` when the node
    /// cannot be subscribed to.
    pub async fn receiver<N: Register + Rendezvous>(
        &self,
        index: usize,
        node: &N,
        key: &str,
    ) -> Option<broadcast::Receiver<BatchResult>> {
        let mut live = self.live.lock().await;
        if let Some((at, weak, task)) = live.as_ref() {
            match weak.upgrade() {
                Some(tx) if *at == index => return Some(tx.subscribe()),
                _ => task.abort(),
            }
        }
        let mut messages = match node.subscribe(key).await {
            Ok(messages) => messages,
            Err(e) => {
                tracing::debug!(node = node.addr(), error = ?e, "no rendezvous results channel");
                return None;
            }
        };
        let (tx, rx) = broadcast::channel(BACKLOG);
        let weak = tx.downgrade();
        // The task owns the only sender: when the connection ends, receivers see Closed.
        let task = tokio::spawn(async move {
            while let Some(message) = messages.next().await {
                if let Some(result) = BatchResult::parse(&message) {
                    let _ = tx.send(result);
                }
            }
        });
        *live = Some((index, weak, task.abort_handle()));
        Some(rx)
    }
}

impl Drop for Results {
    fn drop(&mut self) {
        if let Some((_, _, task)) = self.live.get_mut().take() {
            task.abort();
        }
    }
}

/// Why waiting for a batch ended without its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// No result by the time given.
    TimedOut,
    /// The subscription ended (connection lost).
    Closed,
}

/// Waits for `batch`'s result until `until`; every other result seen goes to `seen`
/// (the client learns the register's progress from them).
pub async fn wait_for(
    rx: &mut broadcast::Receiver<BatchResult>,
    batch: Nonce,
    until: Instant,
    mut seen: impl FnMut(&BatchResult),
) -> Result<BatchResult, WaitEnd> {
    loop {
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Ok(result)) => {
                seen(&result);
                if result.batch == batch {
                    return Ok(result);
                }
            }
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => continue,
            Ok(Err(broadcast::error::RecvError::Closed)) => return Err(WaitEnd::Closed),
            Err(_) => return Err(WaitEnd::TimedOut),
        }
    }
}

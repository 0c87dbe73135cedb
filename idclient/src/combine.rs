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
//! the rendezvous too (`testkit::sim`), checked against the Lua script on a real
//! redis-server by idclient/tests/script.rs.
//!
//! Where the code is: the protocol's types are `rendezvous.rs`, the node's side the
//! [`Rendezvous`] trait (`register.rs`), the client's state machine (join, then follow,
//! lead an open batch, or lead a batch of its own) `QuorumClient::combined` in
//! `quorum/combining.rs`; this module holds a client's subscription to the results and the wait
//! for one batch's result.

use crate::register::{Register, Rendezvous};
use crate::rendezvous::{BatchResult, Nonce};
use futures::StreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::broadcast;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// One client's subscriptions to the results channels of its rendezvous nodes (the
/// preferred one and the fallback), shared by its tasks: a task that is about to join
/// takes a receiver first, so it cannot miss its batch's result.
#[derive(Default)]
pub struct Results {
    /// Per node subscribed to: its number, its sender, and the task that feeds it. At
    /// most the two rendezvous nodes, so a client that moves to the fallback and back
    /// keeps both channels instead of subscribing afresh each time.
    live: std::sync::Mutex<Vec<Subscription>>,
}

/// One node's results channel (see [`Results`]).
struct Subscription {
    index: usize,
    sender: broadcast::WeakSender<BatchResult>,
    task: AbortHandle,
    /// Messages received on it so far: a node that publishes is running its scripts.
    heard: Arc<AtomicU64>,
}

/// Results a slow task may fall behind by before it loses some (it then waits until its
/// timeout and joins again).
const BACKLOG: usize = 4096;

impl Results {
    /// A receiver of every result from now on at node number `index`, subscribing first
    /// if needed. `None` when the node cannot be subscribed to.
    ///
    /// The lock is not held while subscribing: a task subscribing to a silent node must
    /// not hold up the client's other tasks, which may be combining at another node.
    pub async fn receiver<N: Register + Rendezvous>(
        &self,
        index: usize,
        node: &N,
        key: &str,
    ) -> Option<broadcast::Receiver<BatchResult>> {
        if let Some(rx) = self.existing(index) {
            return Some(rx);
        }
        let mut messages = match node.subscribe(key).await {
            Ok(messages) => messages,
            Err(e) => {
                tracing::debug!(node = node.addr(), error = ?e, "no rendezvous results channel");
                return None;
            }
        };
        let mut live = self.lock();
        // Another task may have subscribed meanwhile: use its channel, drop ours.
        if let Some(rx) = Self::find(&mut live, index) {
            return Some(rx);
        }
        let (tx, rx) = broadcast::channel(BACKLOG);
        let sender = tx.downgrade();
        let heard = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&heard);
        // The task owns the only sender: when the connection ends, receivers see Closed.
        let task = tokio::spawn(async move {
            while let Some(message) = messages.next().await {
                counter.fetch_add(1, Ordering::Relaxed);
                if let Some(result) = BatchResult::parse(&message) {
                    let _ = tx.send(result);
                }
            }
        });
        live.push(Subscription {
            index,
            sender,
            task: task.abort_handle(),
            heard,
        });
        Some(rx)
    }

    /// How many messages the subscription to node `index` has received (0 without one).
    /// A count that grows while a call to the node waits shows the node is running
    /// scripts: it is slow, not paused or gone.
    pub fn heard(&self, index: usize) -> u64 {
        self.lock()
            .iter()
            .find(|s| s.index == index)
            .map_or(0, |s| s.heard.load(Ordering::Relaxed))
    }

    /// A receiver on the live subscription to node `index`, if there is one.
    fn existing(&self, index: usize) -> Option<broadcast::Receiver<BatchResult>> {
        Self::find(&mut self.lock(), index)
    }

    /// A receiver on the live subscription to node `index` in `live`, if there is one;
    /// a subscription whose connection ended is removed.
    fn find(
        live: &mut Vec<Subscription>,
        index: usize,
    ) -> Option<broadcast::Receiver<BatchResult>> {
        let at = live.iter().position(|s| s.index == index)?;
        match live[at].sender.upgrade() {
            Some(tx) => Some(tx.subscribe()),
            None => {
                live.swap_remove(at).task.abort();
                None
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Subscription>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Results {
    fn drop(&mut self) {
        let live = self.live.get_mut().unwrap_or_else(|p| p.into_inner());
        for subscription in live.drain(..) {
            subscription.task.abort();
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
pub async fn await_result(
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

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

use crate::node::Register;
use crate::IdRange;
use futures::StreamExt;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// How long a leader holds the rendezvous: `round` for a batch in flight, `batch` for an
/// open batch (which may first wait up to `round` for the batch in flight before it).
/// When a lease runs out the members stop waiting and join again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leases {
    pub round: Duration,
    pub batch: Duration,
}

/// What `join` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// Joined the open batch `batch` at `offset`; its leader's lease ends in `wait`.
    Follow {
        batch: Nonce,
        offset: u64,
        wait: Duration,
    },
    /// Nothing open, nothing in flight: the caller's batch (its request alone) is in
    /// flight now; run it.
    Solo,
    /// The caller opened a batch and leads it; `busy` is in flight for up to `wait`.
    Lead { busy: Nonce, wait: Duration },
    /// The open batch is full: run an ordinary round.
    Full,
}

/// What `close` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// Closed and now in flight: reserve `ids` IDs for it.
    Closed { ids: u64 },
    /// Batch `busy` is still in flight, for up to `wait`.
    Busy { busy: Nonce, wait: Duration },
    /// The batch is gone (expired, or the node restarted): its members will join again.
    Gone,
}

/// The outcome of one batch, as published to its members: `"<batch> <lo> <hi>"`, or
/// `"<batch> failed"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchResult {
    pub batch: Nonce,
    pub range: Option<IdRange>,
}

impl BatchResult {
    pub fn message(&self) -> String {
        match self.range {
            Some(r) => format!("{} {} {}", self.batch, r.lo, r.hi),
            None => format!("{} failed", self.batch),
        }
    }

    /// `None` for anything else: a stranger's message on the channel is ignored.
    pub fn parse(message: &str) -> Option<BatchResult> {
        let mut words = message.split(' ');
        let batch = Nonce::parse(words.next()?.as_bytes())?;
        let result = match (words.next()?, words.next()) {
            ("failed", None) => BatchResult { batch, range: None },
            (lo, Some(hi)) => {
                let (lo, hi): (u64, u64) = (lo.parse().ok()?, hi.parse().ok()?);
                if lo == 0 || lo > hi {
                    return None;
                }
                BatchResult {
                    batch,
                    range: Some(IdRange { lo, hi }),
                }
            }
            _ => return None,
        };
        words.next().is_none().then_some(result)
    }
}

/// The IDs at `offset` of a published batch range, if they lie inside it.
pub fn member_range(batch: IdRange, offset: u64, n: u64) -> Option<IdRange> {
    let lo = batch.lo.checked_add(offset)?;
    let hi = lo.checked_add(n.checked_sub(1)?)?;
    (hi <= batch.hi).then_some(IdRange { lo, hi })
}

/// A batch's name. Members take the IDs at their offset from the result published under
/// it, so two live batches must never share one: 128 random bits from the thread's
/// CSPRNG make that as unlikely as two equal random UUIDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nonce(pub u128);

impl Nonce {
    pub fn random() -> Nonce {
        Nonce(rand::random())
    }

    /// 32 lowercase hex digits: how it travels (Lua compares it as a string).
    pub fn parse(s: &[u8]) -> Option<Nonce> {
        if s.len() != 32
            || !s
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
        {
            return None;
        }
        u128::from_str_radix(std::str::from_utf8(s).ok()?, 16)
            .ok()
            .map(Nonce)
    }
}

impl std::fmt::Display for Nonce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

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
    pub async fn receiver<N: Register>(
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn messages_round_trip() {
        for result in [
            BatchResult {
                batch: Nonce(7),
                range: Some(IdRange { lo: 1, hi: 1 }),
            },
            BatchResult {
                batch: Nonce(u128::MAX),
                range: Some(IdRange {
                    lo: 1 << 63,
                    hi: u64::MAX,
                }),
            },
            BatchResult {
                batch: Nonce::random(),
                range: None,
            },
        ] {
            assert_eq!(BatchResult::parse(&result.message()), Some(result));
        }
    }

    #[test]
    fn strangers_messages_are_ignored() {
        let n = "0000000000000000000000000000002a";
        for bad in [
            String::new(),
            "x".to_string(),
            "42 1 2".to_string(),
            n.to_string(),
            format!("{n} 2"),
            format!("{n} 2 3 4"),
            format!("{n} 3 2"),
            format!("{n} 0 5"),
            format!("{n} failed 2"),
            format!("{n} 2 99999999999999999999"),
            format!("{} 2 3", n.to_uppercase()),
            "000000000000000000000000000000ZZ 1 2".to_string(),
        ] {
            assert_eq!(BatchResult::parse(&bad), None, "{bad:?}");
        }
        assert_eq!(
            BatchResult::parse(&format!("{n} 2 3")),
            Some(BatchResult {
                batch: Nonce(42),
                range: Some(IdRange { lo: 2, hi: 3 })
            })
        );
    }

    #[test]
    fn member_ranges_stay_inside_the_batch() {
        let batch = IdRange { lo: 10, hi: 19 };
        assert_eq!(member_range(batch, 0, 1), Some(IdRange { lo: 10, hi: 10 }));
        assert_eq!(member_range(batch, 7, 3), Some(IdRange { lo: 17, hi: 19 }));
        assert_eq!(member_range(batch, 8, 3), None);
        assert_eq!(member_range(batch, 10, 1), None);
        assert_eq!(
            member_range(
                IdRange {
                    lo: u64::MAX,
                    hi: u64::MAX
                },
                1,
                1
            ),
            None
        );
        assert_eq!(member_range(batch, 0, 0), None);
    }

    proptest! {
        // Members at consecutive offsets get disjoint, adjacent ranges.
        #[test]
        fn offsets_partition_the_batch(lo in 1u64..1 << 40, sizes in proptest::collection::vec(1u64..100, 1..20)) {
            let total: u64 = sizes.iter().sum();
            let batch = IdRange { lo, hi: lo + total - 1 };
            let mut next = lo;
            let mut offset = 0;
            for n in sizes {
                let r = member_range(batch, offset, n).expect("inside");
                prop_assert_eq!(r.lo, next);
                prop_assert_eq!(r.hi - r.lo + 1, n);
                next = r.hi + 1;
                offset += n;
            }
            prop_assert_eq!(next, batch.hi + 1);
        }
    }
}

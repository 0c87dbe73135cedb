//! One conditional-write round: the write sent to every node in parallel, its replies
//! tallied until the outcome is certain ([`decide`]).

use super::counters::bump;
use super::{Combine, Protocol, QuorumClient, RoundLoss, CUT_BY_DEADLINE};
use crate::register::{Register, WriteOutcome, WriteReply};
use crate::rendezvous::Nonce;
use futures::stream::{FuturesUnordered, StreamExt};
use idproto::NodeFailure;
use std::sync::atomic::Ordering;
use tokio::time::Instant;

/// Replies of one round so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub accepts: usize,
    pub rejects: usize,
    pub failures: usize,
    /// Highest register value any node reported (accepted HI included).
    pub max_seen: u64,
}

/// Where a round stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Neither outcome is certain yet.
    Pending,
    /// A majority accepted: the range is generated.
    Won,
    /// A majority can no longer accept.
    Lost,
}

/// The quorum decision, a pure function of the node count and the replies so far.
pub fn decide(nodes: usize, tally: &Tally) -> Decision {
    let majority = nodes / 2 + 1;
    if tally.accepts >= majority {
        Decision::Won
    } else if tally.rejects + tally.failures > nodes - majority {
        Decision::Lost
    } else {
        Decision::Pending
    }
}

impl<N: Register> QuorumClient<N> {
    /// The conditional write of `lo..=hi` on every node; ends as soon as the outcome is
    /// certain (late replies are dropped: they cannot change it).
    pub(super) async fn write_round(
        &self,
        lo: u64,
        hi: u64,
        deadline: Instant,
        batch: Option<Nonce>,
    ) -> Result<(), RoundLoss> {
        bump(&self.counters.rounds, 1);
        let started = Instant::now();
        let (decision, tally, failures) = self.collect_writes(lo, hi, deadline, batch).await?;
        self.last_known.fetch_max(tally.max_seen, Ordering::Relaxed);
        self.round_time.record(started.elapsed());
        bump(&self.counters.rejects, tally.rejects as u64);
        match decision {
            Decision::Won => Ok(()),
            // Only the nodes that answered (a node still silent when the loss became
            // certain did not, nor is it among the failures).
            _ if tally.failures > self.nodes.len() - self.majority() => {
                Err(RoundLoss::Unreachable {
                    reachable: tally.accepts + tally.rejects,
                    accepted: Some(tally.accepts),
                    failures,
                })
            }
            _ => {
                if tally.accepts > 0 {
                    bump(&self.counters.burned, hi - lo + 1);
                }
                Err(RoundLoss::Contention {
                    all_rejected: tally.accepts == 0,
                })
            }
        }
    }

    /// Sends the conditional write to every node and tallies the replies until the
    /// decision is certain, every node answered, or the deadline passed (then `Lost`).
    async fn collect_writes(
        &self,
        lo: u64,
        hi: u64,
        deadline: Instant,
        batch: Option<Nonce>,
    ) -> Result<(Decision, Tally, Vec<NodeFailure>), RoundLoss> {
        let mut pending: FuturesUnordered<_> =
            self.nodes
                .iter()
                .enumerate()
                .map(|(i, node)| async move {
                    (i, node.conditional_write(&self.key, lo, hi, batch).await)
                })
                .collect();
        let mut tally = Tally::default();
        let mut failures = Vec::new();
        let mut answered = vec![false; self.nodes.len()];
        loop {
            let Some((i, reply)) = self
                .next_reply(&mut pending, &mut answered, &mut failures, deadline)
                .await
            else {
                tally.failures = failures.len();
                return Ok((Decision::Lost, tally, failures));
            };
            match reply {
                Ok(written) => self.count_write(&mut tally, written, hi),
                Err(e) => {
                    self.note_failure(&self.nodes[i], e, &mut failures)?;
                    tally.failures += 1;
                }
            }
            match decide(self.nodes.len(), &tally) {
                Decision::Pending => continue,
                done => return Ok((done, tally, failures)),
            }
        }
    }

    /// Adds one node's answer to the conditional write of `..=hi` to `tally`.
    fn count_write(&self, tally: &mut Tally, written: WriteOutcome, hi: u64) {
        if written.combining
            && self.protocol == Protocol::Fast
            && self.combine.mode == Combine::Auto
        {
            // Others share rounds at the rendezvous: join them next time rather than
            // race their leaders.
            self.combine.contended.store(true, Ordering::Relaxed);
        }
        match written.reply {
            WriteReply::Accepted => {
                tally.accepts += 1;
                tally.max_seen = tally.max_seen.max(hi);
            }
            WriteReply::Rejected { current } => {
                tally.rejects += 1;
                tally.max_seen = tally.max_seen.max(current);
            }
        }
    }

    /// The next node reply of a round, or `None` when every node answered or the deadline
    /// passed; then every node that has not answered is added to `failures`.
    async fn next_reply<T>(
        &self,
        pending: &mut FuturesUnordered<impl std::future::Future<Output = (usize, T)>>,
        answered: &mut [bool],
        failures: &mut Vec<NodeFailure>,
        deadline: Instant,
    ) -> Option<(usize, T)> {
        match tokio::time::timeout_at(deadline, pending.next()).await {
            Ok(Some((i, reply))) => {
                answered[i] = true;
                Some((i, reply))
            }
            Ok(None) => None,
            Err(_) => {
                for (i, (node, _)) in self
                    .nodes
                    .iter()
                    .zip(answered.iter())
                    .enumerate()
                    .filter(|(_, (_, done))| !**done)
                {
                    self.count_node_failure(i, true);
                    failures.push(NodeFailure {
                        addr: node.addr().to_string(),
                        reason: CUT_BY_DEADLINE.to_string(),
                    });
                }
                None
            }
        }
    }
}

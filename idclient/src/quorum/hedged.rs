//! The majority read (classic rounds, window confirmations): thrifty, asking a majority
//! first, hedged by asking the others once the answers are overdue.

use super::{QuorumClient, RoundLoss, CUT_BY_DEADLINE};
use crate::register::Register;
use crate::MovingAverage;
use futures::stream::{FuturesUnordered, StreamExt};
use idproto::NodeFailure;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// A majority read asks the other nodes too once its answers take this many usual read
/// times.
pub const READ_HEDGE_READS: u32 = 4;

/// The shortest wait before a majority read asks the other nodes.
pub const MIN_READ_HEDGE: Duration = Duration::from_micros(500);

/// What the majority reads keep between calls.
pub(super) struct Reads {
    /// How long a majority read takes: the read hedge's unit.
    time: MovingAverage,
    /// The node a majority read asks first, in turn.
    cursor: AtomicUsize,
}

impl Reads {
    /// No read timed yet: the first estimate is `initial`.
    pub(super) fn new(initial: Duration) -> Reads {
        Reads {
            time: MovingAverage::new(initial),
            cursor: AtomicUsize::new(0),
        }
    }
}

impl<N: Register> QuorumClient<N> {
    /// Classic step 1: GET from every node, max of a majority of answers.
    pub(super) async fn read_round(&self, deadline: Instant) -> Result<u64, RoundLoss> {
        let started = Instant::now();
        let count = self.nodes.len();
        let need = self.majority();
        // Thrifty: ask a majority, starting at the next node in turn so reads spread
        // evenly; one more for each that fails, and all the rest once the answers are
        // overdue (a hedge against a slow or silent node). Any majority will do: it
        // holds every value a majority accepted before this call.
        let first = self.reads.cursor.fetch_add(1, Ordering::Relaxed) % count;
        let order: Vec<usize> = (0..count).map(|k| (first + k) % count).collect();
        let ask = |i: usize| {
            let node = &self.nodes[i];
            async move { (i, node.read(&self.key).await) }
        };
        let mut pending: FuturesUnordered<_> = order[..need].iter().map(|&i| ask(i)).collect();
        let mut unasked = order[need..].iter();
        let mut outstanding = vec![false; count];
        for &i in &order[..need] {
            outstanding[i] = true;
        }
        let hedge_at = started + self.read_hedge();
        let mut hedged = false;
        let (mut answers, mut max, mut failures) = (0, 0u64, Vec::new());
        loop {
            let wake = if hedged {
                deadline
            } else {
                deadline.min(hedge_at)
            };
            let (i, reply) = match tokio::time::timeout_at(wake, pending.next()).await {
                Ok(Some(reply)) => reply,
                Ok(None) => break,
                Err(_) if !hedged && Instant::now() < deadline => {
                    hedged = true;
                    for &i in unasked.by_ref() {
                        outstanding[i] = true;
                        pending.push(ask(i));
                    }
                    continue;
                }
                Err(_) => {
                    for (i, node) in self.nodes.iter().enumerate() {
                        if outstanding[i] {
                            self.count_node_failure(i, true);
                            failures.push(NodeFailure {
                                addr: node.addr().to_string(),
                                reason: CUT_BY_DEADLINE.to_string(),
                            });
                        }
                    }
                    break;
                }
            };
            outstanding[i] = false;
            match reply {
                Ok(v) => {
                    answers += 1;
                    max = max.max(v);
                }
                Err(e) => {
                    self.note_failure(&self.nodes[i], e, &mut failures)?;
                    if let Some(&next) = unasked.next() {
                        outstanding[next] = true;
                        pending.push(ask(next));
                    }
                }
            }
            if answers >= need {
                self.last_known.fetch_max(max, Ordering::Relaxed);
                if !hedged {
                    // Only reads the first majority answered count: a hedged read's time
                    // is the hedge's, and feeding it back would grow the hedge with
                    // every read that meets a silent node, up to half a reply timeout.
                    self.reads.time.record(started.elapsed());
                }
                return Ok(max);
            }
            if failures.len() > count - need {
                break;
            }
        }
        // Only the nodes that answered: a node never asked (the read is thrifty) or still
        // silent at the deadline did not, and counting it said "3 of 5 nodes answered,
        // 3 needed" of a read that one node answered.
        Err(RoundLoss::Unreachable {
            reachable: answers,
            accepted: None,
            failures,
        })
    }

    /// How long a read waits for its first majority before asking the other nodes:
    /// a few times the usual read, at least [`MIN_READ_HEDGE`], at most half a reply
    /// timeout.
    fn read_hedge(&self) -> Duration {
        let usual = self.reads.time.get();
        (usual * READ_HEDGE_READS)
            .clamp(MIN_READ_HEDGE, (self.reply_timeout / 2).max(MIN_READ_HEDGE))
    }
}

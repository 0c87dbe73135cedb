//! The majority read (classic rounds, window confirmations): thrifty, asking a majority
//! first, hedged by asking the others once the answers are overdue.

use super::{QuorumClient, RoundLoss, CUT_BY_DEADLINE};
use crate::register::Register;
use crate::MovingAverage;
use futures::stream::{FuturesUnordered, StreamExt};
use idproto::NodeFailure;
use std::future::Future;
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

/// The nodes a majority read asked, in `order`: the reads in flight, and who is still
/// to answer (`outstanding`) or still unasked.
struct Asked<'o, A, F> {
    /// Starts the read of one node.
    read: A,
    pending: FuturesUnordered<F>,
    unasked: std::slice::Iter<'o, usize>,
    outstanding: Vec<bool>,
}

impl<'o, A: Fn(usize) -> F, F: Future> Asked<'o, A, F> {
    /// Asks the first `need` nodes of `order` (a permutation of the node indexes).
    fn new(order: &'o [usize], need: usize, read: A) -> Asked<'o, A, F> {
        debug_assert!(need >= 1 && need <= order.len());
        let mut asked = Asked {
            read,
            pending: FuturesUnordered::new(),
            unasked: order[need..].iter(),
            outstanding: vec![false; order.len()],
        };
        for &i in &order[..need] {
            asked.ask(i);
        }
        asked
    }

    fn ask(&mut self, i: usize) {
        debug_assert!(!self.outstanding[i], "node {i} asked twice");
        self.outstanding[i] = true;
        self.pending.push((self.read)(i));
    }

    /// One more node, for one that failed (none left: nothing).
    fn ask_one_more(&mut self) {
        if let Some(&i) = self.unasked.next() {
            self.ask(i);
        }
    }

    /// Every node not asked yet: the hedge.
    fn ask_the_rest(&mut self) {
        while let Some(&i) = self.unasked.next() {
            self.ask(i);
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
        let mut asked = Asked::new(&order, need, |i: usize| {
            let node = &self.nodes[i];
            async move { (i, node.read(&self.key).await) }
        });
        let hedge_at = started + self.read_hedge();
        let mut hedged = false;
        let (mut answers, mut max, mut failures) = (0, 0u64, Vec::new());
        loop {
            let wake = if hedged {
                deadline
            } else {
                deadline.min(hedge_at)
            };
            let (i, reply) = match tokio::time::timeout_at(wake, asked.pending.next()).await {
                Ok(Some(reply)) => reply,
                Ok(None) => break,
                Err(_) if !hedged && Instant::now() < deadline => {
                    hedged = true;
                    asked.ask_the_rest();
                    continue;
                }
                Err(_) => {
                    self.cut_by_deadline(&asked.outstanding, &mut failures);
                    break;
                }
            };
            asked.outstanding[i] = false;
            match reply {
                Ok(v) => {
                    answers += 1;
                    max = max.max(v);
                }
                Err(e) => {
                    self.note_failure(&self.nodes[i], e, &mut failures)?;
                    asked.ask_one_more();
                }
            }
            if answers >= need {
                self.read_won(max, started, hedged);
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

    /// A majority answered `max`: the fast protocol's next guess, and (for a read the
    /// first majority answered) the read time the hedge is measured in.
    fn read_won(&self, max: u64, started: Instant, hedged: bool) {
        self.last_known.fetch_max(max, Ordering::Relaxed);
        if !hedged {
            // Only reads the first majority answered count: a hedged read's time
            // is the hedge's, and feeding it back would grow the hedge with
            // every read that meets a silent node, up to half a reply timeout.
            self.reads.time.record(started.elapsed());
        }
    }

    /// The deadline ended a read: every node asked and still silent is a failure.
    fn cut_by_deadline(&self, outstanding: &[bool], failures: &mut Vec<NodeFailure>) {
        debug_assert_eq!(outstanding.len(), self.nodes.len());
        for (i, node) in self.nodes.iter().enumerate() {
            if outstanding[i] {
                self.count_node_failure(i, true);
                failures.push(NodeFailure {
                    addr: node.addr().to_string(),
                    reason: CUT_BY_DEADLINE.to_string(),
                });
            }
        }
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

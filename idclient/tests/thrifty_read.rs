//! Majority reads (`QuorumClient::read_max`, a window confirmation) ask a majority, not
//! every node: one more node for each that fails, and the rest once the answers are
//! overdue. Fake nodes on tokio's paused clock: each counts the reads it got and
//! answers at once, fails at once, or never answers.

use idclient::{IdError, NodeError, Nonce, Protocol, QuorumClient, Register, WriteOutcome};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

#[derive(Clone, Copy)]
enum Behaviour {
    Answer(u64),
    Fail,
    Silent,
}

#[derive(Clone)]
struct Fake {
    addr: String,
    behaviour: Behaviour,
    reads: Arc<AtomicU64>,
}

impl Register for Fake {
    fn addr(&self) -> &str {
        &self.addr
    }

    fn conditional_write(
        &self,
        _key: &str,
        _lo: u64,
        _hi: u64,
        _batch: Option<Nonce>,
    ) -> impl Future<Output = Result<WriteOutcome, NodeError>> + Send {
        std::future::ready(Err(NodeError::Unavailable("reads only".to_string())))
    }

    fn read(&self, _key: &str) -> impl Future<Output = Result<u64, NodeError>> + Send {
        self.reads.fetch_add(1, Relaxed);
        let behaviour = self.behaviour;
        async move {
            match behaviour {
                Behaviour::Answer(v) => Ok(v),
                Behaviour::Fail => Err(NodeError::Unavailable("connection refused".to_string())),
                Behaviour::Silent => std::future::pending().await,
            }
        }
    }

    fn warm_up(&self) -> impl Future<Output = Result<(), NodeError>> + Send {
        std::future::ready(Ok(()))
    }
}

fn quorum(behaviours: &[Behaviour]) -> (QuorumClient<Fake>, Vec<Arc<AtomicU64>>) {
    let nodes: Vec<Fake> = behaviours
        .iter()
        .enumerate()
        .map(|(i, &behaviour)| Fake {
            addr: format!("fake://{i}"),
            behaviour,
            reads: Arc::default(),
        })
        .collect();
    let reads = nodes.iter().map(|n| n.reads.clone()).collect();
    let client = QuorumClient::with_nodes(nodes, "k", Protocol::Fast, Duration::from_secs(5))
        .expect("five fake nodes");
    (client, reads)
}

fn counts(reads: &[Arc<AtomicU64>]) -> Vec<u64> {
    reads.iter().map(|r| r.load(Relaxed)).collect()
}

fn later() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

/// Healthy nodes: each read asks exactly a majority, the first node in turn, so five
/// reads ask every node three times; the largest answer of the majority is returned.
#[tokio::test(start_paused = true)]
async fn a_read_asks_a_majority_in_turn() {
    use Behaviour::Answer;
    let (q, reads) = quorum(&[Answer(7), Answer(9), Answer(8), Answer(1), Answer(2)]);
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(q.read_max(later()).await.expect("a majority answers"));
    }
    assert_eq!(counts(&reads), [3, 3, 3, 3, 3]);
    // Nodes 0..=2, 1..=3, 2..=4, then 3, 4, 0 and 4, 0, 1.
    assert_eq!(got, [9, 9, 8, 7, 9]);
}

/// A node that fails at once is replaced by the next one at once: no wait.
#[tokio::test(start_paused = true)]
async fn a_failed_node_is_replaced_at_once() {
    use Behaviour::{Answer, Fail};
    let (q, reads) = quorum(&[Fail, Answer(5), Answer(5), Answer(6), Answer(5)]);
    let started = Instant::now();
    assert_eq!(q.read_max(later()).await.expect("majority"), 6);
    assert_eq!(counts(&reads), [1, 1, 1, 1, 0]);
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "no hedge wait on the paused clock"
    );
}

/// A node that never answers costs the hedge, then the others are asked.
#[tokio::test(start_paused = true)]
async fn a_silent_node_costs_the_hedge_then_the_rest_are_asked() {
    use Behaviour::{Answer, Silent};
    let (q, reads) = quorum(&[Silent, Answer(3), Answer(4), Answer(3), Answer(3)]);
    let started = Instant::now();
    assert_eq!(q.read_max(later()).await.expect("majority"), 4);
    // Node 3 answered at once when asked, so node 4's read was never sent (a future
    // sends its read when first polled).
    assert_eq!(counts(&reads)[..4], [1, 1, 1, 1]);
    let waited = started.elapsed();
    assert!(
        waited >= idclient::MIN_READ_HEDGE && waited < Duration::from_secs(1),
        "{waited:?}"
    );
}

/// Without a majority able to answer the read fails, naming every node that failed.
#[tokio::test(start_paused = true)]
async fn too_few_nodes_is_no_quorum() {
    use Behaviour::{Answer, Fail};
    let (q, _) = quorum(&[Fail, Answer(1), Fail, Fail, Answer(1)]);
    match q.read_max(later()).await {
        Err(IdError::NoQuorum {
            needed, failures, ..
        }) => {
            assert_eq!(needed, 3);
            assert_eq!(failures.len(), 3, "{failures:?}");
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
}

/// A read cut by its deadline before the hedge counts as answered only the node that
/// answered: not the two silent ones, nor the two never asked. (It once said "3 of 5
/// nodes answered, 3 needed" here.)
#[tokio::test(start_paused = true)]
async fn a_read_cut_by_the_deadline_counts_only_the_nodes_that_answered() {
    use Behaviour::{Answer, Silent};
    let (q, reads) = quorum(&[Answer(1), Silent, Silent, Answer(1), Answer(1)]);
    // Before the first hedge (four initial read times, 2 ms): nodes 3 and 4 are not asked.
    let deadline = Instant::now() + Duration::from_millis(1);
    let err = q
        .read_max(deadline)
        .await
        .expect_err("one answer of three needed");
    assert_eq!(counts(&reads), [1, 1, 1, 0, 0]);
    let IdError::NoQuorum {
        needed,
        reachable,
        accepted,
        total,
        ref failures,
    } = err
    else {
        panic!("expected NoQuorum, got {err:?}");
    };
    // A read: nobody accepts anything, and the text says nothing of acceptance.
    assert_eq!(
        (needed, reachable, accepted, total, failures.len()),
        (3, 1, None, 5, 2),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "no quorum: 1 of 5 nodes answered, 3 needed; 4 did not (failed: fake://1: no reply before the deadline; fake://2: no reply before the deadline; 2 not asked, or not waited for)"
    );
}

/// A silent node does not make the hedge grow: reads that needed it do not count in the
/// usual read time, so every read that meets the silent node waits about the same.
#[tokio::test(start_paused = true)]
async fn the_hedge_does_not_grow_with_a_silent_node() {
    use Behaviour::{Answer, Silent};
    let (q, _) = quorum(&[Silent, Answer(3), Answer(4), Answer(3), Answer(3)]);
    let mut waits = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        q.read_max(later()).await.expect("majority");
        waits.push(started.elapsed());
    }
    // The first hedge is four initial read times (2 ms); it then falls to the minimum
    // (0.5 ms, which tokio's millisecond timer rounds up to 1 ms), never higher.
    let early = waits[..10].iter().max().copied().unwrap_or_default();
    let late = waits[40..].iter().max().copied().unwrap_or_default();
    assert!(
        late <= early && late <= Duration::from_millis(1),
        "the hedge grew: {waits:?}"
    );
}

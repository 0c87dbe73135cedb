//! The group-commit batcher: one quorum round at a time, serving every request queued
//! when the round starts from the one range it reserves.
//!
//! Why this keeps the generator linearizable: a request is put in a batch only after it
//! arrived, and the batch's round starts after that; the range the round reserves lies
//! above every range reserved by any round that finished before it started (the quorum
//! guarantee), hence above every ID returned before the request was sent. Splitting the
//! range in arrival order costs nothing and keeps one connection's pipelined requests
//! in the order it sent them.
//!
//! Deadlines: each request carries its own. A round runs until the LATEST deadline of
//! its batch (capped by the broker's bound, applied when the request was read), so no
//! request gives up earlier than it asked because a more impatient one shares its
//! round; and each request is answered with [`IdError::Deadline`] at its OWN deadline if
//! the round has not finished by then (its share of the range, should the round still
//! succeed, is burned: a hole, never handed out). Once every request of the batch has
//! been answered the round is abandoned (its outcome unknown, its IDs burned). Requests
//! queued behind a slow round are checked when the next batch forms: expired ones are
//! answered with `Deadline` without running a round for them; clients enforce their own
//! deadline as well, so a caller never waits past it.

use crate::serve::queue::IdRequest;
use crate::serve::source::RoundSource;
use crate::stats::Stats;
use futures::stream::{FuturesUnordered, StreamExt};
use idclient::shares::{Expire, Shares, Waiting};
use idclient::{IdError, IdRange};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The batcher's limits.
#[derive(Debug, Clone)]
pub(crate) struct BatcherConfig {
    /// Most requests one round serves.
    pub max_batch: usize,
    /// Most IDs one round reserves (requests beyond it wait for the next round).
    pub max_round_ids: u64,
    /// Named in the error sent to requests refused during shutdown.
    pub name: String,
    /// Rounds at once: 1 for write rounds (two from one client would contend with each
    /// other), more for window confirmations (each read starts after its batch closed).
    pub pipeline: usize,
}

/// Runs rounds until every sender of `rx` is gone and the queue is empty, at most
/// [`BatcherConfig::pipeline`] at once: a batch closes when fewer are running and the
/// first request of it has arrived. Rounds are started in the order their batches
/// closed (the source's futures are made, and first polled, in that order). Once
/// `stopping` is true, the rounds in flight finish and every request still queued is
/// refused with [`IdError::BrokersUnavailable`] (never started, safe to retry elsewhere).
pub(crate) async fn run<S: RoundSource>(
    source: Arc<S>,
    mut rx: mpsc::Receiver<IdRequest>,
    stats: Arc<Stats>,
    config: BatcherConfig,
    stopping: watch::Receiver<bool>,
) {
    let pipeline = config.pipeline.max(1);
    let mut rounds = FuturesUnordered::new();
    let mut carry: Option<IdRequest> = None;
    loop {
        if rounds.len() >= pipeline {
            rounds.next().await;
            continue;
        }
        let first = match carry.take() {
            Some(p) => p,
            None => tokio::select! {
                p = rx.recv() => match p {
                    Some(p) => p,
                    None => break,
                },
                Some(()) = rounds.next(), if !rounds.is_empty() => continue,
            },
        };
        let mut batch: Vec<IdRequest> = Vec::new();
        let now = Instant::now();
        let mut total = 0u64;
        let mut next = Some(first);
        while let Some(p) = next.take() {
            if *stopping.borrow() {
                refuse(p, &config.name, &stats);
            } else if p.deadline <= now {
                p.expired(&stats);
            } else {
                match total.checked_add(p.count) {
                    Some(t) if t <= config.max_round_ids || batch.is_empty() => {
                        total = t;
                        batch.push(p);
                    }
                    _ => {
                        carry = Some(p);
                        break;
                    }
                }
            }
            if batch.len() >= config.max_batch {
                break;
            }
            next = rx.try_recv().ok();
        }
        let Some(round_deadline) = batch.iter().map(|p| p.deadline).max() else {
            continue;
        };
        let fut = source.next_ids_until(total, round_deadline);
        rounds.push(round(fut, batch, total, &stats));
    }
    // Rounds still in flight answer their batches; the broker waits for them.
    while rounds.next().await.is_some() {}
}

fn refuse(p: IdRequest, name: &str, stats: &Stats) {
    let failure = idproto::error::NodeFailure {
        addr: name.to_string(),
        reason: "broker is shutting down; the request was not started, retry on another broker"
            .to_string(),
    };
    p.answer(
        Err(IdError::BrokersUnavailable {
            failures: vec![failure],
        }),
        stats,
    );
}

/// One round (`fut`, for `total` IDs) for the whole batch; answers every request of
/// it, each exactly once.
async fn round(
    fut: impl Future<Output = Result<IdRange, IdError>>,
    batch: Vec<IdRequest>,
    total: u64,
    stats: &Stats,
) {
    let size = batch.len() as u64;
    let mut shares = Shares::new(batch.into_iter().map(|r| Counted(r, stats)).collect());
    debug_assert_eq!(
        shares.total(),
        total,
        "the round asks for the batch's total"
    );
    let started = Instant::now();
    let outcome = shares.wait(fut, Expire::Every).await;
    let took = started.elapsed();
    match outcome {
        None => {
            tracing::warn!(
                batch = size,
                ?took,
                "round abandoned: every request of the batch reached its deadline"
            );
            stats.round(size, took, false);
        }
        Some(Ok(range)) if range.holds_exactly(total) => {
            stats.round(size, took, true);
            tracing::trace!(batch = size, lo = range.lo, hi = range.hi, ?took, "round");
            shares.split(range);
        }
        Some(result) => {
            stats.round(size, took, false);
            shares.fail(&round_error(result, total, size, took));
        }
    }
}

/// A request of a batch, answered with the broker's counts kept.
struct Counted<'s>(IdRequest, &'s Stats);

impl Waiting for Counted<'_> {
    fn count(&self) -> u64 {
        self.0.count
    }

    fn deadline(&self) -> Instant {
        self.0.deadline
    }

    fn expire(self) {
        self.0.expired(self.1);
    }

    fn answer(self, result: Result<IdRange, IdError>) {
        self.0.answer(result, self.1);
    }
}

/// The error every request of a failed round gets: the round's own, or a protocol error
/// for a round that returned the wrong number of IDs.
fn round_error(result: Result<IdRange, IdError>, total: u64, size: u64, took: Duration) -> IdError {
    match result {
        Ok(range) => {
            tracing::error!(
                ?range,
                total,
                "quorum round returned the wrong number of IDs; failing the batch"
            );
            IdError::Protocol {
                addr: "quorum".to_string(),
                reason: format!(
                    "a round for {total} IDs returned {}..={}",
                    range.lo, range.hi
                ),
            }
        }
        Err(e) => {
            tracing::warn!(batch = size, ?took, "round failed: {e}");
            e
        }
    }
}

#[cfg(test)]
mod tests {
    //! Deterministic tests of the batcher against an in-process fake quorum, on tokio's
    //! paused clock (time only moves when every task is idle).

    use super::*;
    use crate::serve::queue::Outgoing;
    use idproto::wire::ServerMsg;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Mutex;
    use tokio::sync::Semaphore;

    /// A fake quorum: a counter, a log of round sizes, optional latency and failure.
    #[derive(Default)]
    struct Fake {
        next: AtomicU64,
        rounds: Mutex<Vec<u64>>,
        latency: Mutex<Duration>,
        fail: Mutex<Option<IdError>>,
        short: std::sync::atomic::AtomicBool,
    }

    impl RoundSource for Fake {
        fn next_ids_until(
            &self,
            n: u64,
            deadline: Instant,
        ) -> impl Future<Output = Result<IdRange, IdError>> + Send {
            let latency = *self.latency.lock().expect("lock");
            async move {
                self.rounds.lock().expect("lock").push(n);
                let done = Instant::now() + latency;
                if done > deadline {
                    tokio::time::sleep_until(deadline).await;
                    return Err(IdError::Deadline {
                        deadline: latency,
                        rounds: 1,
                    });
                }
                tokio::time::sleep_until(done).await;
                if let Some(e) = self.fail.lock().expect("lock").clone() {
                    return Err(e);
                }
                let n = if self.short.load(Relaxed) { n + 1 } else { n };
                let lo = self.next.fetch_add(n, Relaxed) + 1;
                Ok(IdRange { lo, hi: lo + n - 1 })
            }
        }
    }

    struct Harness {
        tx: mpsc::Sender<IdRequest>,
        replies: mpsc::Receiver<Outgoing>,
        reply_tx: mpsc::Sender<Outgoing>,
        stop: watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
        fake: Arc<Fake>,
        stats: Arc<Stats>,
    }

    fn start(fake: Fake, max_batch: usize) -> Harness {
        start_pipelined(fake, max_batch, 1)
    }

    fn start_pipelined(fake: Fake, max_batch: usize, pipeline: usize) -> Harness {
        let fake = Arc::new(fake);
        let stats = Arc::new(Stats::default());
        let (tx, rx) = mpsc::channel(1024);
        let (reply_tx, replies) = mpsc::channel(1024);
        let (stop, stopping) = watch::channel(false);
        let config = BatcherConfig {
            max_batch,
            max_round_ids: 1 << 40,
            name: "test".into(),
            pipeline,
        };
        let task = tokio::spawn(run(fake.clone(), rx, stats.clone(), config, stopping));
        Harness {
            tx,
            replies,
            reply_tx,
            stop,
            task,
            fake,
            stats,
        }
    }

    impl Harness {
        async fn send(&self, id: u64, count: u64, deadline: Duration) {
            let p = IdRequest {
                id,
                count,
                deadline: Instant::now() + deadline,
                requested: deadline,
                reply: self.reply_tx.clone(),
                permit: None,
            };
            self.tx.send(p).await.expect("batcher alive");
        }

        async fn recv(&mut self) -> ServerMsg {
            self.replies.recv().await.expect("reply").msg
        }

        /// The next reply, which must be IDs: (request id, lo, hi).
        async fn ids(&mut self) -> (u64, u64, u64) {
            match self.recv().await {
                ServerMsg::Ids { id, lo, hi } => (id, lo, hi),
                other => panic!("expected IDs, got {other:?}"),
            }
        }

        async fn finish(self) -> Vec<u64> {
            drop(self.tx);
            self.task.await.expect("batcher task");
            let rounds = self.fake.rounds.lock().expect("lock").clone();
            rounds
        }
    }

    const LONG: Duration = Duration::from_secs(5);

    #[tokio::test(start_paused = true)]
    async fn queued_requests_share_one_round_split_in_arrival_order() {
        let mut h = start(Fake::default(), 64);
        // All sent before the batcher runs: one batch.
        for (id, count) in [(1, 1), (2, 3), (3, 1), (4, 5)] {
            h.send(id, count, LONG).await;
        }
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(h.ids().await);
        }
        assert_eq!(got, [(1, 1, 1), (2, 2, 4), (3, 5, 5), (4, 6, 10)]);
        let stats = h.stats.snapshot();
        assert_eq!(
            (stats.rounds, stats.batch_max, stats.requests_ok, stats.ids),
            (1, 4, 4, 10)
        );
        assert_eq!(h.finish().await, [10]);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_arriving_during_a_round_wait_for_the_next() {
        let fake = Fake::default();
        *fake.latency.lock().expect("lock") = Duration::from_millis(10);
        let mut h = start(fake, 64);
        h.send(1, 1, LONG).await;
        tokio::time::sleep(Duration::from_millis(1)).await; // round 1 is now running
        h.send(2, 1, LONG).await;
        h.send(3, 2, LONG).await;
        assert_eq!(h.ids().await, (1, 1, 1));
        assert_eq!(h.ids().await, (2, 2, 2));
        assert_eq!(h.ids().await, (3, 3, 4));
        assert_eq!(h.finish().await, [1, 3]);
    }

    /// With a pipeline of 2, a request arriving during a round starts its own at once
    /// (its round begins after it arrived, as the guarantee needs), and the third waits
    /// for a free slot.
    #[tokio::test(start_paused = true)]
    async fn a_pipeline_starts_the_next_round_during_the_first() {
        let fake = Fake::default();
        *fake.latency.lock().expect("lock") = Duration::from_millis(10);
        let mut h = start_pipelined(fake, 64, 2);
        let t0 = Instant::now();
        h.send(1, 1, LONG).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        h.send(2, 2, LONG).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        h.send(3, 1, LONG).await;
        h.send(4, 1, LONG).await;
        assert_eq!(h.ids().await, (1, 1, 1));
        assert_eq!(t0.elapsed(), Duration::from_millis(10));
        assert_eq!(h.ids().await, (2, 2, 3));
        assert_eq!(
            t0.elapsed(),
            Duration::from_millis(11),
            "ran beside the first"
        );
        // 3 and 4 waited for the first slot (freed at 10 ms) and share a round.
        assert_eq!(h.ids().await, (3, 4, 4));
        assert_eq!(h.ids().await, (4, 5, 5));
        assert_eq!(t0.elapsed(), Duration::from_millis(20));
        assert_eq!(h.finish().await, [1, 2, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn batch_cap_splits_rounds() {
        let mut h = start(Fake::default(), 2);
        for id in 1..=5 {
            h.send(id, 1, LONG).await;
        }
        for id in 1..=5 {
            assert_eq!(h.ids().await, (id, id, id));
        }
        assert_eq!(h.finish().await, [2, 2, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_round_answers_every_request_with_the_error() {
        let fake = Fake::default();
        *fake.fail.lock().expect("lock") = Some(IdError::NoQuorum {
            needed: 3,
            reachable: 1,
            accepted: Some(0),
            total: 5,
            failures: vec![],
        });
        let mut h = start(fake, 64);
        for id in 1..=3 {
            h.send(id, 1, LONG).await;
        }
        for id in 1..=3 {
            match h.recv().await {
                ServerMsg::Failed {
                    id: got,
                    error: IdError::NoQuorum { .. },
                } => assert_eq!(got, id),
                other => panic!("expected NoQuorum for {id}, got {other:?}"),
            }
        }
        let stats = h.stats.snapshot();
        assert_eq!((stats.rounds_failed, stats.requests_failed), (1, 3));
        h.finish().await;
    }

    #[tokio::test(start_paused = true)]
    async fn each_request_is_answered_at_its_own_deadline_and_its_share_burned() {
        let fake = Fake::default();
        *fake.latency.lock().expect("lock") = Duration::from_millis(100);
        let mut h = start(fake, 64);
        let t0 = Instant::now();
        h.send(1, 1, Duration::from_millis(30)).await;
        h.send(2, 1, Duration::from_millis(500)).await;
        h.send(3, 1, Duration::from_millis(30)).await;
        for id in [1, 3] {
            match h.recv().await {
                ServerMsg::Failed {
                    id: got,
                    error: IdError::Deadline { .. },
                } => assert_eq!(got, id),
                other => panic!("expected Deadline, got {other:?}"),
            }
            assert_eq!(t0.elapsed(), Duration::from_millis(30));
        }
        // The round (deadline 500 ms, the latest of its batch) still serves request 2;
        // the IDs of 1 and 3 are burned.
        assert_eq!(h.ids().await, (2, 2, 2));
        assert_eq!(t0.elapsed(), Duration::from_millis(100));
        assert_eq!(h.finish().await, [3]);
    }

    #[tokio::test(start_paused = true)]
    async fn round_outliving_every_deadline_is_abandoned() {
        let fake = Fake::default();
        *fake.latency.lock().expect("lock") = Duration::from_secs(60);
        let mut h = start(fake, 64);
        let t0 = Instant::now();
        h.send(1, 1, Duration::from_millis(50)).await;
        assert!(matches!(
            h.recv().await,
            ServerMsg::Failed {
                id: 1,
                error: IdError::Deadline { .. }
            }
        ));
        assert_eq!(t0.elapsed(), Duration::from_millis(50));
        // The batcher is free again at once.
        *h.fake.latency.lock().expect("lock") = Duration::ZERO;
        h.send(2, 1, LONG).await;
        assert!(matches!(h.recv().await, ServerMsg::Ids { id: 2, .. }));
        assert_eq!(h.finish().await, [1, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_in_queue_gets_no_round() {
        let fake = Fake::default();
        *fake.latency.lock().expect("lock") = Duration::from_millis(100);
        let mut h = start(fake, 64);
        h.send(1, 1, LONG).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        h.send(2, 1, Duration::from_millis(10)).await; // expires while round 1 runs
        assert!(matches!(h.recv().await, ServerMsg::Ids { id: 1, .. }));
        assert!(matches!(
            h.recv().await,
            ServerMsg::Failed {
                id: 2,
                error: IdError::Deadline { .. }
            }
        ));
        assert_eq!(h.finish().await, [1]);
    }

    #[tokio::test(start_paused = true)]
    async fn wrong_count_fails_the_batch() {
        let fake = Fake::default();
        fake.short.store(true, Relaxed);
        let mut h = start(fake, 64);
        h.send(1, 2, LONG).await;
        assert!(matches!(
            h.recv().await,
            ServerMsg::Failed {
                id: 1,
                error: IdError::Protocol { .. }
            }
        ));
        h.finish().await;
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_finishes_the_round_then_refuses_the_queue() {
        let fake = Fake::default();
        *fake.latency.lock().expect("lock") = Duration::from_millis(10);
        let mut h = start(fake, 64);
        h.send(1, 1, LONG).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        h.send(2, 1, LONG).await;
        h.stop.send(true).expect("batcher listening");
        assert!(matches!(h.recv().await, ServerMsg::Ids { id: 1, .. }));
        assert!(matches!(
            h.recv().await,
            ServerMsg::Failed {
                id: 2,
                error: IdError::BrokersUnavailable { .. }
            }
        ));
        assert_eq!(h.finish().await, [1]);
    }

    #[tokio::test(start_paused = true)]
    async fn permits_come_back_with_the_reply() {
        let mut h = start(Fake::default(), 64);
        let sem = Arc::new(Semaphore::new(1));
        let permit = sem.clone().try_acquire_owned().expect("permit");
        let p = IdRequest {
            id: 9,
            count: 1,
            deadline: Instant::now() + LONG,
            requested: LONG,
            reply: h.reply_tx.clone(),
            permit: Some(permit),
        };
        h.tx.send(p).await.expect("send");
        let out = h.replies.recv().await.expect("reply");
        assert_eq!(
            sem.available_permits(),
            0,
            "the permit travels with the reply"
        );
        drop(out);
        assert_eq!(sem.available_permits(), 1);
        h.finish().await;
    }
}

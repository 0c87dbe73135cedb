//! Coalescing: callers that arrive while every wire request is out wait in one queue,
//! and go out together as one request when a request comes back (see the module docs of
//! `broker_client`).

use super::{IdError, IdRange, Inner};
use crate::shares::{Expire, Shares, Waiting};
use idproto::NodeFailure;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::{timeout_at, Instant};

/// Callers waiting to be coalesced or answered. Beyond it callers wait (within their
/// deadline) to join the queue, so a stalled broker cannot make the client queue without
/// bound.
pub(super) const COALESCE_QUEUE: usize = 1 << 16;

/// Most times a finished request yields to the runtime before freeing its slot, while
/// the callers it answered keep queueing again (see `dispatch`).
const HANDOFF_YIELDS: usize = 16;

/// Most callers in one coalesced request: bounds the work of splitting one reply.
const MAX_COALESCED: usize = 4096;

/// A caller waiting in the coalescing queue. The dispatcher owns it from the queue on:
/// it either takes it into a request or answers it at its deadline. `_room` is the
/// caller's place in the queue's bound, given back when the waiter is answered.
struct Waiter {
    n: u64,
    invoked: Instant,
    deadline: Instant,
    tx: oneshot::Sender<Result<IdRange, IdError>>,
    _room: OwnedSemaphorePermit,
}

impl Waiter {
    /// False if its caller is gone (its future was dropped): asking IDs for it would
    /// only burn them.
    fn wanted(&self) -> bool {
        !self.tx.is_closed()
    }
}

/// A caller's own deadline passed before its request was answered.
fn deadline_error(invoked: Instant, deadline: Instant) -> IdError {
    IdError::Deadline {
        deadline: deadline.saturating_duration_since(invoked),
        rounds: 0,
    }
}

/// One caller through the coalescing queue: queued, then answered by the request that
/// took it, or with [`IdError::Deadline`] by the dispatcher at `deadline` if none took it
/// by then. The caller holds no timer of its own (one per caller was a tenth of a
/// busy client's CPU): the dispatcher watches every queued deadline with one.
pub(super) async fn coalesced(
    queue: &Queue,
    n: u64,
    invoked: Instant,
    deadline: Instant,
) -> Result<IdRange, IdError> {
    let stopped = || IdError::BrokersUnavailable {
        failures: vec![NodeFailure {
            addr: "broker client".into(),
            reason: "the client's dispatcher stopped".into(),
        }],
    };
    // The queue has room but under floods: only then does joining it need a timer.
    let room = match queue.room.clone().try_acquire_owned() {
        Ok(room) => room,
        Err(TryAcquireError::Closed) => return Err(stopped()),
        Err(TryAcquireError::NoPermits) => {
            match timeout_at(deadline, queue.room.clone().acquire_owned()).await {
                Err(_) => return Err(deadline_error(invoked, deadline)),
                Ok(Err(_)) => return Err(stopped()),
                Ok(Ok(room)) => room,
            }
        }
    };
    let (tx, rx) = oneshot::channel();
    let waiter = Waiter {
        n,
        invoked,
        deadline,
        tx,
        _room: room,
    };
    if queue.tx.send(waiter).is_err() {
        return Err(stopped());
    }
    rx.await.unwrap_or_else(|_| Err(stopped()))
}

/// The coalescing queue's sending side: callers join it while `room` has a permit.
pub(super) struct Queue {
    tx: mpsc::UnboundedSender<Waiter>,
    pub(super) room: Arc<Semaphore>,
}

impl Queue {
    /// An empty queue, and its dispatcher keeping at most `in_flight` requests of
    /// `inner` out. The dispatcher ends once the queue is dropped and every caller in it
    /// is answered.
    pub(super) fn start(inner: Arc<Inner>, in_flight: usize) -> Queue {
        let (tx, rx) = mpsc::unbounded_channel();
        let room = Arc::new(Semaphore::new(COALESCE_QUEUE));
        tokio::spawn(dispatch(inner, rx, room.clone(), in_flight));
        Queue { tx, room }
    }
}

/// Callers queued in the dispatcher, oldest first, with a lower bound of their deadlines
/// and the one timer that answers them at their deadlines.
struct Queued {
    waiters: VecDeque<Waiter>,
    /// No queued deadline comes before it (it may be stale: a lower bound).
    earliest: Option<Instant>,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl Queued {
    fn new() -> Queued {
        Queued {
            waiters: VecDeque::new(),
            earliest: None,
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
        }
    }

    fn push(&mut self, w: Waiter) {
        if self.earliest.is_none_or(|e| w.deadline < e) {
            self.earliest = Some(w.deadline);
            self.timer.as_mut().reset(w.deadline);
        }
        self.waiters.push_back(w);
    }

    /// The timer fired: answers every caller whose deadline passed, and sets the timer
    /// for the earliest deadline left.
    fn expire_due(&mut self) {
        let now = Instant::now();
        let (due, left): (VecDeque<Waiter>, VecDeque<Waiter>) =
            self.waiters.drain(..).partition(|w| w.deadline <= now);
        self.waiters = left;
        for w in due {
            w.expire();
        }
        self.earliest = self.waiters.iter().map(|w| w.deadline).min();
        if let Some(e) = self.earliest {
            self.timer.as_mut().reset(e);
        }
    }

    /// Every caller still wanted, oldest first, up to `max_count` IDs in all (a caller
    /// past its deadline is answered instead). Every caller taken has invoked already:
    /// the request goes out after it.
    fn take_batch(&mut self, max_count: u64) -> Vec<Waiter> {
        let now = Instant::now();
        let mut batch = Vec::new();
        let mut total = 0u64;
        while batch.len() < MAX_COALESCED {
            let Some(front) = self.waiters.front() else {
                break;
            };
            if !batch.is_empty() && total.saturating_add(front.n) > max_count {
                break;
            }
            let Some(w) = self.waiters.pop_front() else {
                break;
            };
            if !w.wanted() {
                continue;
            }
            if w.deadline <= now {
                w.expire();
                continue;
            }
            total += w.n;
            batch.push(w);
        }
        batch
    }
}

/// The coalescing dispatcher: with fewer than `in_flight` requests out, every caller
/// waiting goes out as one request; a caller still queued at its deadline is answered
/// then. Ends when every handle of the client is gone and every caller is answered.
async fn dispatch(
    inner: Arc<Inner>,
    mut queue: mpsc::UnboundedReceiver<Waiter>,
    room: Arc<Semaphore>,
    in_flight: usize,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    let mut slot = Box::pin(slots.clone().acquire_owned());
    let mut queued = Queued::new();
    let mut open = true;
    let mut out = tokio::task::JoinSet::new();
    while open || !queued.waiters.is_empty() {
        // Everyone queued by now joins the next request (callers answered by the last
        // one queue again while its task yields, before its slot is free).
        while let Ok(w) = queue.try_recv() {
            queued.push(w);
        }
        tokio::select! {
            biased;
            permit = &mut slot, if !queued.waiters.is_empty() => {
                slot.set(slots.clone().acquire_owned());
                let Ok(permit) = permit else { break };
                let batch = queued.take_batch(inner.max_count.load(Relaxed));
                if batch.is_empty() {
                    continue;
                }
                let inner = inner.clone();
                let room = room.clone();
                out.spawn(async move {
                    send_batch(&inner, batch).await;
                    // The callers just answered mostly call again at once: let them
                    // queue before the freed slot goes, or it leaves with the first of
                    // them alone and the rest wait a whole round for the next slot.
                    // Yield while they keep coming (each one joining takes room).
                    for _ in 0..HANDOFF_YIELDS {
                        let before = room.available_permits();
                        tokio::task::yield_now().await;
                        if room.available_permits() >= before {
                            break;
                        }
                    }
                    drop(permit);
                });
            }
            w = queue.recv(), if open => match w {
                Some(w) => queued.push(w),
                None => open = false,
            },
            () = queued.timer.as_mut(), if queued.earliest.is_some() => queued.expire_due(),
            Some(done) = out.join_next(), if !out.is_empty() => {
                if let Err(e) = done {
                    tracing::error!("a coalesced request's task failed: {e}");
                }
            }
            else => break,
        }
    }
    // Requests still out answer their callers; wait for them, then end.
    while let Some(done) = out.join_next().await {
        if let Err(e) = done {
            tracing::error!("a coalesced request's task failed: {e}");
        }
    }
}

/// Sends one request for the batch's total count, until its latest deadline, and
/// splits the range among its callers in queue order; callers whose own deadline comes
/// first are answered `Deadline` then (their shares become holes if it succeeds).
async fn send_batch(inner: &Inner, batch: Vec<Waiter>) {
    let mut shares = Shares::new(batch);
    let Some(latest) = shares.latest() else {
        return;
    };
    let total = shares.total();
    inner.wire_requests.fetch_add(1, Relaxed);
    inner.wire_callers.fetch_add(shares.len() as u64, Relaxed);
    // The request ends by the latest deadline, so the round always returns.
    let result = shares
        .wait(inner.request(total, latest), Expire::BeforeLatest)
        .await;
    match result {
        // The exchange checked that the range holds exactly `total` IDs.
        Some(Ok(range)) => shares.split(range),
        Some(Err(e)) => shares.fail(&e),
        None => {}
    }
}

impl Waiting for Waiter {
    fn count(&self) -> u64 {
        self.n
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Answers `Deadline`: if no request took it, no ID of its exists anywhere; if one
    /// did, its share becomes a hole.
    fn expire(self) {
        let _ = self
            .tx
            .send(Err(deadline_error(self.invoked, self.deadline)));
    }

    fn answer(self, result: Result<IdRange, IdError>) {
        let _ = self.tx.send(result);
    }
}

//! Serving from a confirmed window (DESIGN.md, "Serving from a confirmed window"): the
//! broker reserves a window of IDs with one write round and serves many batches from it,
//! each confirmed by a majority READ started after the batch closed, instead of an
//! fsync'd write per batch.
//!
//! The rules, as [`WindowSource::next_ids_until`] applies them to one batch of `n` IDs
//! (the batcher calls it once per batch, after the batch closed):
//!
//! 1. Reserve: windows are contiguous. A reservation asks for exactly `TOP+1..=TOP+size`
//!    ([`WindowQuorum::reserve`]); one that loses (another writer got in between) or whose
//!    outcome is unknown kills the window: its unserved IDs become holes. `TOP` is the HI
//!    of the newest reservation known to have won. A fresh window starts with an ordinary
//!    round, whose range serves the batch that asked for it and whose rest is the window.
//! 2. Confirm: [`WindowQuorum::read_max`] reads the register on a majority. If
//!    `max <= TOP` the batch gets the next unserved IDs of the window (set aside before
//!    the read, so that several batches' reads can overlap: see `serve`). A reservation of
//!    ours still in flight when the confirmation sees `max > TOP` is decided first: if it
//!    won, `TOP` moves up and the same `max` is compared again; if not, the window is dead.
//! 3. `max > TOP` with no reservation to wait for: another writer advanced the register;
//!    the window is dead and the batch is served by a fresh window. `max < TOP` cannot
//!    happen unless a node lost acknowledged writes (`TOP` is on a majority): windows are
//!    then switched off for good, loudly, and every batch runs its own round.
//!
//! Why this stays linearizable with no clock assumption is argued in DESIGN.md; the
//! deterministic simulation (`idtools/tests/sim/`, "Window serving") checks histories
//! of window serving beside direct writers over thousands of seeds, and that a window
//! served without confirmation is caught (`WindowMutant`, feature `test-hooks`).
//!
//! The next reservation starts before the window runs dry (when less than half of the
//! current size is left), so steady load waits for reads, not fsyncs. The size follows
//! demand: about [`ROUNDS_OF_DEMAND`] reservation times' worth of the IDs served per
//! second, between [`MIN_WINDOW`] and [`MAX_WINDOW`].

use crate::serve::rules::{Confirm, RULES};
use crate::serve::source::RoundSource;
use idclient::MAX_COUNT;
use idclient::{IdError, IdRange, QuorumClient};
use idproto::wire::BrokerStats;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{MutexGuard, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Smallest window: also the first one's size, before any demand was measured.
pub const MIN_WINDOW: u64 = 256;

/// Largest window: what one dead window can cost in holes.
pub const MAX_WINDOW: u64 = 1 << 20;

/// A window holds what the broker serves in about this many reservation round times.
/// Each reservation is an fsync'd write on every node: at four, reservations cost the
/// nodes more CPU than every confirmation together (BENCHMARKS.md); a dead window costs
/// at most this much demand in holes.
pub const ROUNDS_OF_DEMAND: u64 = 32;

/// Time a background reservation may take.
const RESERVE_TIMEOUT: Duration = Duration::from_secs(2);

/// What window serving needs from the quorum. [`QuorumClient`] implements it; the
/// simulation plugs in a client over simulated nodes.
pub trait WindowQuorum: Send + Sync + 'static {
    /// An ordinary round for `n` IDs, retrying contention until `deadline`.
    fn round(
        &self,
        n: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<IdRange, IdError>> + Send;

    /// One conditional write of exactly `lo..=hi`: `Ok(true)` when a majority accepted.
    fn reserve(
        &self,
        lo: u64,
        hi: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<bool, IdError>> + Send;

    /// The largest register value among a majority of answers, read after this call.
    fn read_max(&self, deadline: Instant) -> impl Future<Output = Result<u64, IdError>> + Send;
}

impl WindowQuorum for QuorumClient {
    fn round(
        &self,
        n: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<IdRange, IdError>> + Send {
        self.next_ids_until(n, deadline)
    }

    fn reserve(
        &self,
        lo: u64,
        hi: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<bool, IdError>> + Send {
        QuorumClient::reserve(self, lo, hi, deadline)
    }

    fn read_max(&self, deadline: Instant) -> impl Future<Output = Result<u64, IdError>> + Send {
        QuorumClient::read_max(self, deadline)
    }
}

/// Counters of window serving (all monotonic but `window_size`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowStats {
    /// Majority reads that confirmed a batch.
    pub confirmations: u64,
    /// Confirmations that found another writer above the window.
    pub confirmations_failed: u64,
    /// Contiguous reservations that won.
    pub reservations: u64,
    /// Reservations lost to another writer or with an unknown outcome.
    pub reservations_lost: u64,
    /// Windows started by an ordinary round.
    pub fresh_windows: u64,
    /// IDs of dead windows that were never served.
    pub holes: u64,
    /// The current target window size.
    pub window_size: u64,
}

#[derive(Default)]
struct Counters {
    confirmations: AtomicU64,
    confirmations_failed: AtomicU64,
    reservations: AtomicU64,
    reservations_lost: AtomicU64,
    fresh_windows: AtomicU64,
    holes: AtomicU64,
    window_size: AtomicU64,
}

/// A reservation in flight.
struct Reservation {
    lo: u64,
    hi: u64,
    started: Instant,
    task: JoinHandle<Result<bool, IdError>>,
}

/// The window: `next..=top` unserved when `alive`.
struct Window {
    alive: bool,
    next: u64,
    top: u64,
    pending: Option<Reservation>,
    /// Target size, adapted to demand.
    size: u64,
    /// Moving average of a reservation's duration, in ns.
    round_ns: u64,
    /// IDs served since `since`, for the demand estimate.
    served: u64,
    since: Instant,
    /// Set when a confirmation read less than TOP: a node lost writes.
    broken: Option<String>,
    /// Counts the windows killed: IDs taken under one generation are confirmed against
    /// that window's TOP only.
    generation: u64,
    /// The last confirmation's value (only [`WindowMutant::StaleConfirmation`] uses it).
    #[cfg(feature = "test-hooks")]
    last_read: Option<u64>,
}

impl Window {
    /// Takes the next `n` unserved IDs.
    fn take(&mut self, n: u64) -> IdRange {
        // More would hand out IDs above TOP, which no majority accepted: repeats.
        assert!(
            n >= 1 && self.available() >= n,
            "taking {n} IDs from a window with {} left",
            self.available()
        );
        let range = IdRange {
            lo: self.next,
            hi: self.next + n - 1,
        };
        match range.hi.checked_add(1) {
            Some(next) => self.next = next,
            None => self.alive = false,
        }
        self.served += n;
        range
    }

    /// Unserved IDs of the window: `next..=top` (`next` is `top + 1` once it is used up).
    fn available(&self) -> u64 {
        if self.alive && self.next <= self.top {
            self.top - self.next + 1
        } else {
            0
        }
    }
}

/// One closed batch being served: `n` IDs, asked for at `started`, due by `deadline`.
struct Batch {
    n: u64,
    started: Instant,
    deadline: Instant,
}

/// IDs set aside for a batch before its confirmation read: served only if the read
/// confirms the window they came from (`generation`, whose TOP was `known_top`).
struct Taken {
    range: IdRange,
    generation: u64,
    known_top: u64,
}

/// Deliberately broken window serving, for the simulation's negative tests only: each
/// breaks one rule of the module docs, and the history checker must catch it. Only
/// with the feature `test-hooks` (idtools' tests enable it): a production build cannot
/// make one.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowMutant {
    /// Serves from the window without a confirmation read.
    SkipConfirmation,
    /// Confirms with the previous batch's read, started before this batch closed.
    StaleConfirmation,
    /// Keeps serving a window another writer got past (or whose extension lost).
    KeepDeadWindow,
}

/// A [`RoundSource`] that serves batches from confirmed windows.
pub struct WindowSource<Q> {
    quorum: Arc<Q>,
    window: tokio::sync::Mutex<Window>,
    counters: Counters,
    #[cfg(feature = "test-hooks")]
    mutant: Option<WindowMutant>,
    /// Notified when another writer killed the window (see [`WindowSource::died`]).
    died: Arc<Notify>,
}

impl<Q: WindowQuorum> WindowSource<Q> {
    /// Window serving over `quorum`. Nothing is reserved before the first batch.
    pub fn new(quorum: Arc<Q>) -> WindowSource<Q> {
        let counters = Counters::default();
        counters.window_size.store(MIN_WINDOW, Relaxed);
        WindowSource {
            quorum,
            window: tokio::sync::Mutex::new(Window {
                alive: false,
                next: 0,
                top: 0,
                pending: None,
                size: MIN_WINDOW,
                round_ns: 2_000_000,
                served: 0,
                since: Instant::now(),
                broken: None,
                generation: 0,
                #[cfg(feature = "test-hooks")]
                last_read: None,
            }),
            counters,
            #[cfg(feature = "test-hooks")]
            mutant: None,
            died: Arc::new(Notify::new()),
        }
    }

    /// The same source with one rule broken (negative tests only).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn with_mutant(mut self, mutant: WindowMutant) -> WindowSource<Q> {
        self.mutant = Some(mutant);
        self
    }

    /// Notified (one stored permit) whenever another writer killed the window: a
    /// confirmation read above TOP, or a contiguous reservation lost. A leader takes it
    /// as a hint that a newer leader may exist (DESIGN.md, "Leader and followers").
    pub fn died(&self) -> Arc<Notify> {
        self.died.clone()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> WindowStats {
        let c = &self.counters;
        WindowStats {
            confirmations: c.confirmations.load(Relaxed),
            confirmations_failed: c.confirmations_failed.load(Relaxed),
            reservations: c.reservations.load(Relaxed),
            reservations_lost: c.reservations_lost.load(Relaxed),
            fresh_windows: c.fresh_windows.load(Relaxed),
            holes: c.holes.load(Relaxed),
            window_size: c.window_size.load(Relaxed),
        }
    }

    /// Serves one closed batch of `n` IDs (see the module docs for the rules).
    ///
    /// Confirmations are pipelined: the batch takes its IDs (the next unserved ones of
    /// the window) first, under the window's lock, then releases the lock for its read,
    /// so batches closed meanwhile take theirs and start their own reads at once. The
    /// IDs are handed out only if the read, started after the batch closed, finds
    /// `max <= TOP` of the window they came from (DESIGN.md: the argument does not care
    /// when the IDs were set aside, only that nobody else got them and that a majority
    /// accepted TOP); else they become holes and the batch is served by a fresh window.
    /// Batches take their IDs in the order they lock the window, which is the order the
    /// batcher closed them (it starts their futures in that order and the lock is
    /// fair): one connection's pipelined requests get increasing IDs.
    async fn serve(&self, n: u64, deadline: Instant) -> Result<IdRange, IdError> {
        let batch = Batch {
            n,
            started: Instant::now(),
            deadline,
        };
        let mut w = self.window.lock().await;
        if w.broken.is_some() {
            drop(w);
            return self.quorum.round(n, deadline).await;
        }
        if w.available() < n {
            self.decide_pending(&mut w, batch.started, deadline).await?;
        }
        if w.available() < n {
            return self.fresh(&mut w, n, deadline).await;
        }
        let taken = self.set_aside(&mut w, n);
        // The confirmation: every read starts now, after the batch closed.
        let (mut w, max) = self.confirmation(w, &batch, taken.known_top).await?;
        Self::note_read(&mut w, max);
        self.counters.confirmations.fetch_add(1, Relaxed);
        if w.broken.is_some() || self.switched_off_below_top(&mut w, max, taken.known_top) {
            // Windows are off (now, or by another batch meanwhile): the IDs set aside
            // are holes and the batch runs its own round.
            self.counters.holes.fetch_add(n, Relaxed);
            drop(w);
            return self.quorum.round(n, deadline).await;
        }
        self.settle(&mut w, &batch, taken, max).await
    }

    /// Sets the next `n` unserved IDs of the window aside for a batch, and starts the
    /// next reservation if the window runs low.
    fn set_aside(&self, w: &mut Window, n: u64) -> Taken {
        debug_assert!(w.broken.is_none() && w.available() >= n);
        let range = w.take(n);
        // The window the IDs came from, and its TOP, known to be on a majority before
        // the read starts: the read cannot see less unless a node lost acknowledged writes.
        let taken = Taken {
            range,
            generation: w.generation,
            known_top: w.top,
        };
        self.refill(w);
        taken
    }

    /// The confirmation read of `batch`, the window unlocked meanwhile so that other
    /// batches take their IDs and start their reads (or the value a mutant makes up,
    /// the lock kept). A read that fails makes the batch's IDs holes.
    async fn confirmation<'a>(
        &'a self,
        w: MutexGuard<'a, Window>,
        batch: &Batch,
        known_top: u64,
    ) -> Result<(MutexGuard<'a, Window>, u64), IdError> {
        if let Some(max) = self.mutated_confirmation(&w, known_top) {
            return Ok((w, max));
        }
        drop(w);
        let read = self.quorum.read_max(batch.deadline).await;
        let w = self.window.lock().await;
        match read {
            Ok(max) => Ok((w, max)),
            Err(e) => {
                self.counters.holes.fetch_add(batch.n, Relaxed);
                Err(e)
            }
        }
    }

    /// A confirmation that read `max` below `known_top`, which a majority accepted: a
    /// node lost acknowledged writes, and windows are switched off for good (loudly).
    /// Whether it did.
    fn switched_off_below_top(&self, w: &mut Window, max: u64, known_top: u64) -> bool {
        if !RULES.lost_writes(max, known_top) || self.mutated() {
            return false;
        }
        let reason = format!(
            "a majority read {max} below {known_top}, which a majority accepted: a node \
             lost acknowledged writes (check every node's appendfsync and disk)"
        );
        tracing::error!(%reason, "window serving switched off");
        w.broken = Some(reason);
        self.kill(w);
        true
    }

    /// Serves `batch` once its confirmation read `max`: with the IDs it set aside if the
    /// read confirms the window they came from; else they are holes, and the batch is
    /// served by a newer window.
    async fn settle(
        &self,
        w: &mut Window,
        batch: &Batch,
        taken: Taken,
        max: u64,
    ) -> Result<IdRange, IdError> {
        let (n, generation) = (batch.n, taken.generation);
        // Above the TOP the IDs were taken under: one of our own reservations may explain
        // it (decided first: a win extends the same window), else another writer did.
        while max > w.top && w.generation == generation && w.pending.is_some() {
            if let Err(e) = self.decide_pending(w, batch.started, batch.deadline).await {
                self.counters.holes.fetch_add(n, Relaxed);
                return Err(e);
            }
        }
        let live_top = (w.generation == generation && w.alive).then_some(w.top);
        // A read below TOP reaches here only under a test-hooks mutant: served, as before.
        let confirmed = RULES.confirm(max, taken.known_top, live_top) != Confirm::Dead;
        let keep = self.keeps_dead_windows();
        if confirmed || keep {
            return Ok(taken.range);
        }
        self.counters.holes.fetch_add(n, Relaxed);
        if w.generation == generation && w.alive {
            self.counters.confirmations_failed.fetch_add(1, Relaxed);
            self.died.notify_one();
            self.kill(w);
        }
        // Else another batch found it dead already and may have started a fresh window.
        // Its TOP, too, is on a majority: at or above `max`, it serves this batch.
        if w.available() >= n && max <= w.top {
            let range = w.take(n);
            self.refill(w);
            return Ok(range);
        }
        self.fresh(w, n, batch.deadline).await
    }

    /// Waits (within `deadline`) for the reservation in flight, if any: a win extends
    /// the window (reservations are contiguous), anything else kills it.
    async fn decide_pending(
        &self,
        w: &mut Window,
        started: Instant,
        deadline: Instant,
    ) -> Result<(), IdError> {
        let Some(p) = w.pending.as_mut() else {
            return Ok(());
        };
        let outcome = match tokio::time::timeout_at(deadline, &mut p.task).await {
            Err(_) => {
                return Err(IdError::Deadline {
                    deadline: deadline.saturating_duration_since(started),
                    rounds: 0,
                })
            }
            Ok(joined) => joined,
        };
        let Some(p) = w.pending.take() else {
            return Ok(());
        };
        match outcome {
            Ok(Ok(true)) if RULES.reservation_extends(true, w.alive, w.top, p.lo) => {
                self.counters.reservations.fetch_add(1, Relaxed);
                let took = p.started.elapsed().as_nanos() as u64;
                w.round_ns = idclient::MovingAverage::step(w.round_ns, took);
                w.top = p.hi;
            }
            Ok(Ok(true)) => {
                // Won, but the window it extends is dead: its IDs are holes.
                self.counters.reservations.fetch_add(1, Relaxed);
                self.counters.holes.fetch_add(p.hi - p.lo + 1, Relaxed);
            }
            Ok(Ok(false)) | Ok(Err(_)) | Err(_) => {
                self.counters.reservations_lost.fetch_add(1, Relaxed);
                self.died.notify_one();
                if !self.keeps_dead_windows() {
                    self.kill(w);
                }
            }
        }
        Ok(())
    }

    /// A fresh window: an ordinary round for the batch plus a window behind it. The
    /// batch is served from the round's range, like any round the batcher runs.
    async fn fresh(&self, w: &mut Window, n: u64, deadline: Instant) -> Result<IdRange, IdError> {
        if let Some(p) = w.pending.take() {
            // Its outcome no longer matters: whatever it reserved is a hole.
            p.task.abort();
            self.counters.holes.fetch_add(p.hi - p.lo + 1, Relaxed);
        }
        self.kill(w);
        let extra = w.size.min(MAX_COUNT.saturating_sub(n));
        let range = self.quorum.round(n + extra, deadline).await?;
        self.counters.fresh_windows.fetch_add(1, Relaxed);
        let served = IdRange {
            lo: range.lo,
            hi: range.lo + n - 1,
        };
        if extra > 0 {
            w.alive = true;
            w.next = served.hi + 1;
            w.top = range.hi;
        }
        w.served += n;
        self.refill(w);
        Ok(served)
    }

    /// The window is dead: what is left of it becomes holes.
    fn kill(&self, w: &mut Window) {
        let left = w.available();
        if left > 0 {
            self.counters.holes.fetch_add(left, Relaxed);
        }
        w.alive = false;
        w.generation += 1;
    }

    /// Adapts the size to demand and starts the next contiguous reservation when less
    /// than half a window is left.
    fn refill(&self, w: &mut Window) {
        let elapsed = w.since.elapsed();
        if elapsed >= Duration::from_millis(100) {
            let per_sec = (w.served as f64 / elapsed.as_secs_f64()) as u64;
            let round_secs = w.round_ns as f64 / 1e9;
            let want = (per_sec as f64 * round_secs) as u64 * ROUNDS_OF_DEMAND;
            w.size = want.clamp(MIN_WINDOW, MAX_WINDOW);
            self.counters.window_size.store(w.size, Relaxed);
            w.served = 0;
            w.since = Instant::now();
        }
        if !w.alive || w.pending.is_some() || w.available() >= w.size / 2 {
            return;
        }
        let Some(lo) = w.top.checked_add(1) else {
            return;
        };
        let Some(hi) = lo.checked_add(w.size - 1) else {
            return;
        };
        let quorum = self.quorum.clone();
        let started = Instant::now();
        let task =
            tokio::spawn(async move { quorum.reserve(lo, hi, started + RESERVE_TIMEOUT).await });
        w.pending = Some(Reservation {
            lo,
            hi,
            started,
            task,
        });
    }
}

/// What a [`WindowMutant`] changes in serving (feature `test-hooks`).
#[cfg(feature = "test-hooks")]
impl<Q> WindowSource<Q> {
    fn mutated(&self) -> bool {
        self.mutant.is_some()
    }

    fn keeps_dead_windows(&self) -> bool {
        self.mutant == Some(WindowMutant::KeepDeadWindow)
    }

    /// The confirmation a mutant makes up instead of a read, if it does.
    fn mutated_confirmation(&self, w: &Window, known_top: u64) -> Option<u64> {
        match (self.mutant, w.last_read) {
            (Some(WindowMutant::SkipConfirmation), _) => Some(known_top),
            (Some(WindowMutant::StaleConfirmation), Some(stale)) => Some(stale),
            _ => None,
        }
    }

    fn note_read(w: &mut Window, max: u64) {
        w.last_read = Some(max);
    }
}

/// Without the feature `test-hooks` (production): no mutant, every rule kept.
#[cfg(not(feature = "test-hooks"))]
impl<Q> WindowSource<Q> {
    fn mutated(&self) -> bool {
        false
    }

    fn keeps_dead_windows(&self) -> bool {
        false
    }

    fn mutated_confirmation(&self, _: &Window, _: u64) -> Option<u64> {
        None
    }

    fn note_read(_: &mut Window, _: u64) {}
}

impl<Q: WindowQuorum> RoundSource for WindowSource<Q> {
    fn next_ids_until(
        &self,
        n: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<IdRange, IdError>> + Send {
        self.serve(n, deadline)
    }

    fn describe(&self, stats: &mut BrokerStats) {
        let w = self.stats();
        stats.role = "window".to_string();
        stats.window_size = w.window_size;
        stats.confirmations = w.confirmations;
        stats.confirmations_failed = w.confirmations_failed;
        stats.reservations = w.reservations;
        stats.reservations_lost = w.reservations_lost;
        stats.holes = w.holes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A register on one node, with a script of what other writers do.
    #[derive(Default)]
    struct Fake {
        current: Mutex<u64>,
        /// Added to the register before the next read (another writer).
        bump_before_read: Mutex<u64>,
        /// Subtracted from what reads return (a node that lost writes).
        lose: Mutex<u64>,
        reads: AtomicU64,
        reserves: AtomicU64,
        /// Each read takes this long (on the paused clock), for overlapping reads.
        read_delay: Mutex<Duration>,
        /// Reads under way now, and the most ever at once.
        reading: AtomicU64,
        most_reading: AtomicU64,
    }

    impl WindowQuorum for Fake {
        async fn round(&self, n: u64, _: Instant) -> Result<IdRange, IdError> {
            let mut c = self.current.lock().unwrap();
            let lo = *c + 1;
            *c += n;
            Ok(IdRange { lo, hi: *c })
        }

        async fn reserve(&self, lo: u64, hi: u64, _: Instant) -> Result<bool, IdError> {
            self.reserves.fetch_add(1, Relaxed);
            let mut c = self.current.lock().unwrap();
            if *c < lo {
                *c = hi;
                Ok(true)
            } else {
                Ok(false)
            }
        }

        async fn read_max(&self, _: Instant) -> Result<u64, IdError> {
            self.reads.fetch_add(1, Relaxed);
            let delay = *self.read_delay.lock().unwrap();
            if !delay.is_zero() {
                let now = self.reading.fetch_add(1, Relaxed) + 1;
                self.most_reading.fetch_max(now, Relaxed);
                tokio::time::sleep(delay).await;
                self.reading.fetch_sub(1, Relaxed);
            }
            let mut c = self.current.lock().unwrap();
            *c += std::mem::take(&mut *self.bump_before_read.lock().unwrap());
            Ok(*c - *self.lose.lock().unwrap())
        }
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[tokio::test]
    async fn batches_are_served_in_order_from_one_window_confirmed_by_reads() {
        let fake = Arc::new(Fake::default());
        let w = WindowSource::new(fake.clone());
        let first = w.next_ids_until(10, later()).await.unwrap();
        assert_eq!(first, IdRange { lo: 1, hi: 10 });
        let mut last = first.hi;
        // Use the first window up exactly (no underflow), then the next one, reserved
        // contiguously when half of the first was left: no hole in between.
        for n in [1, 5, 100, 150, 7] {
            let r = w.next_ids_until(n, later()).await.unwrap();
            assert!(r.holds_exactly(n) && r.lo == last + 1, "{r:?} after {last}");
            last = r.hi;
        }
        let s = w.stats();
        assert_eq!(
            (s.fresh_windows, s.reservations, s.holes),
            (1, 1, 0),
            "{s:?}"
        );
        assert_eq!(s.confirmations, 5, "{s:?}");
        // A batch larger than what is left: a fresh round above, the rest are holes.
        let r = w.next_ids_until(1000, later()).await.unwrap();
        assert!(r.holds_exactly(1000) && r.lo > last, "{r:?} after {last}");
        assert!(w.stats().holes > 0);
    }

    /// Confirmations of concurrent batches overlap (the window is not locked during a
    /// read), and every batch still gets its own read and its own IDs.
    #[tokio::test(start_paused = true)]
    async fn confirmations_of_concurrent_batches_overlap() {
        let fake = Arc::new(Fake::default());
        let w = Arc::new(WindowSource::new(fake.clone()));
        let first = w.next_ids_until(1, later()).await.unwrap();
        *fake.read_delay.lock().unwrap() = Duration::from_millis(1);
        let batches = (1..=8u64).map(|n| {
            let w = w.clone();
            tokio::spawn(async move { w.next_ids_until(n, later()).await })
        });
        let mut ranges = vec![first];
        for b in futures::future::join_all(batches).await {
            ranges.push(b.unwrap().unwrap());
        }
        assert_eq!(fake.reads.load(Relaxed), 8, "one confirmation per batch");
        assert_eq!(fake.most_reading.load(Relaxed), 8, "the reads overlapped");
        ranges.sort_by_key(|r| r.lo);
        for pair in ranges.windows(2) {
            assert!(pair[0].hi < pair[1].lo, "overlapping: {ranges:?}");
        }
        let s = w.stats();
        assert_eq!(
            (s.fresh_windows, s.confirmations_failed, s.holes),
            (1, 0, 0),
            "{s:?}"
        );
    }

    /// A confirmation that ends after another batch found the window dead does not
    /// serve from it: it is served by a fresh window above the other writer.
    #[tokio::test(start_paused = true)]
    async fn a_window_killed_during_a_read_is_not_served_from() {
        let fake = Arc::new(Fake::default());
        let w = Arc::new(WindowSource::new(fake.clone()));
        w.next_ids_until(1, later()).await.unwrap();
        *fake.read_delay.lock().unwrap() = Duration::from_millis(1);
        // The first read to run sees another writer 5000 above; the second overlaps it.
        *fake.bump_before_read.lock().unwrap() = 5000;
        let a = tokio::spawn({
            let w = w.clone();
            async move { w.next_ids_until(1, later()).await }
        });
        let b = tokio::spawn({
            let w = w.clone();
            async move { w.next_ids_until(1, later()).await }
        });
        let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
        assert!(a.lo > 5000 && b.lo > 5000, "{a:?} {b:?}");
        assert_ne!(a, b);
        let s = w.stats();
        assert!(s.confirmations_failed >= 1, "{s:?}");
    }

    #[tokio::test]
    async fn another_writer_above_the_window_kills_it() {
        let fake = Arc::new(Fake::default());
        let w = WindowSource::new(fake.clone());
        let first = w.next_ids_until(1, later()).await.unwrap();
        *fake.bump_before_read.lock().unwrap() = 1000;
        let r = w.next_ids_until(1, later()).await.unwrap();
        // Served by a fresh round above what the other writer reached.
        assert!(r.lo > first.hi + MIN_WINDOW + 1000 - 1, "{r:?}");
        let s = w.stats();
        assert_eq!((s.fresh_windows, s.confirmations_failed), (2, 1), "{s:?}");
        assert!(s.holes >= MIN_WINDOW, "{s:?}");
    }

    #[tokio::test]
    async fn a_read_below_the_top_switches_windows_off() {
        let fake = Arc::new(Fake::default());
        let w = WindowSource::new(fake.clone());
        w.next_ids_until(1, later()).await.unwrap();
        *fake.lose.lock().unwrap() = 5;
        let reads = fake.reads.load(Relaxed);
        let r = w.next_ids_until(1, later()).await.unwrap();
        assert!(
            r.lo > MIN_WINDOW,
            "served by a round, above the window: {r:?}"
        );
        let r2 = w.next_ids_until(1, later()).await.unwrap();
        assert!(r2.lo > r.hi);
        // Rounds only from now on: no more confirmations.
        assert_eq!(fake.reads.load(Relaxed), reads + 1);
    }
}

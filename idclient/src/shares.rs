//! One range for a batch of waiting callers: while the batch's round runs, each caller
//! is answered [`IdError::Deadline`] at its own deadline; when the round returns, its
//! range is split among the callers in the order they joined, and the shares of the
//! callers already answered are skipped, never handed to anyone (holes). The broker's
//! group-commit batcher and the broker client's coalescing queue both serve their
//! batches this way.

use crate::{IdError, IdRange};
use std::future::Future;
use tokio::time::Instant;

/// A caller waiting in a [`Shares`] batch for its share of one range.
pub trait Waiting {
    /// The IDs it asked for: at least 1.
    fn count(&self) -> u64;
    /// When it stops waiting.
    fn deadline(&self) -> Instant;
    /// Its deadline passed before the round returned: answers it `Deadline`.
    fn expire(self);
    /// Answers it its share of the range, or the round's error.
    fn answer(self, result: Result<IdRange, IdError>);
}

/// Which callers [`Shares::wait`] answers at their deadlines itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expire {
    /// Every caller; once all are answered the round is abandoned (its IDs burned).
    Every,
    /// Those whose deadline comes before the batch's latest: the round itself ends by
    /// then and its result, range or error, answers the rest.
    BeforeLatest,
}

/// A batch of callers, oldest first, each with the count it asked for and the caller
/// itself while it still waits.
#[derive(Debug)]
pub struct Shares<W> {
    slots: Vec<(u64, Option<W>)>,
}

impl<W: Waiting> Shares<W> {
    /// The batch of `waiting`, in the order given (the order the range is split in).
    pub fn new(waiting: Vec<W>) -> Shares<W> {
        let slots = waiting.into_iter().map(|w| (w.count(), Some(w))).collect();
        Shares { slots }
    }

    /// Callers in the batch, answered or not.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True if the batch holds no caller.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The IDs the whole batch asked for: what its round must return.
    pub fn total(&self) -> u64 {
        self.slots.iter().map(|(count, _)| count).sum()
    }

    /// The latest deadline of a caller still waiting.
    pub fn latest(&self) -> Option<Instant> {
        self.waiting().max()
    }

    fn waiting(&self) -> impl Iterator<Item = Instant> + '_ {
        self.slots
            .iter()
            .flat_map(|(_, w)| w.as_ref().map(W::deadline))
    }

    /// Drives `round` and meanwhile answers `Deadline` to the callers `expire` names,
    /// each at its own deadline. Returns the round's result, or `None` once every
    /// caller has been answered (only with [`Expire::Every`]; the round is dropped).
    pub async fn wait(
        &mut self,
        round: impl Future<Output = Result<IdRange, IdError>>,
        expire: Expire,
    ) -> Option<Result<IdRange, IdError>> {
        tokio::pin!(round);
        let latest = self.latest();
        loop {
            let due = self
                .waiting()
                .filter(|&d| expire == Expire::Every || latest.is_some_and(|l| d < l))
                .min();
            let Some(due) = due else {
                return match expire {
                    Expire::Every => None,
                    Expire::BeforeLatest => Some(round.await),
                };
            };
            tokio::select! {
                biased;
                result = &mut round => return Some(result),
                () = tokio::time::sleep_until(due) => self.expire_due(Instant::now()),
            }
        }
    }

    /// Answers `Deadline` to every caller whose deadline is `now` or earlier.
    fn expire_due(&mut self, now: Instant) {
        for (_, slot) in &mut self.slots {
            if slot.as_ref().is_some_and(|w| w.deadline() <= now) {
                if let Some(w) = slot.take() {
                    w.expire();
                }
            }
        }
    }

    /// Splits `range` among the callers still waiting, in order: each gets the next
    /// `count` IDs; an answered caller's share is skipped.
    ///
    /// # Panics
    /// If `range` does not hold exactly [`Shares::total`] IDs: shares that did not add
    /// up would hand out IDs outside the range, or twice. Callers check the round's
    /// range first (a broker's reply is a protocol error, not a panic).
    pub fn split(self, range: IdRange) {
        assert!(
            range.holds_exactly(self.total()),
            "{range:?} split into {} IDs",
            self.total()
        );
        let mut lo = range.lo;
        for (count, slot) in self.slots {
            debug_assert!(count >= 1, "a caller asked for no ID");
            let hi = lo + (count - 1);
            if let Some(w) = slot {
                w.answer(Ok(IdRange { lo, hi }));
            }
            lo = hi.wrapping_add(1);
        }
    }

    /// Answers every caller still waiting with `error`.
    pub fn fail(self, error: &IdError) {
        for w in self.slots.into_iter().filter_map(|(_, w)| w) {
            w.answer(Err(error.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    //! On tokio's paused clock: time only moves when every task is idle.

    use super::*;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// A caller that records how it was answered.
    struct Caller {
        name: &'static str,
        count: u64,
        deadline: Instant,
        log: Log,
    }

    impl Waiting for Caller {
        fn count(&self) -> u64 {
            self.count
        }
        fn deadline(&self) -> Instant {
            self.deadline
        }
        fn expire(self) {
            let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
            log.push((self.name, Err("deadline".into())));
        }
        fn answer(self, result: Result<IdRange, IdError>) {
            let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
            log.push((self.name, result.map_err(|e| e.to_string())));
        }
    }

    type Log = Arc<Mutex<Vec<(&'static str, Result<IdRange, String>)>>>;

    fn batch(log: &Log, callers: &[(&'static str, u64, u64)]) -> Shares<Caller> {
        let now = Instant::now();
        Shares::new(
            callers
                .iter()
                .map(|&(name, count, ms)| Caller {
                    name,
                    count,
                    deadline: now + Duration::from_millis(ms),
                    log: log.clone(),
                })
                .collect(),
        )
    }

    async fn round_after(ms: u64, lo: u64, n: u64) -> Result<IdRange, IdError> {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(IdRange { lo, hi: lo + n - 1 })
    }

    #[tokio::test(start_paused = true)]
    async fn the_impatient_expire_and_their_shares_become_holes() {
        let log = Log::default();
        let mut b = batch(&log, &[("a", 2, 100), ("b", 3, 10), ("c", 1, 100)]);
        assert_eq!(b.total(), 6);
        let result = b.wait(round_after(50, 10, 6), Expire::Every).await;
        b.split(result.expect("the round returned").expect("a range"));
        let log = log.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(
            *log,
            vec![
                ("b", Err("deadline".to_string())),
                ("a", Ok(IdRange { lo: 10, hi: 11 })),
                ("c", Ok(IdRange { lo: 15, hi: 15 })),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn every_caller_answered_abandons_the_round() {
        let log = Log::default();
        let mut b = batch(&log, &[("a", 1, 10), ("b", 1, 20)]);
        assert!(b.wait(round_after(50, 1, 2), Expire::Every).await.is_none());
        assert_eq!(log.lock().unwrap_or_else(|e| e.into_inner()).len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn before_latest_leaves_the_last_to_the_round() {
        let log = Log::default();
        let mut b = batch(&log, &[("a", 1, 10), ("b", 1, 20)]);
        let late = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Err(IdError::Deadline {
                deadline: Duration::from_millis(20),
                rounds: 1,
            })
        };
        let result = b.wait(late, Expire::BeforeLatest).await;
        let error = result
            .expect("the round answers")
            .expect_err("its deadline");
        b.fail(&error);
        let log = log.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(log[0], ("a", Err("deadline".to_string())));
        assert_eq!(log[1].0, "b");
        assert_eq!(log[1].1.as_ref().err(), Some(&error.to_string()));
    }

    #[test]
    #[should_panic(expected = "split into 3 IDs")]
    fn a_range_of_the_wrong_size_is_never_split() {
        let log = Log::default();
        batch(&log, &[("a", 1, 10), ("b", 2, 10)]).split(IdRange { lo: 1, hi: 2 });
    }
}

//! The one moving average of the crate (and of the broker's window rounds).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A moving average of durations: each sample moves it an eighth of the way (an
/// exponentially weighted average with weight 1/8, as TCP's smoothed round-trip time), so
/// one slow round shifts it a little and a lasting change within a few rounds.
///
/// What it times: a quorum client's write rounds (the unit of its backoff and of a batch
/// leader's lease) and majority reads (the unit of the read hedge), and a window broker's
/// reservation rounds. Lock-free: two samples recorded at once may overwrite each other,
/// which only loses a sample.
///
/// ```
/// use idclient::MovingAverage;
/// use std::time::Duration;
///
/// let avg = MovingAverage::new(Duration::from_millis(8));
/// avg.record(Duration::from_millis(16));
/// assert_eq!(avg.get(), Duration::from_millis(9));
/// ```
#[derive(Debug)]
pub struct MovingAverage {
    ns: AtomicU64,
}

impl MovingAverage {
    /// An average that starts at `initial`, the estimate until samples come in.
    pub fn new(initial: Duration) -> MovingAverage {
        MovingAverage {
            ns: AtomicU64::new(initial.as_nanos() as u64),
        }
    }

    /// The average now.
    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.ns.load(Ordering::Relaxed))
    }

    /// Adds a sample.
    pub fn record(&self, took: Duration) {
        let avg = self.ns.load(Ordering::Relaxed);
        let next = MovingAverage::step(avg, took.as_nanos() as u64);
        self.ns.store(next, Ordering::Relaxed);
    }

    /// One step on plain nanoseconds: `avg_ns` moved an eighth of the way to
    /// `sample_ns`. For an average kept under a lock with other state (the broker's
    /// window), where an atomic of its own would be one more thing to keep in step.
    pub fn step(avg_ns: u64, sample_ns: u64) -> u64 {
        avg_ns.saturating_mul(7).saturating_add(sample_ns) / 8
    }
}

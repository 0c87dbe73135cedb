//! The broker's counters: lock-free atomics updated by the batcher and the connections,
//! snapshotted into [`BrokerStats`] for the wire and the periodic log line.

use idproto::wire::{BrokerStats, BATCH_BUCKETS};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The source's part of a snapshot (the serving source's `RoundSource::describe`).
type Describe = Box<dyn Fn(&mut BrokerStats) + Send + Sync>;

/// Live counters. Relaxed ordering: each counter is read on its own, for humans.
pub struct Stats {
    started: Instant,
    pub(crate) connections_open: AtomicU64,
    pub(crate) connections_total: AtomicU64,
    pub(crate) connections_dropped: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) requests_ok: AtomicU64,
    pub(crate) requests_failed: AtomicU64,
    /// RESP requests a follower answered by asking the leader (`net::forward`).
    pub(crate) forwarded: AtomicU64,
    /// Wrong or missing tokens (binary Hello, RESP `AUTH` and `HELLO .. AUTH`); only
    /// on `/metrics` (not in [`BrokerStats`], whose wire format is fixed).
    pub(crate) auth_failures: AtomicU64,
    pub(crate) ids: AtomicU64,
    pub(crate) rounds: AtomicU64,
    pub(crate) rounds_failed: AtomicU64,
    pub(crate) batch_max: AtomicU64,
    pub(crate) batch_total: AtomicU64,
    batch_histogram: [AtomicU64; BATCH_BUCKETS],
    round_us_total: AtomicU64,
    round_us_max: AtomicU64,
    describe: OnceLock<Describe>,
}

impl Default for Stats {
    fn default() -> Stats {
        Stats {
            started: Instant::now(),
            connections_open: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            connections_dropped: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            requests_ok: AtomicU64::new(0),
            requests_failed: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            ids: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            rounds_failed: AtomicU64::new(0),
            batch_max: AtomicU64::new(0),
            batch_total: AtomicU64::new(0),
            batch_histogram: std::array::from_fn(|_| AtomicU64::new(0)),
            round_us_total: AtomicU64::new(0),
            round_us_max: AtomicU64::new(0),
            describe: OnceLock::new(),
        }
    }
}

/// The histogram bucket of a batch of `n >= 1` requests: `floor(log2(n))`, capped.
pub(crate) fn bucket(n: u64) -> usize {
    let b = (63 - n.max(1).leading_zeros()) as usize;
    b.min(BATCH_BUCKETS - 1)
}

impl Stats {
    pub(crate) fn round(&self, batch: u64, took: Duration, ok: bool) {
        self.rounds.fetch_add(1, Relaxed);
        if !ok {
            self.rounds_failed.fetch_add(1, Relaxed);
        }
        self.batch_total.fetch_add(batch, Relaxed);
        self.batch_max.fetch_max(batch, Relaxed);
        self.batch_histogram[bucket(batch)].fetch_add(1, Relaxed);
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.round_us_total.fetch_add(us, Relaxed);
        self.round_us_max.fetch_max(us, Relaxed);
    }

    /// A consistent-enough copy for display.
    pub fn snapshot(&self) -> BrokerStats {
        let mut s = BrokerStats {
            uptime_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            connections_open: self.connections_open.load(Relaxed),
            connections_total: self.connections_total.load(Relaxed),
            connections_dropped: self.connections_dropped.load(Relaxed),
            requests: self.requests.load(Relaxed),
            requests_ok: self.requests_ok.load(Relaxed),
            requests_failed: self.requests_failed.load(Relaxed),
            forwarded: self.forwarded.load(Relaxed),
            ids: self.ids.load(Relaxed),
            rounds: self.rounds.load(Relaxed),
            rounds_failed: self.rounds_failed.load(Relaxed),
            batch_max: self.batch_max.load(Relaxed),
            batch_total: self.batch_total.load(Relaxed),
            batch_histogram: self
                .batch_histogram
                .iter()
                .map(|c| c.load(Relaxed))
                .collect(),
            round_us_total: self.round_us_total.load(Relaxed),
            round_us_max: self.round_us_max.load(Relaxed),
            ..BrokerStats::default()
        };
        if let Some(describe) = self.describe.get() {
            describe(&mut s);
        }
        s
    }

    /// Makes every later snapshot include what `describe` adds (the serving source's role
    /// and counters). Only the first call counts (one broker, one source).
    pub(crate) fn set_describe(&self, describe: impl Fn(&mut BrokerStats) + Send + Sync + 'static) {
        let _ = self.describe.set(Box::new(describe));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(2), 1);
        assert_eq!(bucket(3), 1);
        assert_eq!(bucket(4), 2);
        assert_eq!(bucket(255), 7);
        assert_eq!(bucket(256), 8);
        assert_eq!(bucket(u64::MAX), BATCH_BUCKETS - 1);
    }

    #[test]
    fn rounds_are_counted() {
        let s = Stats::default();
        s.round(3, Duration::from_micros(10), true);
        s.round(1, Duration::from_micros(30), false);
        let snap = s.snapshot();
        assert_eq!(
            (
                snap.rounds,
                snap.rounds_failed,
                snap.batch_max,
                snap.batch_total
            ),
            (2, 1, 3, 4)
        );
        assert_eq!((snap.round_us_total, snap.round_us_max), (40, 30));
        assert_eq!(snap.batch_histogram[0..2], [1, 1]);
        assert_eq!(snap.mean_batch(), 2.0);
    }
}

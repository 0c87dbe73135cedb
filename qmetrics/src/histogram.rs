//! A fixed-bucket histogram of durations on atomics: recording is two relaxed
//! `fetch_add`s, so hot paths (every quorum round, every confirmation) can afford it.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds, seconds, for latencies from a loopback Redis round (~100 us) to a
/// deadline (seconds): roughly 1-2.5-5 per decade.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Durations counted into [`LATENCY_BUCKETS`] (and a last, unbounded bucket).
#[derive(Debug)]
pub struct Histogram {
    /// `counts[i]`: observations in `(LATENCY_BUCKETS[i-1], LATENCY_BUCKETS[i]]`; the
    /// last one counts everything above the largest bound.
    counts: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Counts one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|&bound| secs <= bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.counts[i].fetch_add(1, Relaxed);
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// Writes this histogram as `name` (its `_seconds` unit included) with `help`.
    ///
    /// # Errors
    /// Only the formatter's.
    pub fn encode(
        &self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
    ) -> Result<(), std::fmt::Error> {
        let metric = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
        EncodeMetric::encode(self, metric)
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counts: Vec<u64> = self.counts.iter().map(|c| c.load(Relaxed)).collect();
        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(counts.iter().copied())
            .collect();
        // The count is the buckets' total, so `_count` equals the `+Inf` bucket even
        // while other threads record.
        let count = counts.iter().sum();
        let sum = self.sum_ns.load(Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn observations_land_in_their_bucket() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(100)); // on the first bound: le="0.0001"
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(60));
        let mut registry = Registry::default();
        registry.register("t_seconds", "test", h);
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).unwrap();
        for line in [
            "# TYPE t_seconds histogram",
            "t_seconds_count 3",
            "t_seconds_bucket{le=\"0.0001\"} 1",
            "t_seconds_bucket{le=\"0.0025\"} 1",
            "t_seconds_bucket{le=\"0.005\"} 2",
            "t_seconds_bucket{le=\"10\"} 2",
            "t_seconds_bucket{le=\"+Inf\"} 3",
        ] {
            assert!(out.lines().any(|l| l == line), "{line:?} missing in\n{out}");
        }
        let sum = out
            .lines()
            .find_map(|l| l.strip_prefix("t_seconds_sum "))
            .expect("a _sum line");
        let sum: f64 = sum.parse().expect("a number");
        assert!((sum - 60.0031).abs() < 1e-9, "sum {sum}");
    }
}

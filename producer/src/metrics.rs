//! The producer's Prometheus metrics (`producer --metrics-listen`), served through
//! [`qmetrics`]: items and batches durably written by this run, ID requests that
//! failed, and how long each batch waited for its IDs (docs/operations.md).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use qmetrics::{prometheus_client, Histogram};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// Live counters of one producer run, read at scrape time.
#[derive(Debug)]
pub struct ProducerMetrics {
    shard: u32,
    items: AtomicU64,
    batches: AtomicU64,
    id_errors: AtomicU64,
    id_wait: Histogram,
}

impl ProducerMetrics {
    /// Counters of shard `shard`'s run, all zero.
    pub fn new(shard: u32) -> ProducerMetrics {
        ProducerMetrics {
            shard,
            items: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            id_errors: AtomicU64::new(0),
            id_wait: Histogram::default(),
        }
    }

    /// One ID request took `took`; `ok` when it returned IDs.
    pub(crate) fn ids_fetched(&self, took: Duration, ok: bool) {
        self.id_wait.observe(took);
        if !ok {
            self.id_errors.fetch_add(1, Relaxed);
        }
    }

    /// This run has durably written `items` items in `batches` batches so far.
    pub(crate) fn written(&self, items: u64, batches: u64) {
        self.items.fetch_max(items, Relaxed);
        self.batches.fetch_max(batches, Relaxed);
    }
}

impl Collector for ProducerMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut e;
        for (name, help, value) in [
            (
                "qlist_producer_items_written",
                "Items durably written to the sublist by this run",
                self.items.load(Relaxed),
            ),
            (
                "qlist_producer_batches_written",
                "Batches durably written by this run (one ID range and one synced write each)",
                self.batches.load(Relaxed),
            ),
            (
                "qlist_producer_id_errors",
                "ID requests that failed (the run then stops)",
                self.id_errors.load(Relaxed),
            ),
        ] {
            let c = ConstCounter::new(value);
            c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        self.id_wait.encode(
            e,
            "qlist_producer_id_wait_seconds",
            "Time each batch waited for its ID range",
        )?;
        let g = ConstGauge::new(i64::from(self.shard));
        g.encode(e.encode_descriptor(
            "qlist_producer_shard",
            "The shard this producer writes",
            None,
            g.metric_type(),
        )?)
    }
}

/// What `producer --metrics-listen` serves: `metrics`, and ready while it runs.
pub fn endpoints(metrics: Arc<ProducerMetrics>) -> qmetrics::Endpoints {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(metrics));
    qmetrics::Endpoints {
        registry,
        ready: Box::new(|| Box::pin(async { Ok(()) })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_items_batches_and_id_wait() {
        let m = Arc::new(ProducerMetrics::new(3));
        m.ids_fetched(Duration::from_millis(3), true);
        m.ids_fetched(Duration::from_millis(30), false);
        m.written(200, 2);
        m.written(100, 1); // a late, smaller report never goes back
        let out = endpoints(m).metrics_text().expect("encode");
        for line in [
            "# TYPE qlist_producer_items_written_total counter",
            "qlist_producer_items_written_total 200",
            "qlist_producer_batches_written_total 2",
            "qlist_producer_id_errors_total 1",
            "# TYPE qlist_producer_id_wait_seconds histogram",
            "qlist_producer_id_wait_seconds_bucket{le=\"0.005\"} 1",
            "qlist_producer_id_wait_seconds_count 2",
            "qlist_producer_shard 3",
        ] {
            assert!(out.lines().any(|l| l == line), "{line:?} missing in\n{out}");
        }
    }
}

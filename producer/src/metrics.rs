//! The producer's Prometheus metrics (`producer --metrics-listen`), served through
//! [`qmetrics`]: items and batches durably written by this run, ID requests that
//! failed, how long each batch waited for its IDs, and, when publishing as it goes, the
//! items published and checkpoints written by this run, the last claim and how long each
//! publication took (docs/operations.md, docs/producer.md).

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
    published: AtomicU64,
    checkpoints: AtomicU64,
    /// The last checkpoint's claim (`u64::MAX`: finished).
    claim: AtomicU64,
    publish_time: Histogram,
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
            published: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            claim: AtomicU64::new(0),
            publish_time: Histogram::default(),
        }
    }

    /// A checkpoint with `claim` was written, this run having published `items` items so
    /// far; the publication took `took`.
    pub(crate) fn published(&self, items: u64, claim: u64, took: Duration) {
        self.published.fetch_max(items, Relaxed);
        self.checkpoints.fetch_add(1, Relaxed);
        self.claim.fetch_max(claim, Relaxed);
        self.publish_time.observe(took);
    }

    /// The claim of the checkpoint found when the shard was opened.
    pub(crate) fn claimed(&self, claim: u64) {
        self.claim.fetch_max(claim, Relaxed);
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
        for (name, help, value) in [
            (
                "qlist_producer_published_items",
                "Items published into segments by this run (--publish-every)",
                self.published.load(Relaxed),
            ),
            (
                "qlist_producer_checkpoints_written",
                "Checkpoints written by this run (--publish-every)",
                self.checkpoints.load(Relaxed),
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
        self.publish_time.encode(
            e,
            "qlist_producer_publish_seconds",
            "Time each publication took (its segment and its checkpoint)",
        )?;
        // A gauge of f64: infinite once finished (the claim is then infinite); exact up to 2^53.
        let claim = match self.claim.load(Relaxed) {
            u64::MAX => f64::INFINITY,
            c => c as f64,
        };
        let g = ConstGauge::new(claim);
        g.encode(e.encode_descriptor(
            "qlist_producer_claim",
            "The last checkpoint's claim: every item of the shard with an ID at or below it is published (infinite: finished)",
            None,
            g.metric_type(),
        )?)?;
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
        m.published(150, 4567, Duration::from_millis(2));
        let out = endpoints(m.clone()).metrics_text().expect("encode");
        for line in [
            "# TYPE qlist_producer_items_written_total counter",
            "qlist_producer_items_written_total 200",
            "qlist_producer_batches_written_total 2",
            "qlist_producer_id_errors_total 1",
            "# TYPE qlist_producer_id_wait_seconds histogram",
            "qlist_producer_id_wait_seconds_bucket{le=\"0.005\"} 1",
            "qlist_producer_id_wait_seconds_count 2",
            "qlist_producer_shard 3",
            "qlist_producer_published_items_total 150",
            "qlist_producer_checkpoints_written_total 1",
            "qlist_producer_claim 4567.0",
            "qlist_producer_publish_seconds_count 1",
        ] {
            assert!(out.lines().any(|l| l == line), "{line:?} missing in\n{out}");
        }
        m.published(200, u64::MAX, Duration::from_millis(2));
        let out = endpoints(m).metrics_text().expect("encode");
        let claim = out
            .lines()
            .find_map(|l| l.strip_prefix("qlist_producer_claim "))
            .and_then(|v| v.parse::<f64>().ok());
        assert_eq!(claim, Some(f64::INFINITY), "{out}");
    }
}

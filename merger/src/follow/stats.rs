//! What a follower reports: its progress line and its Prometheus metrics
//! (`merger follow --metrics-listen`), from one snapshot it updates at every poll.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use qmetrics::prometheus_client;

/// One shard as last polled.
#[derive(Debug, Clone, Copy)]
pub struct ShardStat {
    /// Its claim: `None` before its first checkpoint, `u64::MAX` once finished.
    pub claim: Option<u64>,
    /// Its producer finished.
    pub finished: bool,
    /// When its claim last moved.
    pub moved_at: Instant,
}

/// The follower's state, as last reported.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The stable watermark: every record with an ID at or below it is emitted or about
    /// to be (`None`: some shard has no checkpoint yet).
    pub watermark: Option<u64>,
    /// Records emitted (written into parts or printed) by this follower.
    pub records: u64,
    /// Parts written by this follower.
    pub parts: u64,
    /// Every expected shard, by number.
    pub shards: Vec<ShardStat>,
    /// When the watermark last moved.
    pub moved_at: Instant,
}

impl Snapshot {
    /// The shard holding the watermark back (the lowest claim, the lowest number among
    /// equals; none once every shard finished), and when its claim last moved.
    pub fn blocking(&self) -> Option<(u32, Instant)> {
        self.shards
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.finished)
            .min_by_key(|(_, s)| s.claim)
            .map(|(i, s)| (i as u32, s.moved_at))
    }

    /// The largest claim of an unfinished shard with one: how far the published list reaches.
    fn front(&self) -> Option<u64> {
        self.shards
            .iter()
            .filter(|s| !s.finished)
            .filter_map(|s| s.claim)
            .max()
    }

    /// How far shard `i`'s claim is behind the most advanced unfinished shard's, in IDs
    /// (0 once finished).
    pub fn lag_ids(&self, i: usize) -> u64 {
        let s = &self.shards[i];
        if s.finished {
            return 0;
        }
        self.front()
            .unwrap_or(0)
            .saturating_sub(s.claim.unwrap_or(0))
    }

    /// The progress line: `W=.. (shard N holds it back since ..s), R records in P parts,
    /// lag L ids`.
    pub fn line(&self, now: Instant) -> String {
        let w = match self.watermark {
            None => "none".to_string(),
            Some(u64::MAX) => "max (every shard finished)".to_string(),
            Some(w) => w.to_string(),
        };
        let held = match self.blocking() {
            Some((shard, at)) => {
                let what = match self.shards[shard as usize].claim {
                    None => "has no checkpoint".to_string(),
                    Some(c) => format!("claims {c}"),
                };
                format!(
                    " (held by shard {shard}, which {what}, unchanged for {:.1}s)",
                    now.saturating_duration_since(at).as_secs_f64()
                )
            }
            None => String::new(),
        };
        let lag = self
            .front()
            .zip(self.watermark)
            .map_or(0, |(f, w)| f.saturating_sub(w));
        format!(
            "follow: W={w}{held}, {} records in {} parts, lag {lag} ids",
            self.records, self.parts
        )
    }
}

/// The follower's snapshot, shared with the metrics endpoint.
#[derive(Debug)]
pub struct FollowStats {
    snapshot: Mutex<Snapshot>,
}

impl FollowStats {
    /// Nothing known yet about `shards` shards.
    pub fn new(shards: u32) -> FollowStats {
        let now = Instant::now();
        FollowStats {
            snapshot: Mutex::new(Snapshot {
                watermark: None,
                records: 0,
                parts: 0,
                shards: vec![
                    ShardStat {
                        claim: None,
                        finished: false,
                        moved_at: now,
                    };
                    shards as usize
                ],
                moved_at: now,
            }),
        }
    }

    /// The last snapshot.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the snapshot.
    pub fn set(&self, s: Snapshot) {
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }
}

/// An ID as a gauge's value: Prometheus values are floats; `u64::MAX` (a finished
/// shard's claim) is +Inf and no claim yet is -1.
fn id_value(id: Option<u64>) -> f64 {
    match id {
        None => -1.0,
        Some(u64::MAX) => f64::INFINITY,
        Some(v) => v as f64,
    }
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A gauge with one value per shard (label `shard`).
fn per_shard(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: impl Iterator<Item = f64>,
) -> std::fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (i, v) in values.enumerate() {
        let shard = i.to_string();
        ConstGauge::new(v).encode(m.encode_family(&[("shard", shard.as_str())])?)?;
    }
    Ok(())
}

impl Collector for FollowStats {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let e = &mut e;
        let s = self.snapshot();
        let now = Instant::now();
        gauge(
            e,
            "qlist_follow_watermark",
            "The stable watermark W: every record with an ID at or below it is final (-1: a shard has no checkpoint yet, +Inf: every shard finished)",
            id_value(s.watermark),
        )?;
        for (name, help, v) in [
            (
                "qlist_follow_records",
                "Records emitted by this follower",
                s.records,
            ),
            (
                "qlist_follow_parts",
                "Parts written by this follower",
                s.parts,
            ),
        ] {
            let c = ConstCounter::new(v);
            c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        per_shard(
            e,
            "qlist_follow_shard_claim",
            "Each shard's claim (-1: no checkpoint yet, +Inf: finished)",
            s.shards.iter().map(|x| id_value(x.claim)),
        )?;
        per_shard(
            e,
            "qlist_follow_lag_ids",
            "How far each shard's claim is behind the most advanced unfinished shard's, in IDs",
            (0..s.shards.len()).map(|i| s.lag_ids(i) as f64),
        )?;
        per_shard(
            e,
            "qlist_follow_lag_seconds",
            "Seconds since each shard's claim last moved (0 once finished)",
            s.shards.iter().map(|x| {
                if x.finished {
                    0.0
                } else {
                    now.saturating_duration_since(x.moved_at).as_secs_f64()
                }
            }),
        )?;
        let blocking = s.blocking();
        gauge(
            e,
            "qlist_follow_blocking_shard",
            "The shard holding the watermark back (-1: none, every shard finished)",
            blocking.map_or(-1.0, |(shard, _)| f64::from(shard)),
        )?;
        gauge(
            e,
            "qlist_follow_blocking_seconds",
            "Seconds since the claim of the shard holding the watermark back last moved",
            blocking.map_or(0.0, |(_, at)| {
                now.saturating_duration_since(at).as_secs_f64()
            }),
        )
    }
}

/// What `merger follow --metrics-listen` serves: `stats`, ready while it runs.
pub fn endpoints(stats: std::sync::Arc<FollowStats>) -> qmetrics::Endpoints {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(stats));
    qmetrics::Endpoints {
        registry,
        ready: Box::new(|| Box::pin(async { Ok(()) })),
    }
}

/// How often a follower logs its progress line.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_w_claims_lags_and_the_blocking_shard() {
        let stats = std::sync::Arc::new(FollowStats::new(3));
        let mut s = stats.snapshot();
        s.watermark = Some(100);
        s.records = 42;
        s.parts = 2;
        s.shards[0].claim = Some(100);
        s.shards[1].claim = Some(250);
        s.shards[2].claim = Some(u64::MAX);
        s.shards[2].finished = true;
        stats.set(s.clone());
        assert_eq!(s.blocking().map(|b| b.0), Some(0));
        assert!(s
            .line(Instant::now())
            .starts_with("follow: W=100 (held by shard 0, which claims 100, unchanged for "));
        let out = endpoints(stats).metrics_text().expect("encode");
        for line in [
            "qlist_follow_watermark 100.0",
            "qlist_follow_records_total 42",
            "qlist_follow_parts_total 2",
            "qlist_follow_shard_claim{shard=\"1\"} 250.0",
            "qlist_follow_shard_claim{shard=\"2\"} +Inf",
            "qlist_follow_lag_ids{shard=\"0\"} 150.0",
            "qlist_follow_lag_ids{shard=\"2\"} 0.0",
            "qlist_follow_lag_seconds{shard=\"2\"} 0.0",
            "qlist_follow_blocking_shard 0.0",
        ] {
            assert!(out.lines().any(|l| l == line), "{line:?} missing in\n{out}");
        }
        assert!(out.contains("qlist_follow_lag_seconds{shard=\"0\"} "));
    }
}

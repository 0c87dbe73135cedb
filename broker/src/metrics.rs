//! The broker's Prometheus metrics and readiness, served by `idbroker --metrics-listen`
//! through [`qmetrics`] (docs/operations.md lists every metric).
//!
//! Counters are not duplicated: [`BrokerMetrics`] is a collector that reads the broker's
//! [`Stats`] snapshot (window counters, role and term included) and the quorum client's
//! per-node counters at scrape time. Only the latency histograms are recorded on their
//! own, by [`Timed`], a wrapper around the quorum that times each write round, majority
//! read (a window confirmation) and reservation on atomics, and notes the last success
//! for [`Readiness`].

use crate::serve::source::RoundSource;
use crate::serve::window::WindowQuorum;
use crate::stats::Stats;
use futures::future::BoxFuture;
use idclient::{IdError, IdRange, NodeCounters, QuorumClient};
use idproto::wire::{BrokerStats, BATCH_BUCKETS};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use qmetrics::{prometheus_client, Histogram};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A quorum operation that succeeded at most this long ago makes the broker ready
/// without another probe.
pub const READY_FRESH: Duration = Duration::from_secs(5);

/// Time the readiness probe (a majority read) may take.
pub const READY_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Roles always exported by `qlist_broker_role` (the current one is 1, the others 0).
const ROLES: [&str; 5] = ["leader", "follower", "candidate", "window", "rounds"];

/// Latency histograms of quorum operations, and when one last succeeded.
#[derive(Debug)]
pub struct Timings {
    rounds: Histogram,
    confirmations: Histogram,
    reservations: Histogram,
    epoch: Instant,
    /// Milliseconds from `epoch` to the last success, plus one (0: never).
    last_ok_ms: AtomicU64,
}

impl Default for Timings {
    fn default() -> Timings {
        Timings {
            rounds: Histogram::default(),
            confirmations: Histogram::default(),
            reservations: Histogram::default(),
            epoch: Instant::now(),
            last_ok_ms: AtomicU64::new(0),
        }
    }
}

impl Timings {
    /// Notes that a majority of the quorum answered just now.
    pub fn quorum_ok(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last_ok_ms.fetch_max(ms + 1, Relaxed);
    }

    /// How long ago a quorum operation last succeeded, if one ever did.
    pub fn since_quorum_ok(&self) -> Option<Duration> {
        let ms = self.last_ok_ms.load(Relaxed).checked_sub(1)?;
        Some(
            self.epoch
                .elapsed()
                .saturating_sub(Duration::from_millis(ms)),
        )
    }

    async fn time<T>(
        &self,
        histogram: &Histogram,
        op: impl Future<Output = Result<T, IdError>>,
        ok: impl Fn(&T) -> bool,
    ) -> Result<T, IdError> {
        let started = Instant::now();
        let result = op.await;
        histogram.observe(started.elapsed());
        if result.as_ref().is_ok_and(ok) {
            self.quorum_ok();
        }
        result
    }
}

/// The quorum `Q`, timed: a [`RoundSource`] (`--serve rounds`) or a [`WindowQuorum`]
/// (under a [`crate::WindowSource`]) that records into [`Timings`].
pub struct Timed<Q> {
    inner: Arc<Q>,
    timings: Arc<Timings>,
}

impl<Q> Timed<Q> {
    /// `inner`, recording into `timings`.
    pub fn new(inner: Arc<Q>, timings: Arc<Timings>) -> Timed<Q> {
        Timed { inner, timings }
    }
}

impl<Q: RoundSource> RoundSource for Timed<Q> {
    fn next_ids_until(
        &self,
        n: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<IdRange, IdError>> + Send {
        let t = &self.timings;
        t.time(&t.rounds, self.inner.next_ids_until(n, deadline), |_| true)
    }

    fn describe(&self, stats: &mut BrokerStats) {
        self.inner.describe(stats);
    }
}

impl<Q: WindowQuorum> WindowQuorum for Timed<Q> {
    fn round(
        &self,
        n: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<IdRange, IdError>> + Send {
        let t = &self.timings;
        t.time(&t.rounds, self.inner.round(n, deadline), |_| true)
    }

    fn reserve(
        &self,
        lo: u64,
        hi: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<bool, IdError>> + Send {
        // Only a win proves a majority answered (a loss may be an unknown outcome).
        let t = &self.timings;
        t.time(
            &t.reservations,
            self.inner.reserve(lo, hi, deadline),
            |won| *won,
        )
    }

    fn read_max(&self, deadline: Instant) -> impl Future<Output = Result<u64, IdError>> + Send {
        let t = &self.timings;
        t.time(&t.confirmations, self.inner.read_max(deadline), |_| true)
    }
}

/// The per-node counters' source (the quorum client's [`QuorumClient::node_counters`]).
pub type NodeCountersFn = Box<dyn Fn() -> Vec<NodeCounters> + Send + Sync>;

/// The collector behind `/metrics`: everything is read at scrape time.
pub struct BrokerMetrics {
    stats: Arc<Stats>,
    timings: Arc<Timings>,
    nodes: NodeCountersFn,
}

impl std::fmt::Debug for BrokerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerMetrics").finish_non_exhaustive()
    }
}

impl BrokerMetrics {
    /// Reads `stats`, `timings` and `nodes` on every scrape.
    pub fn new(stats: Arc<Stats>, timings: Arc<Timings>, nodes: NodeCountersFn) -> BrokerMetrics {
        BrokerMetrics {
            stats,
            timings,
            nodes,
        }
    }
}

/// A node's label: `host:port` only, whatever the configured URL carried (scheme, user,
/// password, database, query). A URL without a host (a Unix socket) keeps its path.
pub fn node_label(addr: &str) -> String {
    let rest = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    // The last '@' ends the user info, even when an unencoded password holds a '/'.
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    match rest.split('/').next() {
        Some(host) if !host.is_empty() => host.to_string(),
        _ => rest.to_string(),
    }
}

fn counter(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(value);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(value);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A counter family with one label: `(label value, count)` pairs.
fn counters(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &str,
    values: &[(&str, u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (value, n) in values {
        ConstCounter::new(*n).encode(m.encode_family(&[(label, *value)])?)?;
    }
    Ok(())
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The batch-size histogram from [`Stats`]' power-of-two buckets: bucket `i` holds
/// batches of `2^i ..= 2^(i+1)-1` requests, the last one everything larger.
fn batch_sizes(e: &mut DescriptorEncoder, s: &BrokerStats) -> Result<(), std::fmt::Error> {
    let buckets: Vec<(f64, u64)> = (0..BATCH_BUCKETS)
        .map(|i| {
            let le = if i + 1 == BATCH_BUCKETS {
                f64::INFINITY
            } else {
                ((1u64 << (i + 1)) - 1) as f64
            };
            (le, s.batch_histogram.get(i).copied().unwrap_or(0))
        })
        .collect();
    let count = buckets.iter().map(|(_, n)| n).sum();
    let mut m = e.encode_descriptor(
        "qlist_broker_batch_size",
        "Requests served by one batch (one round, or one confirmation in window mode)",
        None,
        MetricType::Histogram,
    )?;
    m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
        s.batch_total as f64,
        count,
        &buckets,
        None,
    )
}

impl Collector for BrokerMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.stats.snapshot();
        let e = &mut e;
        let g = ConstGauge::new(s.uptime_ms as f64 / 1000.0);
        g.encode(e.encode_descriptor(
            "qlist_broker_uptime_seconds",
            "Seconds since the broker started serving",
            None,
            g.metric_type(),
        )?)?;
        requests(e, &s)?;
        self.rounds(e, &s)?;
        self.nodes(e)?;
        connections(e, &s, &self.stats)?;
        leadership(e, &s)
    }
}

impl BrokerMetrics {
    /// Batches, their rounds, confirmations and reservations, and the window.
    fn rounds(&self, e: &mut DescriptorEncoder, s: &BrokerStats) -> Result<(), std::fmt::Error> {
        counters(
            e,
            "qlist_broker_batches",
            "Batches run, by outcome (each serves every request queued when it starts)",
            "outcome",
            &[
                ("ok", s.rounds.saturating_sub(s.rounds_failed)),
                ("failed", s.rounds_failed),
            ],
        )?;
        batch_sizes(e, s)?;
        self.timings.rounds.encode(
            e,
            "qlist_broker_round_duration_seconds",
            "Duration of quorum write rounds (a round per batch, or one starting a window)",
        )?;
        self.timings.confirmations.encode(
            e,
            "qlist_broker_confirmation_duration_seconds",
            "Duration of majority reads confirming a batch (window mode)",
        )?;
        self.timings.reservations.encode(
            e,
            "qlist_broker_reservation_duration_seconds",
            "Duration of window reservations (window mode)",
        )?;
        counters(
            e,
            "qlist_broker_confirmations",
            "Majority reads that confirmed a batch (ok) or found another writer (failed)",
            "outcome",
            &[
                ("ok", s.confirmations.saturating_sub(s.confirmations_failed)),
                ("failed", s.confirmations_failed),
            ],
        )?;
        counters(
            e,
            "qlist_broker_reservations",
            "Window reservations won, and lost or of unknown outcome",
            "outcome",
            &[("won", s.reservations), ("lost", s.reservations_lost)],
        )?;
        gauge(
            e,
            "qlist_broker_window_size",
            "Target window size, IDs (window mode)",
            to_i64(s.window_size),
        )?;
        Ok(())
    }

    /// Each quorum node's errors and timeouts.
    fn nodes(&self, e: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let nodes = (self.nodes)();
        let labels: Vec<String> = nodes.iter().map(|n| node_label(&n.addr)).collect();
        for (name, help, timeouts) in [
            (
                "qlist_broker_node_errors",
                "Failed calls to a quorum node, timeouts excluded",
                false,
            ),
            (
                "qlist_broker_node_timeouts",
                "Calls to a quorum node that timed out",
                true,
            ),
        ] {
            let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (node, label) in nodes.iter().zip(&labels) {
                let n = if timeouts { node.timeouts } else { node.errors };
                ConstCounter::new(n).encode(m.encode_family(&[("node", label.as_str())])?)?;
            }
        }
        Ok(())
    }
}

/// Requests by outcome, forwarded ones, IDs and holes.
fn requests(e: &mut DescriptorEncoder, s: &BrokerStats) -> Result<(), std::fmt::Error> {
    counters(
        e,
        "qlist_broker_requests",
        "ID requests answered, by outcome: ok (IDs), failed (an error), redirected (to the leader)",
        "outcome",
        &[
            ("ok", s.requests_ok),
            ("failed", s.requests_failed),
            ("redirected", s.redirects),
        ],
    )?;
    counter(
        e,
        "qlist_broker_forwarded",
        "RESP requests a follower forwarded to the leader (also counted by outcome)",
        s.forwarded,
    )?;
    counter(
        e,
        "qlist_broker_ids",
        "IDs handed out (holes excluded)",
        s.ids,
    )?;
    counter(
        e,
        "qlist_broker_holes",
        "IDs reserved but never handed out (dead windows)",
        s.holes,
    )?;
    Ok(())
}

/// Connections: open, accepted, dropped, and failed authentications.
fn connections(
    e: &mut DescriptorEncoder,
    s: &BrokerStats,
    stats: &Stats,
) -> Result<(), std::fmt::Error> {
    gauge(
        e,
        "qlist_broker_connections_open",
        "Client connections open now",
        to_i64(s.connections_open),
    )?;
    counter(
        e,
        "qlist_broker_connections",
        "Client connections accepted",
        s.connections_total,
    )?;
    // Admission and authentication: read live, not in BrokerStats.
    counter(
        e,
        "qlist_broker_auth_failures",
        "Wrong or missing tokens: binary Hellos, RESP AUTH and HELLO AUTH (each connection is closed after a few)",
        stats.auth_failures.load(std::sync::atomic::Ordering::Relaxed),
    )?;
    counter(
        e,
        "qlist_broker_connections_dropped",
        "Client connections closed by the broker (timeouts, violations, eviction, refusal)",
        s.connections_dropped,
    )?;
    Ok(())
}

/// The broker's role, the highest term seen, and whether a leader is known.
fn leadership(e: &mut DescriptorEncoder, s: &BrokerStats) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(
        "qlist_broker_role",
        "The broker's role: 1 for the current one",
        None,
        MetricType::Gauge,
    )?;
    let current = s.role.as_str();
    let extra = (!current.is_empty() && !ROLES.contains(&current)).then_some(current);
    for role in ROLES.iter().copied().chain(extra) {
        ConstGauge::new(i64::from(role == current)).encode(m.encode_family(&[("role", role)])?)?;
    }
    gauge(
        e,
        "qlist_broker_term",
        "Highest leader term seen (0: none)",
        to_i64(s.term),
    )?;
    gauge(
        e,
        "qlist_broker_leader_known",
        "1 when the broker knows a leader",
        i64::from(s.leader.is_some()),
    )?;
    Ok(())
}

/// A readiness probe: `Ok` when a majority answered (a cheap majority read).
pub type ProbeFn = Box<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// `/readyz`: the broker can hand out IDs now.
pub struct Readiness {
    stats: Arc<Stats>,
    timings: Arc<Timings>,
    probe: ProbeFn,
    /// One probe at a time, however many checks arrive.
    probing: tokio::sync::Mutex<()>,
}

impl Readiness {
    /// Checks `stats`' role and `timings`' last success, running `probe` when that is
    /// older than [`READY_FRESH`].
    pub fn new(stats: Arc<Stats>, timings: Arc<Timings>, probe: ProbeFn) -> Readiness {
        Readiness {
            stats,
            timings,
            probe,
            probing: tokio::sync::Mutex::new(()),
        }
    }

    /// `Ok` when ready, else why not (one line).
    ///
    /// # Errors
    /// The reason: an election under way, a follower with no known leader, or no quorum
    /// reachable.
    pub async fn check(&self) -> Result<(), String> {
        let s = self.stats.snapshot();
        match (s.role.as_str(), &s.leader) {
            ("candidate", _) => {
                return Err(format!(
                    "no leader: an election is under way (term {})",
                    s.term
                ))
            }
            ("follower", None) => return Err("follower that knows no leader".to_string()),
            _ => {}
        }
        let fresh = |t: &Timings| t.since_quorum_ok().is_some_and(|d| d <= READY_FRESH);
        if fresh(&self.timings) {
            return Ok(());
        }
        let _one = self.probing.lock().await;
        if fresh(&self.timings) {
            return Ok(()); // another check's probe just succeeded
        }
        (self.probe)()
            .await
            .map_err(|e| format!("no quorum reachable: {e}"))?;
        self.timings.quorum_ok();
        Ok(())
    }
}

/// Serves [`endpoints`] on `listener` with [`qmetrics`]' default limits, until aborted.
pub async fn serve(
    listener: tokio::net::TcpListener,
    stats: Arc<Stats>,
    timings: Arc<Timings>,
    quorum: Arc<QuorumClient>,
) {
    let endpoints = Arc::new(endpoints(stats, timings, quorum));
    qmetrics::serve(listener, endpoints, qmetrics::Limits::default()).await;
}

/// What `idbroker --metrics-listen` serves for a broker counting into `stats` and
/// `timings` over `quorum`.
pub fn endpoints(
    stats: Arc<Stats>,
    timings: Arc<Timings>,
    quorum: Arc<QuorumClient>,
) -> qmetrics::Endpoints {
    let mut registry = prometheus_client::registry::Registry::default();
    let nodes = quorum.clone();
    registry.register_collector(Box::new(BrokerMetrics::new(
        stats.clone(),
        timings.clone(),
        Box::new(move || nodes.node_counters()),
    )));
    let probe: ProbeFn = Box::new(move || {
        let quorum = quorum.clone();
        Box::pin(async move {
            quorum
                .read_max(Instant::now() + READY_PROBE_TIMEOUT)
                .await
                .map(|_| ())
                .map_err(|e| format!("{e:#}"))
        })
    });
    let readiness = Arc::new(Readiness::new(stats, timings, probe));
    qmetrics::Endpoints {
        registry,
        ready: Box::new(move || {
            let readiness = readiness.clone();
            Box::pin(async move { readiness.check().await })
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    fn exposition(stats: &Arc<Stats>, timings: &Arc<Timings>, nodes: Vec<NodeCounters>) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(BrokerMetrics::new(
            stats.clone(),
            timings.clone(),
            Box::new(move || nodes.clone()),
        )));
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry).expect("encode");
        out
    }

    #[track_caller]
    fn has(out: &str, line: &str) {
        assert!(out.lines().any(|l| l == line), "{line:?} missing in\n{out}");
    }

    #[test]
    fn node_labels_are_host_and_port_only() {
        for (addr, label) in [
            ("redis://127.0.0.1:6379", "127.0.0.1:6379"),
            ("redis://:***@10.0.0.5:7000/2", "10.0.0.5:7000"),
            ("redis://:hunter2@h:1", "h:1"),
            (
                "rediss://user:p@ss/w@rd@db.example:6380/0?x=1",
                "db.example:6380",
            ),
            ("redis://h:1?password=hunter2", "h:1"),
            ("10.0.0.7:6379", "10.0.0.7:6379"),
            ("redis+unix:///run/redis.sock?pass=x", "/run/redis.sock"),
        ] {
            assert_eq!(node_label(addr), label, "{addr}");
        }
    }

    #[test]
    fn the_exposition_names_every_counter_with_its_labels() {
        let stats = Arc::new(Stats::default());
        stats.requests_ok.store(5, Relaxed);
        stats.requests_failed.store(2, Relaxed);
        stats.ids.store(40, Relaxed);
        stats.connections_total.store(3, Relaxed);
        stats.connections_open.store(1, Relaxed);
        stats.round(3, Duration::from_millis(1), true);
        stats.round(1, Duration::from_millis(1), false);
        let timings = Arc::new(Timings::default());
        timings.rounds.observe(Duration::from_millis(2));
        let nodes = vec![
            NodeCounters {
                addr: "redis://:***@127.0.0.1:7001".into(),
                errors: 4,
                timeouts: 1,
            },
            NodeCounters {
                addr: "redis://127.0.0.1:7002".into(),
                errors: 0,
                timeouts: 0,
            },
        ];
        let out = exposition(&stats, &timings, nodes);
        for line in [
            "# TYPE qlist_broker_requests_total counter",
            "qlist_broker_requests_total{outcome=\"ok\"} 5",
            "qlist_broker_requests_total{outcome=\"failed\"} 2",
            "qlist_broker_requests_total{outcome=\"redirected\"} 0",
            "qlist_broker_ids_total 40",
            "qlist_broker_holes_total 0",
            "qlist_broker_batches_total{outcome=\"ok\"} 1",
            "qlist_broker_batches_total{outcome=\"failed\"} 1",
            "# TYPE qlist_broker_batch_size histogram",
            "qlist_broker_batch_size_bucket{le=\"1\"} 1",
            "qlist_broker_batch_size_bucket{le=\"3\"} 2",
            "qlist_broker_batch_size_bucket{le=\"+Inf\"} 2",
            "qlist_broker_batch_size_sum 4.0",
            "qlist_broker_batch_size_count 2",
            "# TYPE qlist_broker_round_duration_seconds histogram",
            "qlist_broker_round_duration_seconds_count 1",
            "qlist_broker_round_duration_seconds_bucket{le=\"0.0025\"} 1",
            "qlist_broker_confirmation_duration_seconds_count 0",
            "qlist_broker_reservation_duration_seconds_count 0",
            "qlist_broker_node_errors_total{node=\"127.0.0.1:7001\"} 4",
            "qlist_broker_node_errors_total{node=\"127.0.0.1:7002\"} 0",
            "qlist_broker_node_timeouts_total{node=\"127.0.0.1:7001\"} 1",
            "qlist_broker_connections_open 1",
            "qlist_broker_connections_total 3",
            "qlist_broker_connections_dropped_total 0",
            // A bare Stats has no source: no role yet, so every known role is 0.
            "qlist_broker_role{role=\"leader\"} 0",
            "qlist_broker_term 0",
            "qlist_broker_leader_known 0",
            "# TYPE qlist_broker_window_size gauge",
        ] {
            has(&out, line);
        }
        assert!(!out.contains("***"), "{out}");
    }

    /// A source with the leader issue's fields, as another broker would describe itself.
    struct Described(&'static str, Option<&'static str>, u64);
    impl RoundSource for Described {
        async fn next_ids_until(&self, _n: u64, _deadline: Instant) -> Result<IdRange, IdError> {
            Err(IdError::Config("unused".into()))
        }
        fn describe(&self, stats: &mut BrokerStats) {
            stats.role = self.0.to_string();
            stats.leader = self.1.map(str::to_string);
            stats.term = self.2;
        }
    }

    fn described(role: &'static str, leader: Option<&'static str>, term: u64) -> Arc<Stats> {
        let stats = Arc::new(Stats::default());
        let source = Described(role, leader, term);
        stats.set_describe(move |s| source.describe(s));
        stats
    }

    #[test]
    fn role_term_and_leader_come_from_the_snapshot() {
        let stats = described("follower", Some("10.0.0.1:7100"), 7);
        let out = exposition(&stats, &Arc::default(), Vec::new());
        has(&out, "qlist_broker_role{role=\"follower\"} 1");
        has(&out, "qlist_broker_role{role=\"leader\"} 0");
        has(&out, "qlist_broker_term 7");
        has(&out, "qlist_broker_leader_known 1");
        let out = exposition(&described("observer", None, 0), &Arc::default(), Vec::new());
        has(&out, "qlist_broker_role{role=\"observer\"} 1");
    }

    fn readiness(stats: Arc<Stats>, timings: Arc<Timings>, probe_ok: bool) -> Readiness {
        let probe: ProbeFn = Box::new(move || {
            Box::pin(async move {
                if probe_ok {
                    Ok(())
                } else {
                    Err("2 of 3 nodes unreachable".to_string())
                }
            })
        });
        Readiness::new(stats, timings, probe)
    }

    #[tokio::test]
    async fn ready_needs_a_reachable_quorum_and_a_known_leader() {
        let rounds = || described("rounds", None, 0);
        // Nothing succeeded yet: the probe decides.
        let r = readiness(rounds(), Arc::default(), false);
        let err = r.check().await.expect_err("no quorum");
        assert!(
            err.contains("no quorum reachable: 2 of 3 nodes unreachable"),
            "{err}"
        );
        let timings = Arc::new(Timings::default());
        readiness(rounds(), timings.clone(), true)
            .check()
            .await
            .expect("the probe succeeds");
        // A recent success is enough: the failing probe is not even asked.
        readiness(rounds(), timings.clone(), false)
            .check()
            .await
            .expect("a quorum answered moments ago");
        let err = readiness(described("candidate", None, 4), timings.clone(), true)
            .check()
            .await
            .expect_err("election under way");
        assert!(err.contains("election") && err.contains("term 4"), "{err}");
        readiness(described("follower", None, 4), timings.clone(), true)
            .check()
            .await
            .expect_err("no leader known");
        readiness(described("follower", Some("h:1"), 4), timings.clone(), true)
            .check()
            .await
            .expect("knows its leader");
        readiness(described("leader", None, 4), timings, true)
            .check()
            .await
            .expect("is the leader");
    }
}

//! Leader failover under load, measured (`idctl failover`): B `idbroker` processes on one
//! quorum, C callers of one [`BrokerClient`] over all of them, and K times: wait for one
//! leader, kill -9 it, time how long until a request made after the kill returns IDs,
//! start the killed broker again on its port. Every request is recorded, so the run also
//! checks the history (no ID twice, real-time order) and counts every failed request.
//!
//! The failover time of one kill runs from the moment the killed process has been reaped
//! (it can serve nothing after that) to the return of the first successful request
//! invoked after it: only a live broker can have served that request.

use crate::announced::Announced;
use crate::history::{self, monotonic_ns, Event, Violation};
use idclient::broker_client::{
    fetch_stats, fetch_stats_with_token, BrokerClient, BrokerClientConfig,
};
use idproto::auth::Token;
use idproto::wire::BrokerStats;
use idproto::IdSource;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Longest wait for a broker to print `listening on ADDR`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for a failover: past it the kill counts as a failed failover.
pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between two polls of the brokers' roles or of the load.
const POLL: Duration = Duration::from_millis(10);

/// What to run.
#[derive(Debug, Clone)]
pub struct FailoverConfig {
    /// The `idbroker` binary.
    pub idbroker: PathBuf,
    /// The quorum's node URLs.
    pub nodes: Vec<String>,
    /// Brokers started (at least 2: someone has to take over).
    pub brokers: usize,
    /// Leaders killed, one after another.
    pub kills: usize,
    /// Concurrent callers of the one broker client.
    pub callers: usize,
    /// The callers' deadline per request.
    pub deadline: Duration,
    /// Longest wait for exactly one leader before each kill.
    pub settle_timeout: Duration,
    /// Extra `idbroker` arguments (e.g. `--election-timeout-ms 300`).
    pub broker_args: Vec<String>,
}

/// What happened.
#[derive(Debug, Clone, Default)]
pub struct FailoverReport {
    /// Time from each kill to the first ID of a request invoked after it, in kill order.
    pub failovers: Vec<Duration>,
    /// Kills after which no request succeeded within [`FAILOVER_TIMEOUT`].
    pub failed_failovers: u64,
    /// Every failed request, whenever it returned.
    pub errors: u64,
    pub first_error: Option<String>,
    /// Every request of the run.
    pub events: Vec<Event>,
}

impl FailoverReport {
    /// The `q`-quantile (0..=1) of the failover times (zero without any).
    pub fn quantile(&self, q: f64) -> Duration {
        let mut v = self.failovers.clone();
        v.sort();
        match v.len() {
            0 => Duration::ZERO,
            n => v[((n - 1) as f64 * q).round() as usize],
        }
    }

    /// The history check: no ID twice, every ID above those returned before it was asked for.
    ///
    /// # Errors
    /// The first violation.
    pub fn check(&self) -> Result<(), Violation> {
        history::check(&self.events)
    }

    /// One JSON object for scripts and BENCHMARKS.md.
    pub fn json(&self) -> String {
        let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
        let ids: u64 = self
            .events
            .iter()
            .filter_map(|e| e.outcome)
            .map(|r| r.len())
            .sum();
        serde_json::json!({
            "kills": self.failovers.len() as u64 + self.failed_failovers,
            "failover_p50_ms": ms(self.quantile(0.5)),
            "failover_max_ms": ms(self.quantile(1.0)),
            "failovers_ms": self.failovers.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            "failed_failovers": self.failed_failovers,
            "requests": self.events.len(),
            "ids": ids,
            "errors": self.errors,
        })
        .to_string()
    }
}

/// Starts an idbroker listening on `listen` and waits (on a blocking thread, not a
/// runtime worker) for its `listening on ADDR` line.
async fn spawn(config: &FailoverConfig, listen: &str) -> anyhow::Result<Announced> {
    let mut cmd = Command::new(&config.idbroker);
    cmd.args(["--listen", listen, "--nodes", &config.nodes.join(",")])
        .args(&config.broker_args)
        .stderr(Stdio::null());
    let started = tokio::task::spawn_blocking(move || {
        Announced::start(&mut cmd, &["listening on "], START_TIMEOUT)
    })
    .await?;
    started.map_err(|e| anyhow::anyhow!("idbroker --listen {listen}: {e}"))
}

/// The one broker all live brokers agree leads, waiting up to `timeout` for it.
async fn one_leader(brokers: &[Announced], timeout: Duration) -> anyhow::Result<usize> {
    let until = Instant::now() + timeout;
    let mut seen = String::new();
    loop {
        let mut leaders = Vec::new();
        seen.clear();
        for (i, b) in brokers.iter().enumerate() {
            match fetch_stats(b.addr()).await {
                Ok(s) => {
                    seen.push_str(&format!(" {}={}/{}", b.addr(), s.role, s.term));
                    if s.role == "leader" {
                        leaders.push(i);
                    }
                }
                Err(e) => seen.push_str(&format!(" {}=({e})", b.addr())),
            }
        }
        if let [one] = leaders[..] {
            return Ok(one);
        }
        if Instant::now() >= until {
            anyhow::bail!("no single leader within {timeout:?}:{seen}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The index of the one broker that leads while every other one follows it in its
/// term, naming it. `views`: each broker's index, address and stats (`None`: it did not
/// answer). `None` while they do not agree (an election under way, two leaders, a
/// follower that has not heard of the leader yet).
pub fn settled_leader(views: &[(usize, &str, Option<&BrokerStats>)]) -> Option<usize> {
    let mut leaders = views
        .iter()
        .filter(|(_, _, s)| s.is_some_and(|s| s.role == "leader"));
    let (Some(&(l, addr, Some(lead))), None) = (leaders.next(), leaders.next()) else {
        return None;
    };
    let followed = views.iter().all(|&(i, _, s)| {
        i == l
            || s.is_some_and(|s| {
                s.role == "follower" && s.term == lead.term && s.leader.as_deref() == Some(addr)
            })
    });
    followed.then_some(l)
}

/// Polls `brokers` (each one's index and address; `token` for brokers that require one)
/// until [`settled_leader`] holds for them, for at most `limit`: the leader's index.
/// `Err` gives each broker's role and term at the last poll. A broker that does not
/// answer within [`STATS_TIMEOUT`] counts as not settled.
///
/// # Errors
/// As above, when they did not settle within `limit`.
pub async fn wait_settled(
    brokers: &[(usize, &str)],
    token: Option<&Token>,
    limit: Duration,
) -> Result<usize, String> {
    let end = Instant::now() + limit;
    loop {
        let mut all = Vec::new();
        for &(i, addr) in brokers {
            all.push((i, addr, stats(addr, token).await));
        }
        let views: Vec<_> = all.iter().map(|(i, a, s)| (*i, *a, s.as_ref())).collect();
        if let Some(l) = settled_leader(&views) {
            return Ok(l);
        }
        if Instant::now() >= end {
            let roles: Vec<_> = all
                .iter()
                .map(|(i, _, s)| (i, s.as_ref().map(|s| (s.role.clone(), s.term))))
                .collect();
            return Err(format!("not settled within {limit:?}: {roles:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long a broker may take to answer a stats request before it counts as silent.
pub const STATS_TIMEOUT: Duration = Duration::from_secs(2);

/// The stats of the broker at `addr` (with `token` if it requires one), or `None` if it
/// does not answer, or not within [`STATS_TIMEOUT`]: for polling brokers that may be
/// stopped, killed or electing.
pub async fn stats(addr: &str, token: Option<&Token>) -> Option<BrokerStats> {
    tokio::time::timeout(STATS_TIMEOUT, fetch_stats_with_token(addr, token))
        .await
        .ok()?
        .ok()
}

/// The callers' shared state.
#[derive(Default)]
struct Load {
    stop: AtomicBool,
    events: Mutex<Vec<Event>>,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// Monotonic ns of the last kill (`u64::MAX` before the first).
    killed_at: AtomicU64,
    /// Return time of the first success invoked after `killed_at` (`u64::MAX`: none yet).
    first_after: AtomicU64,
    successes: AtomicU64,
}

async fn caller(client: Arc<BrokerClient>, load: Arc<Load>) {
    let mut mine = Vec::new();
    while !load.stop.load(Relaxed) {
        let invoke_ns = monotonic_ns();
        let r = client.next_ids(1).await;
        let return_ns = monotonic_ns();
        match &r {
            Ok(_) => {
                load.successes.fetch_add(1, Relaxed);
                if invoke_ns > load.killed_at.load(Relaxed) {
                    load.first_after.fetch_min(return_ns, Relaxed);
                }
            }
            Err(e) => {
                load.errors.fetch_add(1, Relaxed);
                let mut first = load.first_error.lock().unwrap_or_else(|p| p.into_inner());
                first.get_or_insert_with(|| e.to_string());
            }
        }
        mine.push(Event {
            invoke_ns,
            return_ns,
            outcome: r.ok(),
        });
    }
    load.events
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .extend(mine);
}

/// Runs the failover measurement; `progress` gets one line per kill.
///
/// # Errors
/// A broker that cannot be started, no single leader within `settle_timeout`, or a broker
/// client that cannot connect. Failed requests and failovers are counted, not errors.
pub async fn run(
    config: &FailoverConfig,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<FailoverReport> {
    anyhow::ensure!(
        config.brokers >= 2,
        "--brokers must be at least 2 (someone takes over)"
    );
    let mut brokers = Vec::new();
    for _ in 0..config.brokers {
        brokers.push(spawn(config, "127.0.0.1:0").await?);
    }
    let addrs: Vec<String> = brokers.iter().map(|b| b.addr().to_string()).collect();
    one_leader(&brokers, config.settle_timeout).await?;
    let client = Arc::new(
        BrokerClient::connect(
            addrs,
            BrokerClientConfig {
                deadline: config.deadline,
                ..Default::default()
            },
        )
        .await?,
    );
    let load = Arc::new(Load {
        killed_at: AtomicU64::new(u64::MAX),
        first_after: AtomicU64::new(u64::MAX),
        ..Load::default()
    });
    let tasks: Vec<_> = (0..config.callers.max(1))
        .map(|_| tokio::spawn(caller(client.clone(), load.clone())))
        .collect();
    let mut report = FailoverReport::default();
    let outcome = kill_leaders(config, &mut brokers, &load, &mut report, &mut progress).await;
    load.stop.store(true, Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    outcome?;
    report.errors = load.errors.load(Relaxed);
    report.first_error = load
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    report.events = std::mem::take(&mut *load.events.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(report)
}

/// The kill loop of [`run`].
async fn kill_leaders(
    config: &FailoverConfig,
    brokers: &mut [Announced],
    load: &Load,
    report: &mut FailoverReport,
    progress: &mut impl FnMut(&str),
) -> anyhow::Result<()> {
    for k in 1..=config.kills {
        let leader = one_leader(brokers, config.settle_timeout).await?;
        // Serving before the kill, so the time measured is the failover's alone.
        let before = load.successes.load(Relaxed);
        let until = Instant::now() + config.settle_timeout;
        while load.successes.load(Relaxed) == before && Instant::now() < until {
            tokio::time::sleep(POLL).await;
        }
        let addr = brokers[leader].addr().to_string();
        brokers[leader].kill();
        let killed_at = monotonic_ns();
        load.first_after.store(u64::MAX, Relaxed);
        load.killed_at.store(killed_at, Relaxed);
        let until = Instant::now() + FAILOVER_TIMEOUT;
        let mut first = u64::MAX;
        while Instant::now() < until {
            first = load.first_after.load(Relaxed);
            if first != u64::MAX {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if first == u64::MAX {
            report.failed_failovers += 1;
            progress(&format!(
                "kill {k}: leader {addr}: no ID within {FAILOVER_TIMEOUT:?}"
            ));
        } else {
            let took = Duration::from_nanos(first.saturating_sub(killed_at));
            progress(&format!("kill {k}: leader {addr}: first ID after {took:?}"));
            report.failovers.push(took);
        }
        // Back on its port, so the clients' broker list stays right.
        brokers[leader] = respawn(config, &addr).await?;
    }
    Ok(())
}

/// Starts a broker again on `addr`, retrying while the port is still being released.
async fn respawn(config: &FailoverConfig, addr: &str) -> anyhow::Result<Announced> {
    let mut last = None;
    for _ in 0..50 {
        match spawn(config, addr).await {
            Ok(b) => return Ok(b),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("cannot restart the broker on {addr}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(role: &str, term: u64, leader: Option<&str>) -> BrokerStats {
        BrokerStats {
            role: role.to_string(),
            term,
            leader: leader.map(str::to_string),
            ..BrokerStats::default()
        }
    }

    #[test]
    fn a_leader_is_settled_once_every_other_broker_follows_it_in_its_term() {
        let lead = stats("leader", 3, Some("a"));
        let follow = stats("follower", 3, Some("a"));
        let stale = stats("follower", 2, Some("b"));
        let two = stats("leader", 2, Some("b"));
        assert_eq!(
            settled_leader(&[(0, "a", Some(&lead)), (1, "b", Some(&follow))]),
            Some(0)
        );
        assert_eq!(
            settled_leader(&[(0, "a", Some(&lead)), (1, "b", Some(&stale))]),
            None
        );
        assert_eq!(
            settled_leader(&[(0, "a", Some(&lead)), (1, "b", Some(&two))]),
            None
        );
        assert_eq!(
            settled_leader(&[(0, "a", Some(&lead)), (1, "b", None)]),
            None
        );
        assert_eq!(settled_leader(&[(1, "b", Some(&follow))]), None);
    }
}

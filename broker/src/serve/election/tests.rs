//! The election state machine against a fake quorum on tokio's paused clock: every
//! broker shares one term register and one heartbeat key; a broker can be paused (its
//! quorum calls hang, as under SIGSTOP) or cut off from the heartbeat.

use super::*;
use crate::serve::leader_source::LeaderSource;
use crate::serve::source::{Admit, RoundSource};
use crate::serve::window::{WindowQuorum, WindowSource};
use idclient::{IdError, IdRange, Refresh};
use idproto::wire::BrokerStats;
use std::sync::atomic::AtomicBool;
use tokio::sync::watch;

/// One term register and one heartbeat key, as a majority of nodes would show them.
#[derive(Default)]
struct Nodes {
    term: Mutex<u64>,
    heartbeat: Mutex<Option<(Heartbeat, Instant)>>,
}

/// One broker's view of [`Nodes`].
struct View {
    nodes: Arc<Nodes>,
    /// While true, every call waits (the process is stopped).
    paused: watch::Receiver<bool>,
    /// Its heartbeat refreshes fail (cut off from the nodes).
    cut_off: AtomicBool,
    /// Every call fails (partitioned from every node).
    isolated: AtomicBool,
    /// Heartbeat reads that still fail after the partition healed (connections being
    /// opened again), while other calls already succeed.
    failing_reads: std::sync::atomic::AtomicU64,
}

const LATENCY: Duration = Duration::from_millis(1);

impl View {
    /// A view with every call getting through, paused while `paused` says so.
    fn new(nodes: &Arc<Nodes>, paused: watch::Receiver<bool>) -> View {
        View {
            nodes: nodes.clone(),
            paused,
            cut_off: AtomicBool::new(false),
            isolated: AtomicBool::new(false),
            failing_reads: Default::default(),
        }
    }

    async fn gate(&self) {
        let mut paused = self.paused.clone();
        let _ = paused.wait_for(|p| !*p).await;
        tokio::time::sleep(LATENCY).await;
    }

    /// The error of a call while isolated.
    fn isolation(&self) -> Result<(), IdError> {
        if self.isolated.load(Relaxed) {
            return Err(IdError::Config("partitioned from every node".into()));
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ElectionQuorum for View {
    async fn read_term(&self, _: Instant) -> Result<u64, IdError> {
        self.gate().await;
        self.isolation()?;
        Ok(*lock(&self.nodes.term))
    }

    async fn claim_term(&self, term: u64, _: Instant) -> Result<bool, IdError> {
        self.gate().await;
        self.isolation()?;
        let mut t = lock(&self.nodes.term);
        if *t < term {
            *t = term;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    async fn refresh(&self, hb: Heartbeat, ttl: Duration, _: Instant) -> Refresh {
        self.gate().await;
        if self.cut_off.load(Relaxed) || self.isolated.load(Relaxed) {
            return Refresh {
                failures: vec![idclient::NodeFailure {
                    addr: "fake".into(),
                    reason: "cut off".into(),
                }],
                ..Refresh::default()
            };
        }
        let mut cur = lock(&self.nodes.heartbeat);
        let now = Instant::now();
        if let Some((held, until)) = cur.as_ref() {
            if *until > now && held.term > hb.term {
                return Refresh {
                    higher: Some(held.clone()),
                    ..Refresh::default()
                };
            }
        }
        *cur = Some((hb, now + ttl));
        Refresh {
            acked: 3,
            ..Refresh::default()
        }
    }

    async fn read_heartbeats(&self, _: Instant) -> Result<Vec<Option<Heartbeat>>, IdError> {
        self.gate().await;
        self.isolation()?;
        let failing = &self.failing_reads;
        if failing
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(IdError::Config("reconnecting".into()));
        }
        let cur = lock(&self.nodes.heartbeat);
        let live = cur
            .as_ref()
            .filter(|(_, until)| *until > Instant::now())
            .map(|(hb, _)| hb.clone());
        Ok(vec![live.clone(), live.clone(), live])
    }

    async fn resign(&self, term: u64, _: Instant) {
        self.gate().await;
        let mut cur = lock(&self.nodes.heartbeat);
        if cur.as_ref().is_some_and(|(hb, _)| hb.term == term) {
            *cur = None;
        }
    }

    fn majority(&self) -> usize {
        2
    }
}

/// A window quorum that is never used: these tests serve nothing.
struct NoWindow;

impl WindowQuorum for NoWindow {
    async fn round(&self, n: u64, _: Instant) -> Result<IdRange, IdError> {
        Ok(IdRange { lo: 1, hi: n })
    }
    async fn reserve(&self, _: u64, _: u64, _: Instant) -> Result<bool, IdError> {
        Ok(false)
    }
    async fn read_max(&self, _: Instant) -> Result<u64, IdError> {
        Ok(0)
    }
}

struct Broker {
    source: LeaderSource<NoWindow>,
    view: Arc<View>,
    pause: watch::Sender<bool>,
    addr: String,
}

impl Broker {
    fn start(nodes: &Arc<Nodes>, i: u64) -> Broker {
        let (pause, paused) = watch::channel(false);
        let view = Arc::new(View::new(nodes, paused));
        let addr = format!("broker{i}:7400");
        let config = ElectionConfig {
            seed: Some(i),
            ..ElectionConfig::new(addr.clone())
        };
        let window = Arc::new(WindowSource::new(Arc::new(NoWindow)));
        let source = LeaderSource::start(window, view.clone(), config).expect("valid config");
        Broker {
            source,
            view,
            pause,
            addr,
        }
    }

    fn status(&self) -> Status {
        self.source.election().status()
    }

    fn election(&self) -> &Election {
        self.source.election()
    }

    /// Waits (5 s at most) until this broker leads.
    async fn until_leads(&self, what: &str) {
        until(Duration::from_secs(5), what, &[self.election()], || {
            self.status().role == Role::Leader
        })
        .await;
    }
}

/// Brokers `0..n`, all over `nodes`.
fn start_brokers(nodes: &Arc<Nodes>, n: u64) -> Vec<Broker> {
    (0..n).map(|i| Broker::start(nodes, i)).collect()
}

/// Waits (on the paused clock: simulated time) until `cond` holds, at most `limit`,
/// looking again at each change of one of the `watched` elections' status: every
/// condition here is about their statuses, so nothing else can make one hold.
async fn until(limit: Duration, what: &str, watched: &[&Election], mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    // Subscribed before the first look: a change after it is seen.
    let mut changes: Vec<_> = watched.iter().map(|e| e.subscribe()).collect();
    while !cond() {
        let changed =
            futures::future::select_all(changes.iter_mut().map(|c| Box::pin(c.changed())));
        match tokio::time::timeout_at(end, changed).await {
            Ok((Ok(()), _, _)) => {}
            Ok((Err(_), _, _)) => panic!("an election is gone: {what}"),
            Err(_) => panic!("not within {limit:?}: {what}"),
        }
    }
}

/// The elections of `brokers`, for [`until`].
fn elections(brokers: &[Broker]) -> Vec<&Election> {
    brokers.iter().map(Broker::election).collect()
}

fn leaders(brokers: &[Broker]) -> Vec<usize> {
    (0..brokers.len())
        .filter(|&i| brokers[i].status().role == Role::Leader)
        .collect()
}

/// One leader, and every other broker follows it in its term.
fn settled(brokers: &[Broker]) -> Option<usize> {
    let l = *leaders(brokers).first()?;
    let lead = brokers[l].status();
    brokers
        .iter()
        .all(|b| {
            let s = b.status();
            s.term == lead.term && s.leader.as_deref() == Some(brokers[l].addr.as_str())
        })
        .then_some(l)
}

/// Waits (5 s at most) until `brokers` have [`settled`]; returns the leader.
async fn until_settled(brokers: &[Broker], what: &str) -> usize {
    until(Duration::from_secs(5), what, &elections(brokers), || {
        settled(brokers).is_some()
    })
    .await;
    settled(brokers).expect("settled")
}

#[tokio::test(start_paused = true)]
async fn with_no_heartbeat_one_broker_is_elected_and_the_others_follow_and_redirect() {
    let nodes = Arc::new(Nodes::default());
    let brokers = start_brokers(&nodes, 3);
    // Before anything is known: a follower with no leader redirects to none.
    assert_eq!(brokers[0].source.admit(), Admit::Redirect(None));
    let l = until_settled(&brokers, "one leader, followed").await;
    // It stays that way: heartbeats keep the followers from standing.
    let term = brokers[l].status().term;
    tokio::time::sleep(ELECTION_TIMEOUT * 20).await;
    assert_eq!(settled(&brokers), Some(l));
    assert_eq!(brokers[l].status().term, term);
    // The leader serves; the others redirect to it, and count it.
    assert_eq!(brokers[l].source.admit(), Admit::Serve);
    let f = (l + 1) % 3;
    let mut stats = BrokerStats::default();
    brokers[f].source.describe(&mut stats);
    let redirects = stats.redirects;
    assert_eq!(
        brokers[f].source.admit(),
        Admit::Redirect(Some(brokers[l].addr.clone()))
    );
    brokers[f].source.describe(&mut stats);
    assert_eq!(
        (stats.role.as_str(), stats.term, stats.redirects),
        ("follower", term, redirects + 1)
    );
    assert_eq!(stats.leader.as_deref(), Some(brokers[l].addr.as_str()));
    brokers[l].source.describe(&mut stats);
    assert_eq!((stats.role.as_str(), stats.term), ("leader", term));
}

#[tokio::test(start_paused = true)]
async fn a_dead_leader_is_replaced_in_a_higher_term() {
    let nodes = Arc::new(Nodes::default());
    let mut brokers = start_brokers(&nodes, 3);
    let l = until_settled(&brokers, "first leader").await;
    let term = brokers[l].status().term;
    let killed_at = Instant::now();
    drop(brokers.remove(l)); // kill: its election task is aborted
    let n = until_settled(&brokers, "a new leader").await;
    let took = killed_at.elapsed();
    assert!(brokers[n].status().term > term);
    // Simulated time: at most the longest timeout, plus a few heartbeats.
    assert!(
        took <= ELECTION_TIMEOUT * 2 + HEARTBEAT * 4,
        "failover took {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_paused_leader_is_replaced_and_steps_down_when_it_resumes() {
    let nodes = Arc::new(Nodes::default());
    let brokers = start_brokers(&nodes, 3);
    let l = until_settled(&brokers, "first leader").await;
    let old_term = brokers[l].status().term;
    brokers[l].pause.send_replace(true);
    // The others elect a new leader while the old one still believes it leads.
    until(
        Duration::from_secs(5),
        "two brokers believe they lead",
        &elections(&brokers),
        || leaders(&brokers).len() == 2,
    )
    .await;
    assert_eq!(brokers[l].status().role, Role::Leader);
    brokers[l].pause.send_replace(false);
    // The lower term steps down and follows the new leader.
    until(
        Duration::from_secs(5),
        "the old leader follows",
        &elections(&brokers),
        || settled(&brokers).is_some_and(|n| n != l),
    )
    .await;
    let n = settled(&brokers).expect("settled");
    assert!(brokers[n].status().term > old_term);
    assert_eq!(brokers[l].status().role, Role::Follower);
}

#[tokio::test(start_paused = true)]
async fn of_two_leaders_the_lower_term_steps_down() {
    let nodes = Arc::new(Nodes::default());
    *lock(&nodes.term) = 2;
    let config = |addr: &str| ElectionConfig {
        seed: Some(1),
        ..ElectionConfig::new(addr)
    };
    let mut machines = Vec::new();
    for (term, addr) in [(1, "low:1"), (2, "high:1")] {
        let (_pause, paused) = watch::channel(false);
        let view = Arc::new(View::new(&nodes, paused));
        let shared = Arc::new(Election::new(addr.to_string()));
        let mut m = Machine::new(view, config(addr), shared.clone(), Arc::new(Notify::new()));
        m.role = Role::Leader;
        m.term = term;
        m.leader = Some(addr.to_string());
        // Both believe they lead; the higher term's heartbeat is on the nodes first.
        let task = tokio::spawn(async move {
            let _pause = _pause;
            m.run().await
        });
        machines.push((shared, task));
        tokio::time::sleep(LATENCY * 3).await;
    }
    until(
        Duration::from_secs(2),
        "the lower term follows",
        &[&*machines[0].0, &*machines[1].0],
        || {
            machines[0].0.status()
                == Status {
                    role: Role::Follower,
                    term: 2,
                    leader: Some("high:1".into()),
                }
        },
    )
    .await;
    assert_eq!(machines[1].0.status().role, Role::Leader);
    for (_, task) in machines {
        task.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn a_dead_window_and_a_higher_term_register_make_the_leader_step_down() {
    let nodes = Arc::new(Nodes::default());
    let b = Broker::start(&nodes, 0);
    b.until_leads("leader").await;
    // Another broker won term 9 but never heartbeated (it died at once): only the term
    // register shows it, and the window's death makes the leader look.
    let term = b.status().term;
    *lock(&nodes.term) = 9;
    tokio::time::sleep(ELECTION_TIMEOUT * 3).await;
    assert_eq!((b.status().role, b.status().term), (Role::Leader, term));
    b.source.window().died().notify_one();
    until(
        Duration::from_secs(1),
        "stepped down",
        &[b.election()],
        || b.status().role != Role::Leader || b.status().term > 9,
    )
    .await;
    // Alone, it stands again after its timeout, above the term it saw.
    b.until_leads("leads again").await;
    assert!(b.status().term >= 10, "{:?}", b.status());
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_cannot_refresh_a_majority_steps_down() {
    let nodes = Arc::new(Nodes::default());
    let b = Broker::start(&nodes, 0);
    b.until_leads("leader").await;
    let elections = b.source.election().elections();
    b.view.cut_off.store(true, Relaxed);
    until(
        Duration::from_secs(2),
        "stepped down",
        &[b.election()],
        || b.status().role != Role::Leader,
    )
    .await;
    assert_eq!(b.status().leader, None);
    b.view.cut_off.store(false, Relaxed);
    b.until_leads("leads again").await;
    assert!(b.source.election().elections() > elections);
}

#[test]
fn bad_timing_is_refused() {
    let mut c = ElectionConfig::new("a:1");
    assert!(c.validate().is_ok());
    c.election_timeout = c.heartbeat;
    assert!(c.validate().is_err());
    c = ElectionConfig::new("a:1");
    c.heartbeat = Duration::ZERO;
    assert!(c.validate().is_err());
    assert!(ElectionConfig::new(" ").validate().is_err());
}

#[tokio::test(start_paused = true)]
async fn a_new_broker_waits_out_a_stale_heartbeat_before_standing() {
    let nodes = Arc::new(Nodes::default());
    *lock(&nodes.term) = 3;
    let stale = Heartbeat::new(3, 10, "gone:1");
    *lock(&nodes.heartbeat) = Some((stale, Instant::now() + Duration::from_secs(60)));
    let started = Instant::now();
    let b = Broker::start(&nodes, 0);
    until(
        Duration::from_secs(5),
        "follows the last known leader",
        &[b.election()],
        || b.status().leader.as_deref() == Some("gone:1"),
    )
    .await;
    assert_eq!(b.source.admit(), Admit::Redirect(Some("gone:1".into())));
    b.until_leads("leads").await;
    // Simulated time: the heartbeat did not change for a whole timeout first.
    assert!(started.elapsed() >= ELECTION_TIMEOUT);
    assert_eq!(b.status().term, 4);
}

#[tokio::test(start_paused = true)]
async fn a_resigning_leader_is_replaced_before_the_election_timeout() {
    let nodes = Arc::new(Nodes::default());
    let brokers = start_brokers(&nodes, 3);
    let l = until_settled(&brokers, "first leader").await;
    let term = brokers[l].status().term;
    let resigned_at = Instant::now();
    brokers[l].source.resign().await;
    assert_eq!(brokers[l].status().role, Role::Follower);
    let others: Vec<&Broker> = (0..3).filter(|&i| i != l).map(|i| &brokers[i]).collect();
    until(
        Duration::from_secs(5),
        "a new leader",
        &elections(&brokers),
        || {
            others
                .iter()
                .any(|b| b.status().role == Role::Leader && b.status().term > term)
        },
    )
    .await;
    // Simulated time: a few heartbeats, not an election timeout.
    assert!(
        resigned_at.elapsed() < ELECTION_TIMEOUT,
        "{:?}",
        resigned_at.elapsed()
    );
    // The resigned broker takes no further part: it redirects and never stands.
    tokio::time::sleep(ELECTION_TIMEOUT * 10).await;
    assert_eq!(brokers[l].status().role, Role::Follower);
    assert!(matches!(brokers[l].source.admit(), Admit::Redirect(_)));
}

/// A leader partitioned from every node steps down and another is elected; when the
/// partition heals (its first heartbeat read still failing, as while reconnecting), the
/// old leader follows the new one instead of standing at once on its stale "no change
/// for the election timeout" (its reads failed meanwhile) or claiming a term above one
/// it never saw a heartbeat of.
#[tokio::test(start_paused = true)]
async fn a_healed_partitioned_leader_follows_the_new_one_without_an_election() {
    let nodes = Arc::new(Nodes::default());
    let brokers = start_brokers(&nodes, 3);
    let l = until_settled(&brokers, "first leader").await;
    brokers[l].view.isolated.store(true, Relaxed);
    until(
        Duration::from_secs(5),
        "a new leader, the old one down",
        &elections(&brokers),
        || leaders(&brokers).iter().all(|&i| i != l) && leaders(&brokers).len() == 1,
    )
    .await;
    // Long past its election timeout, with every read failing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let n = leaders(&brokers)[0];
    let term = brokers[n].status().term;
    brokers[l].view.failing_reads.store(1, Relaxed);
    brokers[l].view.isolated.store(false, Relaxed);
    until(
        Duration::from_secs(5),
        "the healed broker follows",
        &elections(&brokers),
        || settled(&brokers) == Some(n),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        settled(&brokers),
        Some(n),
        "the healed broker caused an election"
    );
    assert_eq!(brokers[n].status().term, term);
}

/// A term only a minority of the term register took (another candidate's claim that
/// failed) is seen by one majority read and missed by the next one (a majority of other
/// nodes). The broker keeps the term the register showed it and claims the one after it:
/// comparing with the latest read alone would take its term back and call the term a
/// forged heartbeat's (the model checker found that: docs/model.md, "Mutants").
#[tokio::test(start_paused = true)]
async fn a_term_one_read_showed_is_kept_when_the_next_read_misses_it() {
    let nodes = Arc::new(Nodes::default());
    *lock(&nodes.term) = 5; // what the first read's majority shows
    let broker = Broker::start(&nodes, 0);
    until(
        Duration::from_secs(5),
        "it follows term 5",
        &[broker.election()],
        || broker.status().term == 5,
    )
    .await;
    assert_eq!(broker.status().role, Role::Follower);
    *lock(&nodes.term) = 0; // the next reads' majority never took it
    broker.until_leads("it stands again and wins").await;
    assert_eq!(broker.status().term, 6, "claimed above the term it read");
}

//! An in-memory model of the quorum's nodes for deterministic simulation.
//!
//! [`SimCluster`] holds N registers and a seeded network between them and the clients.
//! Every request and every reply is a message that may be lost, delayed (uniformly up
//! to [`SimConfig::max_delay`], so messages overtake each other: reordering) or, for
//! requests, duplicated (the copy is applied later, on its own: the delayed duplicate
//! that can make a stale conditional write land long after its client gave up). Nodes
//! crash and restart: a crashed node ignores what arrives; a restarted node keeps its
//! register (durable, what `appendfsync always` gives), unless [`SimConfig::amnesia`]
//! says what it forgets (everything, or its last acknowledged write: the negative cases
//! the checker must catch). Nodes also pause ([`SimCluster::pause`]): what arrives
//! meanwhile is applied in a burst when they resume. [`SimConfig::mutant`] breaks a node
//! on purpose, for the negative tests.
//!
//! Each node also models the rendezvous of combined rounds (`script::COMBINE`):
//! volatile state with leases on the virtual clock, lost when the node crashes, and batch
//! results published to subscribers through the same faulty network.
//!
//! And the broker leader's heartbeat (`idclient::node::heartbeat`): a volatile key per
//! node with an expiry on the virtual clock, set only if the node holds no heartbeat of a
//! higher term, lost when the node crashes (it never reaches the AOF). The election's
//! term register is an ordinary register (`<key>:term`), durable like `<key>`.
//!
//! [`SimNode`] implements [`Register`], [`Rendezvous`] and [`HeartbeatNode`], so the real
//! [`idclient::QuorumClient`] and the broker's real election (`broker::QuorumElection`)
//! run over it unchanged. Run it on a tokio `current_thread` runtime with paused time
//! (`start_paused = true`): delays are then virtual (a simulated second costs
//! microseconds), and with every random choice drawn from the cluster's seeded RNG (and
//! the clients' jitter seeded, [`idclient::QuorumClient::with_jitter_seed`]) one seed
//! replays the same run exactly.

use futures::stream::BoxStream;
use idclient::{
    Close, Heartbeat, HeartbeatNode, Join, Leases, NodeError, Nonce, Register, Rendezvous,
    WriteOutcome, WriteReply,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The network's and the nodes' behaviour.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Number of nodes (odd for a usable quorum).
    pub nodes: usize,
    /// Probability that one message (request or reply) is lost.
    pub loss: f64,
    /// Probability that a request is delivered twice (the copy with its own delay).
    pub duplicate: f64,
    /// Each message is delayed uniformly in `0..=max_delay`.
    pub max_delay: Duration,
    /// How long a client waits for a reply before counting the node as unavailable.
    pub reply_timeout: Duration,
    /// What a crashed node forgets (anything but [`Amnesia::None`] is unsafe: for the
    /// negative cases).
    pub amnesia: Amnesia,
    /// A deliberately broken node, for the negative tests: the checker must catch it.
    pub mutant: Option<Mutant>,
}

/// What a restarted node lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Amnesia {
    /// Nothing: durable, as `appendfsync always` gives.
    #[default]
    None,
    /// Everything: an empty register (a wiped data dir, no persistence at all).
    Wipe,
    /// Its last acknowledged write (fsync every second, or a lying disk cache).
    LastWrite,
}

/// A broken node, each the kind of slip a change to the script or the model could make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutant {
    /// The conditional write accepts when `current <= lo` (not `<`).
    WriteIfNotAbove,
    /// The conditional write compares with HI instead of LO.
    CompareWithHi,
    /// `join` hands a member the offset one below its own (overlapping the previous
    /// member's IDs).
    MemberOffset,
    /// `close` reports one ID fewer than the batch's members asked for (a corrupted or
    /// hand-edited batch on the rendezvous node). Unlike the others, clients must
    /// survive this one: the rendezvous only decides who writes, so a leader checks the
    /// total against its own share and members check theirs.
    ShortClose,
}

impl Default for SimConfig {
    /// 5 nodes, 5% loss, 5% duplication, up to 5 ms delay, 20 ms reply timeout, durable.
    fn default() -> SimConfig {
        SimConfig {
            nodes: 5,
            loss: 0.05,
            duplicate: 0.05,
            max_delay: Duration::from_millis(5),
            reply_timeout: Duration::from_millis(20),
            amnesia: Amnesia::None,
            mutant: None,
        }
    }
}

/// What happened in a simulation, for reports and sanity checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Requests sent by clients.
    pub requests: u64,
    /// Messages the network lost (requests and replies).
    pub lost: u64,
    /// Requests the network delivered twice.
    pub duplicated: u64,
    /// Requests applied to a register (duplicates included).
    pub applied: u64,
    /// Requests that arrived at a crashed node.
    pub refused: u64,
    /// Node crashes.
    pub crashes: u64,
    /// Conditional writes accepted.
    pub accepts: u64,
    /// Requests applied at a node after a request sent later to the same node.
    pub reordered: u64,
    /// Subscriptions refused or lost while the node was up.
    pub subscribe_failures: u64,
    /// Pauses: a node stops applying what arrives, then applies it all at once.
    pub pauses: u64,
    /// Batches closed (a leader got its batch's total).
    pub closes: u64,
    /// The longest lease a `join` asked for (round or batch).
    pub longest_lease: Duration,
    /// Heartbeats set (refreshes a node took).
    pub heartbeats: u64,
    /// Refreshes a node refused because it held the heartbeat of a higher term.
    pub heartbeats_refused: u64,
    /// Heartbeats deleted by a resigning leader.
    pub resigned: u64,
}

#[derive(Debug)]
struct NodeState {
    values: BTreeMap<String, u64>,
    /// Each key's value before its last accepted write (for [`Amnesia::LastWrite`]).
    before_last: BTreeMap<String, u64>,
    up: bool,
    /// Paused until this instant: arrivals wait, then apply in a burst (as SIGSTOP).
    paused_until: Option<Instant>,
    /// The highest send number applied here: a lower one arriving later was reordered.
    last_send: u64,
    /// The rendezvous of combined rounds, per register key: volatile, gone when the node
    /// crashes (as the Redis node's, which never reach its AOF).
    rendezvous: BTreeMap<String, RendezvousState>,
    /// Results subscriptions (key, sender): dropped when the node crashes, which ends
    /// the subscribers' streams as a closed connection would.
    subscribers: Vec<(String, mpsc::UnboundedSender<String>)>,
    /// The leader's heartbeat per key, with its expiry: volatile, gone when the node
    /// crashes (as the Redis key, kept out of the AOF).
    heartbeats: BTreeMap<String, (Heartbeat, Instant)>,
}

/// One key's rendezvous state, with the expiry times the Redis keys would have.
#[derive(Debug, Default)]
struct RendezvousState {
    /// The open batch: nonce, IDs so far, expiry.
    open: Option<(Nonce, u64, Instant)>,
    /// The batch in flight: nonce, expiry.
    inflight: Option<(Nonce, Instant)>,
}

impl RendezvousState {
    /// Drops what has expired by `now`, as Redis would before looking.
    fn expire(&mut self, now: Instant) {
        if self.open.is_some_and(|(_, _, at)| at <= now) {
            self.open = None;
        }
        if self.inflight.is_some_and(|(_, at)| at <= now) {
            self.inflight = None;
        }
    }
}

struct State {
    rng: StdRng,
    nodes: Vec<NodeState>,
    stats: SimStats,
    /// Numbers requests in the order they are sent.
    sends: u64,
}

/// The simulated nodes and network. Cheap to clone (shared state).
#[derive(Clone)]
pub struct SimCluster {
    state: Arc<Mutex<State>>,
    config: Arc<SimConfig>,
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        key: String,
        lo: u64,
        hi: u64,
        batch: Option<Nonce>,
    },
    Read {
        key: String,
    },
    Join {
        key: String,
        n: u64,
        nonce: Nonce,
        leases: Leases,
    },
    Close {
        key: String,
        nonce: Nonce,
        lease: Duration,
    },
    Finish {
        key: String,
        nonce: Nonce,
        message: String,
    },
    Heartbeat {
        key: String,
        hb: Heartbeat,
        ttl: Duration,
        /// A held heartbeat to overwrite even if of a higher term (a forged one).
        replace: Option<Heartbeat>,
    },
    Resign {
        key: String,
        term: u64,
    },
    ReadHeartbeat {
        key: String,
    },
}

#[derive(Debug, Clone)]
enum Outcome {
    Write(WriteReply, bool),
    Read(u64),
    Join(Join),
    Close(Close),
    Finished,
    /// A refresh: `Some(newer)` when the node held a heartbeat of a higher term.
    Heartbeat(Option<Heartbeat>),
    Resigned(bool),
    ReadHeartbeat(Option<Heartbeat>),
    Down,
}

impl SimCluster {
    /// A cluster of `config.nodes` empty registers, all up, with its RNG seeded.
    pub fn new(config: SimConfig, seed: u64) -> SimCluster {
        let nodes = (0..config.nodes)
            .map(|_| NodeState {
                values: BTreeMap::new(),
                before_last: BTreeMap::new(),
                up: true,
                paused_until: None,
                last_send: 0,
                rendezvous: BTreeMap::new(),
                subscribers: Vec::new(),
                heartbeats: BTreeMap::new(),
            })
            .collect();
        SimCluster {
            state: Arc::new(Mutex::new(State {
                rng: StdRng::seed_from_u64(seed),
                nodes,
                stats: SimStats::default(),
                sends: 0,
            })),
            config: Arc::new(config),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Single-threaded simulation: a poisoned lock means a panicking test, whose
        // state is still consistent enough to report.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The configuration.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// One [`Register`] handle per node, in order (named `sim://<i>`).
    pub fn nodes(&self) -> Vec<SimNode> {
        (0..self.config.nodes)
            .map(|index| SimNode {
                cluster: self.clone(),
                index,
                addr: format!("sim://{index}"),
            })
            .collect()
    }

    /// Crashes node `i`: it ignores messages until [`SimCluster::restart`].
    pub fn crash(&self, i: usize) {
        let mut s = self.lock();
        if s.nodes[i].up {
            s.nodes[i].up = false;
            s.nodes[i].rendezvous.clear();
            s.nodes[i].subscribers.clear();
            s.nodes[i].heartbeats.clear();
            s.stats.crashes += 1;
        }
    }

    /// Restarts node `i`: with its register (durable), or with what
    /// [`SimConfig::amnesia`] leaves of it.
    pub fn restart(&self, i: usize) {
        let amnesia = self.config.amnesia;
        let mut s = self.lock();
        let node = &mut s.nodes[i];
        if !node.up {
            node.up = true;
            match amnesia {
                Amnesia::None => {}
                Amnesia::Wipe => node.values.clear(),
                Amnesia::LastWrite => {
                    let before = std::mem::take(&mut node.before_last);
                    node.values.extend(before);
                }
            }
        }
    }

    /// Pauses node `i` for `d`: requests arriving meanwhile wait and are applied in a
    /// burst when it resumes, in their arrival order (a SIGSTOPped Redis).
    pub fn pause(&self, i: usize, d: Duration) {
        let mut s = self.lock();
        let until = Instant::now() + d;
        let node = &mut s.nodes[i];
        if node.up && node.paused_until.is_none_or(|t| t < until) {
            node.paused_until = Some(until);
            s.stats.pauses += 1;
        }
    }

    /// When node `i` resumes, if it is paused now.
    fn paused_until(&self, i: usize) -> Option<Instant> {
        let now = Instant::now();
        self.lock().nodes[i].paused_until.filter(|&t| t > now)
    }

    /// Whether node `i` is up.
    pub fn is_up(&self, i: usize) -> bool {
        self.lock().nodes[i].up
    }

    /// Node `i`'s register for `key` (0 when missing).
    pub fn value(&self, i: usize, key: &str) -> u64 {
        self.lock().nodes[i].values.get(key).copied().unwrap_or(0)
    }

    /// Draws from the cluster's seeded RNG: fault schedules and workloads use it too, so
    /// one seed decides everything.
    pub fn with_rng<T>(&self, f: impl FnOnce(&mut StdRng) -> T) -> T {
        f(&mut self.lock().rng)
    }

    /// The counters so far.
    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    fn delay(&self, rng: &mut StdRng) -> Duration {
        let max = self.config.max_delay.as_nanos() as u64;
        Duration::from_nanos(if max == 0 { 0 } else { rng.gen_range(0..=max) })
    }

    /// Applies `op` at node `i` (atomically, as Redis runs a script).
    fn apply(&self, i: usize, op: &Op, send: u64) -> Outcome {
        let mut s = self.lock();
        if !s.nodes[i].up {
            s.stats.refused += 1;
            return Outcome::Down;
        }
        s.stats.applied += 1;
        if send < s.nodes[i].last_send {
            s.stats.reordered += 1;
        }
        s.nodes[i].last_send = s.nodes[i].last_send.max(send);
        let now = Instant::now();
        match op {
            Op::Read { key } => Outcome::Read(s.nodes[i].values.get(key).copied().unwrap_or(0)),
            Op::Write { key, lo, hi, batch } => {
                let (reply, combining) = self.write(&mut s, i, key, (*lo, *hi), *batch, now);
                Outcome::Write(reply, combining)
            }
            // The rendezvous script of `script::COMBINE`, operation by operation.
            Op::Join {
                key,
                n,
                nonce,
                leases,
            } => Outcome::Join(self.join(&mut s, i, key, *n, *nonce, *leases, now)),
            Op::Close { key, nonce, lease } => {
                Outcome::Close(self.close(&mut s, i, key, *nonce, *lease, now))
            }
            Op::Finish {
                key,
                nonce,
                message,
            } => {
                self.finish(&mut s, i, key, *nonce, message, now);
                Outcome::Finished
            }
            Op::Heartbeat {
                key,
                hb,
                ttl,
                replace,
            } => Outcome::Heartbeat(Self::heartbeat(
                &mut s,
                i,
                key,
                (hb, replace.as_ref()),
                *ttl,
                now,
            )),
            Op::Resign { key, term } => Outcome::Resigned(Self::resign(&mut s, i, key, *term, now)),
            Op::ReadHeartbeat { key } => {
                Outcome::ReadHeartbeat(Self::live_heartbeat(&mut s.nodes[i], key, now).cloned())
            }
        }
    }

    /// The heartbeat `key` holds at `now` on `node`, dropping it if it expired.
    fn live_heartbeat<'a>(
        node: &'a mut NodeState,
        key: &str,
        now: Instant,
    ) -> Option<&'a Heartbeat> {
        if node.heartbeats.get(key).is_some_and(|(_, at)| *at <= now) {
            node.heartbeats.remove(key);
        }
        node.heartbeats.get(key).map(|(hb, _)| hb)
    }

    /// The heartbeat script (`idclient::node::heartbeat::HEARTBEAT`) at node `i`: sets
    /// `hb` for `ttl` unless the node holds the heartbeat of a higher term other than
    /// `replace`, which it answers with.
    fn heartbeat(
        s: &mut State,
        i: usize,
        key: &str,
        (hb, replace): (&Heartbeat, Option<&Heartbeat>),
        ttl: Duration,
        now: Instant,
    ) -> Option<Heartbeat> {
        let node = &mut s.nodes[i];
        let kept = |h: &&Heartbeat| h.term > hb.term && Some(*h) != replace;
        if let Some(held) = Self::live_heartbeat(node, key, now).filter(kept) {
            let held = held.clone();
            s.stats.heartbeats_refused += 1;
            return Some(held);
        }
        node.heartbeats
            .insert(key.to_string(), (hb.clone(), now + ttl));
        s.stats.heartbeats += 1;
        None
    }

    /// The resign script (`idclient::node::heartbeat::RESIGN`) at node `i`.
    fn resign(s: &mut State, i: usize, key: &str, term: u64, now: Instant) -> bool {
        let node = &mut s.nodes[i];
        if Self::live_heartbeat(node, key, now).is_some_and(|h| h.term == term) {
            node.heartbeats.remove(key);
            s.stats.resigned += 1;
            return true;
        }
        false
    }

    /// The conditional write of `lo..=hi` at node `i`, and whether another batch than
    /// `batch` is in flight there (`script::CONDITIONAL_WRITE`).
    fn write(
        &self,
        s: &mut State,
        i: usize,
        key: &str,
        (lo, hi): (u64, u64),
        batch: Option<Nonce>,
        now: Instant,
    ) -> (WriteReply, bool) {
        let node = &mut s.nodes[i];
        let rv = node.rendezvous.entry(key.to_string()).or_default();
        rv.expire(now);
        let combining = rv.inflight.is_some_and(|(busy, _)| Some(busy) != batch);
        let current = node.values.get(key).copied().unwrap_or(0);
        let accept = match self.config.mutant {
            Some(Mutant::WriteIfNotAbove) => current <= lo,
            Some(Mutant::CompareWithHi) => current < hi,
            _ => current < lo,
        };
        if !accept {
            return (WriteReply::Rejected { current }, combining);
        }
        node.before_last.insert(key.to_string(), current);
        node.values.insert(key.to_string(), hi);
        s.stats.accepts += 1;
        (WriteReply::Accepted, combining)
    }

    /// The rendezvous' `join` at node `i`.
    #[allow(clippy::too_many_arguments)]
    fn join(
        &self,
        s: &mut State,
        i: usize,
        key: &str,
        n: u64,
        nonce: Nonce,
        leases: Leases,
        now: Instant,
    ) -> Join {
        let longest = s.stats.longest_lease.max(leases.round).max(leases.batch);
        s.stats.longest_lease = longest;
        let rv = s.nodes[i].rendezvous.entry(key.to_string()).or_default();
        rv.expire(now);
        match (&mut rv.open, rv.inflight) {
            (Some((_, ids, _)), _) if *ids + n > idclient::MAX_COUNT => Join::Full,
            (Some((batch, ids, at)), _) => {
                let offset = match self.config.mutant {
                    Some(Mutant::MemberOffset) => ids.saturating_sub(1),
                    _ => *ids,
                };
                *ids += n;
                Join::Follow {
                    batch: *batch,
                    offset,
                    wait: at.saturating_duration_since(now),
                }
            }
            (None, None) => {
                rv.inflight = Some((nonce, now + leases.round));
                Join::Solo
            }
            (None, Some((busy, at))) => {
                rv.open = Some((nonce, n, now + leases.batch));
                Join::Lead {
                    busy,
                    wait: at.saturating_duration_since(now),
                }
            }
        }
    }

    /// The rendezvous' `close` at node `i`.
    fn close(
        &self,
        s: &mut State,
        i: usize,
        key: &str,
        nonce: Nonce,
        lease: Duration,
        now: Instant,
    ) -> Close {
        let rv = s.nodes[i].rendezvous.entry(key.to_string()).or_default();
        rv.expire(now);
        match (rv.open, rv.inflight) {
            (Some((open, ..)), _) if open != nonce => Close::Gone,
            (None, _) => Close::Gone,
            (Some(_), Some((busy, at))) => Close::Busy {
                busy,
                wait: at.saturating_duration_since(now),
            },
            (Some((_, ids, _)), None) => {
                rv.open = None;
                rv.inflight = Some((nonce, now + lease));
                s.stats.closes += 1;
                let ids = match self.config.mutant {
                    Some(Mutant::ShortClose) => ids - 1,
                    _ => ids,
                };
                Close::Closed { ids }
            }
        }
    }

    /// The rendezvous' `finish` at node `i`: clears the in-flight mark if it is this
    /// batch's and publishes `message` to every subscriber of the node, each copy
    /// through the faulty network (lost, delayed, reordered), as the harshest reading of
    /// pub/sub: safety must not depend on it.
    fn finish(
        &self,
        s: &mut State,
        i: usize,
        key: &str,
        nonce: Nonce,
        message: &str,
        now: Instant,
    ) {
        let rv = s.nodes[i].rendezvous.entry(key.to_string()).or_default();
        rv.expire(now);
        if rv.inflight.is_some_and(|(busy, _)| busy == nonce) {
            rv.inflight = None;
        }
        let subscribers: Vec<_> = s.nodes[i]
            .subscribers
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, tx)| tx.clone())
            .collect();
        for tx in subscribers {
            if s.rng.gen_bool(self.config.loss) {
                continue;
            }
            let delay = self.delay(&mut s.rng);
            let message = message.to_string();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = tx.send(message);
            });
        }
    }

    /// Sends `op` to node `i` through the faulty network and waits for the first reply,
    /// up to the reply timeout. Deliveries run as their own tasks, so a request keeps
    /// travelling (and may still be applied) after its sender gave up.
    async fn call(&self, i: usize, op: Op) -> Result<Outcome, NodeError> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (send, deliveries): (u64, Vec<(Duration, Option<Duration>)>) = {
            let mut s = self.lock();
            s.stats.requests += 1;
            s.sends += 1;
            let send = s.sends;
            let copies = if s.rng.gen_bool(self.config.duplicate) {
                2
            } else {
                1
            };
            if copies == 2 {
                s.stats.duplicated += 1;
            }
            let mut plan = Vec::new();
            for _ in 0..copies {
                if s.rng.gen_bool(self.config.loss) {
                    s.stats.lost += 1;
                    continue;
                }
                let there = self.delay(&mut s.rng);
                let back = if s.rng.gen_bool(self.config.loss) {
                    s.stats.lost += 1;
                    None
                } else {
                    Some(self.delay(&mut s.rng))
                };
                plan.push((there, back));
            }
            (send, plan)
        };
        for (there, back) in deliveries {
            let cluster = self.clone();
            let op = op.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(there).await;
                // A paused node holds what arrives and applies it when it resumes.
                while let Some(until) = cluster.paused_until(i) {
                    tokio::time::sleep_until(until).await;
                }
                let outcome = cluster.apply(i, &op, send);
                if let Some(back) = back {
                    tokio::time::sleep(back).await;
                    let _ = tx.send(outcome);
                }
            });
        }
        drop(tx);
        match tokio::time::timeout(self.config.reply_timeout, rx.recv()).await {
            Ok(Some(Outcome::Down)) => {
                Err(NodeError::Unavailable("connection refused".to_string()))
            }
            Ok(Some(outcome)) => Ok(outcome),
            // Every copy was lost (the channel closed), or no reply in time.
            Ok(None) | Err(_) => {
                if rx.is_closed() {
                    // Lost for sure; still, a real client only learns it by timing out.
                    tokio::time::sleep(self.config.reply_timeout).await;
                }
                Err(NodeError::Unavailable("timed out".to_string()))
            }
        }
    }
}

/// One simulated node, as a client holds it.
#[derive(Clone)]
pub struct SimNode {
    cluster: SimCluster,
    index: usize,
    addr: String,
}

impl Register for SimNode {
    fn addr(&self) -> &str {
        &self.addr
    }

    fn conditional_write(
        &self,
        key: &str,
        lo: u64,
        hi: u64,
        _batch: Option<Nonce>,
    ) -> impl Future<Output = Result<WriteOutcome, NodeError>> + Send {
        let op = Op::Write {
            key: key.to_string(),
            lo,
            hi,
            batch: _batch,
        };
        async move {
            match self.cluster.call(self.index, op).await? {
                Outcome::Write(reply, combining) => Ok(WriteOutcome { reply, combining }),
                other => Err(unexpected(&other)),
            }
        }
    }

    fn read(&self, key: &str) -> impl Future<Output = Result<u64, NodeError>> + Send {
        let op = Op::Read {
            key: key.to_string(),
        };
        async move {
            match self.cluster.call(self.index, op).await? {
                Outcome::Read(value) => Ok(value),
                other => Err(unexpected(&other)),
            }
        }
    }

    fn warm_up(&self) -> impl Future<Output = Result<(), NodeError>> + Send {
        std::future::ready(Ok(()))
    }
}

impl HeartbeatNode for SimNode {
    fn heartbeat(
        &self,
        key: &str,
        hb: &Heartbeat,
        ttl: Duration,
        replace: Option<&Heartbeat>,
    ) -> impl Future<Output = Result<Option<Heartbeat>, NodeError>> + Send {
        let op = Op::Heartbeat {
            key: key.to_string(),
            hb: hb.clone(),
            ttl,
            replace: replace.cloned(),
        };
        async move {
            match self.cluster.call(self.index, op).await? {
                Outcome::Heartbeat(newer) => Ok(newer),
                other => Err(unexpected(&other)),
            }
        }
    }

    fn resign(&self, key: &str, term: u64) -> impl Future<Output = Result<bool, NodeError>> + Send {
        let op = Op::Resign {
            key: key.to_string(),
            term,
        };
        async move {
            match self.cluster.call(self.index, op).await? {
                Outcome::Resigned(deleted) => Ok(deleted),
                other => Err(unexpected(&other)),
            }
        }
    }

    fn read_heartbeat(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Heartbeat>, NodeError>> + Send {
        let op = Op::ReadHeartbeat {
            key: key.to_string(),
        };
        async move {
            match self.cluster.call(self.index, op).await? {
                Outcome::ReadHeartbeat(hb) => Ok(hb),
                other => Err(unexpected(&other)),
            }
        }
    }
}

/// A reply of another kind than the request's: a bug in the model, reported as a failed
/// node so the client's own handling shows it.
fn unexpected(other: &Outcome) -> NodeError {
    NodeError::Unavailable(format!("unexpected reply {other:?}"))
}

impl Rendezvous for SimNode {
    fn join(
        &self,
        key: &str,
        n: u64,
        nonce: Nonce,
        leases: Leases,
    ) -> impl Future<Output = Result<Join, NodeError>> + Send {
        let op = Op::Join {
            key: key.to_string(),
            n,
            nonce,
            leases,
        };
        async move {
            match self.cluster.call(self.index, op).await? {
                Outcome::Join(join) => Ok(join),
                other => Err(unexpected(&other)),
            }
        }
    }

    fn close(
        &self,
        key: &str,
        nonce: Nonce,
        lease: Duration,
    ) -> impl Future<Output = Result<Close, NodeError>> + Send {
        let op = Op::Close {
            key: key.to_string(),
            nonce,
            lease,
        };
        async move {
            match self.cluster.call(self.index, op).await? {
                Outcome::Close(close) => Ok(close),
                other => Err(unexpected(&other)),
            }
        }
    }

    fn finish(
        &self,
        key: &str,
        nonce: Nonce,
        message: String,
    ) -> impl Future<Output = Result<(), NodeError>> + Send {
        let op = Op::Finish {
            key: key.to_string(),
            nonce,
            message,
        };
        async move {
            match self.cluster.call(self.index, op).await? {
                Outcome::Finished => Ok(()),
                other => Err(unexpected(&other)),
            }
        }
    }

    fn subscribe(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<BoxStream<'static, String>, NodeError>> + Send {
        let result = {
            let mut s = self.cluster.lock();
            // Subscribing is a request like any other: it can be lost while the node is up
            // (the client then runs its own rounds, as when SUBSCRIBE times out).
            let lost = s.rng.gen_bool(self.cluster.config.loss);
            if lost && s.nodes[self.index].up {
                s.stats.subscribe_failures += 1;
            }
            let node = &mut s.nodes[self.index];
            if lost {
                Err(NodeError::Unavailable("timed out".to_string()))
            } else if node.up {
                let (tx, rx) = mpsc::unbounded_channel();
                node.subscribers.push((key.to_string(), tx));
                let stream = futures::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|m| (m, rx))
                });
                Ok(Box::pin(stream) as BoxStream<'static, String>)
            } else {
                Err(NodeError::Unavailable("connection refused".to_string()))
            }
        };
        std::future::ready(result)
    }
}

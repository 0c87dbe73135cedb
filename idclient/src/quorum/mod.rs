//! The direct quorum client: one round is a conditional write on every node in parallel,
//! won when a majority accepts.
//!
//! Safety comes from the conditional write alone (DESIGN.md): a node accepts `LO..=HI`
//! only if its register is below LO, and registers only grow, so two majorities (which
//! share a node) never accept overlapping ranges, and a range accepted after another was
//! returned lies above it. The protocols differ only in how LO is guessed.
//!
//! Under contention, fast-protocol clients share rounds ([`crate::combine`]): one client
//! runs the round for a batch of requests from several clients. docs/idclient.md has the
//! whole picture.
//!
//! The rounds need only a [`Register`] per node (`impl<N: Register>`); requests, which
//! may combine, need its [`Rendezvous`] too (`impl<N: Register + Rendezvous>`). Combining
//! is a small state machine of its own, in `combining`.
//!
//! The files: this one (configuration, the client, its rounds and requests),
//! `combining` (combined rounds and where they meet), `hedged` (the majority read),
//! `round` (one conditional-write round), `counters`, `check` (`idctl check`).

mod check;
mod combining;
mod counters;
mod hedged;
mod round;

pub use check::{check_nodes, NodeCheck};
pub use combining::{MAX_LEASE, MIN_LEASE, SOLO_STREAK};
pub use counters::{Counters, NodeCounters};
pub use hedged::{MIN_READ_HEDGE, READ_HEDGE_READS};

use crate::backoff::Backoff;
use crate::node::{Identities, Node, NodeAddr, TlsConfig};
use crate::register::{NodeError, Register, Rendezvous, MAX_COUNT};
use crate::rendezvous::Nonce;
use crate::{IdError, IdRange, IdSource, MovingAverage};
use combining::{CombineState, DEFAULT_MAX_LEASE};
use counters::{bump, AtomicCounters};
use hedged::Reads;
use idproto::NodeFailure;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// The backoff window starts at one round's duration (measured, see `round_time`) and
/// doubles per lost round; this is the first estimate, before any round was timed.
pub const INITIAL_ROUND: Duration = Duration::from_micros(500);

/// Default of [`ClientConfig::backoff_cap`]: backoff never sleeps longer than this at once.
/// Every wake of a losing client costs each node a script run, so a low cap burns the
/// nodes' CPU on rejects; a high cap leaves losers asleep while the register is free.
/// Measured at 64 contending clients (BENCHMARKS.md): 20 ms gave 879 IDs/s, 50 ms 1,136,
/// 100 ms 1,279 but with 20 of 64 clients starved past a 5 s deadline (5 at 50 ms).
/// Callers that contend hard belong behind a broker.
pub const BACKOFF_CAP: Duration = Duration::from_millis(50);

/// Which round protocol to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Read a majority, then conditional write of max+1: the algorithm as first published.
    Classic,
    /// Conditional write straight away with a guess (last known value + 1); a reject
    /// returns the node's value, so the next guess is right.
    #[default]
    Fast,
}

/// When a fast-protocol client shares rounds with other clients (docs/idclient.md,
/// "Contention: combined rounds").
/// The classic protocol never does: it stays the algorithm as first published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Combine {
    /// After losing a round to another writer (or seeing a batch in flight at the
    /// rendezvous), until [`SOLO_STREAK`] batches in a row find nobody else.
    #[default]
    Auto,
    /// From the first request on: for clients that know they contend (several producers
    /// on one quorum). Costs a lone client two rendezvous calls per request (about a
    /// third of its throughput, measured: docs/idclient.md).
    Always,
    /// Never: every request runs its own rounds, with backoff when it loses.
    Never,
}

/// Configuration of a [`QuorumClient`].
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `redis://host:port` URLs, an odd number (3 or more in production; 1 for tests).
    pub nodes: Vec<String>,
    /// The register key on every node.
    pub key: String,
    /// Fast (write with a guess first) or classic (read a majority, then write).
    pub protocol: Protocol,
    /// Total time one `next_ids` call may take, all retries included.
    pub deadline: Duration,
    /// Time to connect to one node and complete its checks (default 500 ms).
    pub connect_timeout: Duration,
    /// Time one node may take to answer one command before it counts as failed for
    /// that round (default 500 ms).
    pub reply_timeout: Duration,
    /// Accept nodes that do not fsync every write. Can repeat IDs after a crash.
    pub unsafe_skip_durability_check: bool,
    /// Longest single backoff sleep after a lost round ([`BACKOFF_CAP`] by default).
    pub backoff_cap: Duration,
    /// When to share rounds with contending clients ([`Combine::Auto`] by default).
    pub combine: Combine,
    /// TLS settings for `rediss://` nodes (none by default: the system's CAs, no client
    /// certificate). When set, every node must be `rediss://`.
    pub tls: TlsConfig,
}

impl ClientConfig {
    /// Defaults: key `current`, fast protocol, 5 s deadline, 500 ms connect and reply
    /// timeouts, durability check on, 50 ms backoff cap, combining rounds when contended.
    pub fn new(nodes: Vec<String>) -> ClientConfig {
        ClientConfig {
            nodes,
            key: "current".to_string(),
            protocol: Protocol::Fast,
            deadline: Duration::from_secs(5),
            connect_timeout: Duration::from_millis(500),
            reply_timeout: Duration::from_millis(500),
            unsafe_skip_durability_check: false,
            backoff_cap: BACKOFF_CAP,
            combine: Combine::Auto,
            tls: TlsConfig::default(),
        }
    }
}

/// A node's failure in a round the deadline ended before the node answered.
const CUT_BY_DEADLINE: &str = "no reply before the deadline";

/// `loss` with each node's "no reply before the deadline" completed by what the same
/// node failed with in an earlier round (`earlier`), if anything: the cause, not only
/// the cut.
fn with_earlier_causes(loss: RoundLoss, earlier: &[NodeFailure]) -> RoundLoss {
    let RoundLoss::Unreachable {
        reachable,
        accepted,
        mut failures,
    } = loss
    else {
        return loss;
    };
    for f in failures.iter_mut().filter(|f| f.reason == CUT_BY_DEADLINE) {
        if let Some(e) = earlier
            .iter()
            .find(|e| e.addr == f.addr && e.reason != CUT_BY_DEADLINE)
        {
            f.reason = format!("{} (the last round: {CUT_BY_DEADLINE})", e.reason);
        }
    }
    RoundLoss::Unreachable {
        reachable,
        accepted,
        failures,
    }
}

/// Why a round did not produce a range.
enum RoundLoss {
    /// Give up now: retrying cannot help.
    Fatal(IdError),
    /// Too few nodes answered.
    Unreachable {
        /// The nodes that answered (not those never asked, or not waited for).
        reachable: usize,
        /// Of those, the nodes that accepted a write round's range (`None`: a read).
        accepted: Option<usize>,
        failures: Vec<NodeFailure>,
    },
    /// Enough nodes answered but too few accepted (another client won, or our guess was
    /// stale). `all_rejected`: no node accepted, so nothing was burned.
    Contention { all_rejected: bool },
}

/// The direct client: talks to all nodes in parallel. Cheap to share (`Arc`) between
/// tasks; one per process is the usual setup.
///
/// Generic over the node type so the deterministic simulation (`testkit::sim`) runs this
/// very code over in-memory nodes; production uses the default, [`Node`] (Redis).
pub struct QuorumClient<N: Register = Node> {
    nodes: Vec<N>,
    key: String,
    protocol: Protocol,
    deadline: Duration,
    /// A node's reply timeout: the most a rendezvous call may take, and twice a read's
    /// longest hedge.
    reply_timeout: Duration,
    /// Highest register value seen on any node: the fast protocol's next guess is this + 1.
    last_known: AtomicU64,
    /// How long a write round takes: the backoff unit, and the lease's.
    round_time: MovingAverage,
    /// Pauses after lost rounds, in units of `round_time`.
    backoff: Backoff,
    /// The majority read's timing and turn (see `hedged`).
    reads: Reads,
    /// Whether requests combine, and where (see `combining`).
    combine: CombineState,
    counters: AtomicCounters,
}

fn check_shape(count: usize, key: &str) -> Result<(), IdError> {
    if count == 0 || count.is_multiple_of(2) {
        return Err(IdError::Config(format!(
            "the node count must be odd (3, 5, 7, ...), got {count}: an even count adds a node without tolerating one more failure"
        )));
    }
    if key.is_empty() {
        return Err(IdError::Config(
            "the register key must not be empty".to_string(),
        ));
    }
    Ok(())
}

/// Refuses a node listed twice (the same address, as written or once its password is
/// hidden): N entries naming fewer servers tolerate fewer failures than N says. Two
/// names for one server are found when the nodes connect (see [`Identities`]).
fn check_listed_once(urls: &[String]) -> Result<(), IdError> {
    let mut seen: Vec<NodeAddr> = Vec::new();
    for url in urls {
        let addr = NodeAddr::from_url(url.trim());
        if seen.contains(&addr) {
            return Err(IdError::Config(format!(
                "node {addr} is listed more than once: each server must be listed once, or the quorum tolerates fewer failures than its node count says"
            )));
        }
        seen.push(addr);
    }
    Ok(())
}

impl QuorumClient<Node> {
    /// Connects to every node in parallel and checks its durability configuration.
    ///
    /// # Errors
    /// A bad URL or an even node count ([`IdError::Config`]), an unsafe node
    /// ([`IdError::UnsafeNode`]), or fewer than a majority reachable ([`IdError::NoQuorum`]).
    pub async fn connect(config: ClientConfig) -> Result<QuorumClient, IdError> {
        check_shape(config.nodes.len(), &config.key)?;
        check_listed_once(&config.nodes)?;
        // Once here, so an unreadable file is one error, not one per node.
        config
            .tls
            .load()
            .map_err(|e| IdError::Config(format!("TLS: {e}")))?;
        let nodes = open_nodes(&config)?;
        let mut client =
            QuorumClient::with_nodes(nodes, config.key, config.protocol, config.deadline)?;
        client.backoff = Backoff::new(config.backoff_cap);
        client = client.with_combine(config.combine);
        client.combine.max_lease = (config.reply_timeout * 2).min(MAX_LEASE);
        client.reply_timeout = config.reply_timeout;
        let results = futures::future::join_all(client.nodes.iter().map(|n| n.warm_up())).await;
        let failures = warm_up_failures(&client.nodes, results)?;
        if config.unsafe_skip_durability_check {
            tracing::warn!("durability check skipped: a node that loses writes can make this client repeat IDs");
        }
        client.require_majority_at_connect(failures)?;
        Ok(client)
    }

    /// Fewer than a majority reachable at connect is [`IdError::NoQuorum`]; a minority
    /// unreachable is logged and tolerated.
    fn require_majority_at_connect(&self, failures: Vec<NodeFailure>) -> Result<(), IdError> {
        let total = self.nodes.len();
        let reachable = total - failures.len();
        if reachable < self.majority() {
            return Err(IdError::NoQuorum {
                needed: self.majority(),
                reachable,
                accepted: None,
                total,
                failures,
            });
        }
        for f in &failures {
            tracing::warn!(node = %f.addr, reason = %f.reason, "node unreachable at connect; continuing with a majority");
        }
        Ok(())
    }
}

/// The configured nodes, not yet connected, sharing one record of who is who (two
/// names for one server are refused at warm-up).
fn open_nodes(config: &ClientConfig) -> Result<Vec<Node>, IdError> {
    let peers = std::sync::Arc::new(Identities::default());
    let mut nodes = Vec::with_capacity(config.nodes.len());
    for (i, url) in config.nodes.iter().enumerate() {
        let node = Node::with_tls(
            url.trim(),
            config.connect_timeout,
            config.reply_timeout,
            !config.unsafe_skip_durability_check,
            &config.tls,
        )
        .map_err(|e| IdError::Config(format!("bad node URL: {e}")))?
        .with_peers(i, peers.clone());
        nodes.push(node);
    }
    Ok(nodes)
}

/// The nodes' warm-up `results`, in node order: an unsafe node is an error at once
/// (the first one), servers listed under two names are one error naming them all, and
/// what is left are the unreachable nodes.
fn warm_up_failures(
    nodes: &[Node],
    results: Vec<Result<(), NodeError>>,
) -> Result<Vec<NodeFailure>, IdError> {
    debug_assert_eq!(nodes.len(), results.len());
    let mut failures = Vec::new();
    let mut refused = Vec::new();
    for (node, result) in nodes.iter().zip(results) {
        match result {
            Ok(()) => {}
            Err(NodeError::NotIndependent(reason)) => {
                refused.push(format!("node {} {reason}", node.addr()))
            }
            Err(NodeError::Unsafe(reason)) => {
                return Err(IdError::UnsafeNode {
                    addr: node.addr().to_string(),
                    reason,
                })
            }
            Err(NodeError::Unavailable(reason) | NodeError::BadValue(reason)) => {
                failures.push(NodeFailure {
                    addr: node.addr().to_string(),
                    reason,
                })
            }
        }
    }
    if !refused.is_empty() {
        return Err(IdError::Config(refused.join("; ")));
    }
    Ok(failures)
}

impl<N: Register> QuorumClient<N> {
    /// A client over nodes that are already set up (no warm-up, no durability check):
    /// what the deterministic simulation uses. Backoff cap [`BACKOFF_CAP`].
    ///
    /// # Errors
    /// An even or zero node count, or an empty key ([`IdError::Config`]).
    pub fn with_nodes(
        nodes: Vec<N>,
        key: impl Into<String>,
        protocol: Protocol,
        deadline: Duration,
    ) -> Result<QuorumClient<N>, IdError> {
        let key = key.into();
        check_shape(nodes.len(), &key)?;
        let node_count = nodes.len();
        let mut by_addr: Vec<usize> = (0..nodes.len()).collect();
        by_addr.sort_by_key(|&i| nodes[i].addr());
        let rendezvous = [by_addr[0], *by_addr.get(1).unwrap_or(&by_addr[0])];
        Ok(QuorumClient {
            nodes,
            key,
            protocol,
            deadline,
            reply_timeout: DEFAULT_MAX_LEASE,
            last_known: AtomicU64::new(0),
            round_time: MovingAverage::new(INITIAL_ROUND),
            backoff: Backoff::new(BACKOFF_CAP),
            reads: Reads::new(INITIAL_ROUND),
            combine: CombineState::new(rendezvous),
            counters: AtomicCounters::new(node_count),
        })
    }

    /// Sets when to share rounds (see [`Combine`]).
    pub fn with_combine(mut self, combine: Combine) -> QuorumClient<N> {
        self.combine.mode = combine;
        self.combine
            .contended
            .store(combine == Combine::Always, Ordering::Relaxed);
        self
    }

    /// The preferred rendezvous node of combined rounds (the smallest address).
    pub fn rendezvous_addr(&self) -> &str {
        self.nodes[self.combine.rendezvous[0]].addr()
    }

    /// Draws backoff jitter from an RNG seeded with `seed` instead of the thread RNG, so
    /// a simulation replays exactly.
    pub fn with_jitter_seed(mut self, seed: u64) -> QuorumClient<N> {
        self.backoff = self.backoff.seeded(seed);
        self
    }

    /// Sets the upper bound of a batch leader's lease (`connect` sets twice the reply
    /// timeout; [`QuorumClient::with_nodes`] starts at 1 s, `DEFAULT_MAX_LEASE`), so a
    /// simulated client leases as a production one does.
    pub fn with_max_lease(mut self, max_lease: Duration) -> QuorumClient<N> {
        self.combine.max_lease = max_lease;
        self
    }

    /// The nodes, in configured order.
    pub fn nodes(&self) -> &[N] {
        &self.nodes
    }

    fn majority(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The node URLs, in configured order.
    pub fn node_addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr().to_string()).collect()
    }

    /// Window serving (DESIGN.md, "Serving from a confirmed window"): the conditional
    /// write of exactly `lo..=hi`, one round, no retry. `Ok(true)`: a majority accepted,
    /// the range is the caller's. `Ok(false)`: lost to another writer, or its outcome is
    /// unknown: the range must never be served (some nodes may hold `hi` now: a hole).
    ///
    /// # Errors
    /// [`IdError::NoQuorum`] when too few nodes answer by `deadline`; bad register
    /// values as for [`Self::next_ids_until`].
    pub async fn reserve(&self, lo: u64, hi: u64, deadline: Instant) -> Result<bool, IdError> {
        if lo == 0 || hi < lo || hi - lo >= MAX_COUNT {
            return Err(IdError::BadRequest(format!(
                "a reservation is 1..={MAX_COUNT} IDs above 0, got {lo}..={hi}"
            )));
        }
        match self.write_round(lo, hi, deadline, None).await {
            Ok(()) => Ok(true),
            Err(RoundLoss::Contention { .. }) => Ok(false),
            Err(loss) => Err(self.loss_error(loss, Duration::ZERO, 1)),
        }
    }

    /// A majority read of the register: the largest value among the first majority of
    /// answers, every read sent after this call began (a window confirmation).
    ///
    /// # Errors
    /// [`IdError::NoQuorum`] when too few nodes answer by `deadline`; bad register
    /// values as for [`Self::next_ids_until`].
    pub async fn read_max(&self, deadline: Instant) -> Result<u64, IdError> {
        self.read_round(deadline)
            .await
            .map_err(|loss| self.loss_error(loss, Duration::ZERO, 0))
    }

    /// The error of the last round of a request that gets no IDs: too few nodes
    /// answered, or (`Deadline`, after `waited` and `rounds` lost rounds) too few accepted.
    fn loss_error(&self, loss: RoundLoss, waited: Duration, rounds: u64) -> IdError {
        match loss {
            RoundLoss::Fatal(e) => e,
            RoundLoss::Unreachable {
                reachable,
                accepted,
                failures,
            } => IdError::NoQuorum {
                needed: self.majority(),
                reachable,
                accepted,
                total: self.nodes.len(),
                failures,
            },
            RoundLoss::Contention { .. } => IdError::Deadline {
                deadline: waited,
                rounds,
            },
        }
    }

    /// [`Self::rounds`] to the end: retries every loss until a win or the deadline.
    async fn own_rounds(
        &self,
        n: u64,
        deadline: Instant,
        started: Instant,
        batch: Option<Nonce>,
    ) -> Result<IdRange, IdError> {
        // Without yield_on_contention, `rounds` always returns Some.
        self.rounds(n, deadline, started, false, batch)
            .await
            .unwrap_or(Err(IdError::Deadline {
                deadline: deadline.saturating_duration_since(started),
                rounds: 0,
            }))
    }

    /// Own rounds until one wins, retrying lost rounds with backoff until `deadline`.
    /// With `yield_on_contention`, returns `None` instead of backing off after a round
    /// lost to another writer (the caller then combines). `batch`: the batch these
    /// rounds are for, when the caller leads one.
    async fn rounds(
        &self,
        n: u64,
        deadline: Instant,
        started: Instant,
        yield_on_contention: bool,
        batch: Option<Nonce>,
    ) -> Option<Result<IdRange, IdError>> {
        let mut losses: u32 = 0;
        // Whether this attempt's guess comes from the round just before it. A guess made
        // after a pause (or the first one) may be stale: when every node rejects it, the
        // rejects carry the current value, so the informed retry goes at once and the
        // stale attempt does not count as a loss. Otherwise a client waking from backoff
        // under contention always finds its guess stale, backs off longer, and starves.
        let mut informed = self.protocol == Protocol::Classic;
        // The failures of the last round that ran to completion: a final round cut short
        // by the deadline says only "no reply before the deadline", hiding the cause
        // (an ACL denial, a refused connection) the rounds before it saw.
        let mut seen: Vec<NodeFailure> = Vec::new();
        let last_loss = loop {
            // A round ends by the deadline at the latest (nodes that have not answered by
            // then count as failed); its outcome is then unknown and its IDs are burned.
            let loss = match self.round(n, deadline, batch).await {
                Ok(range) => return Some(Ok(range)),
                Err(RoundLoss::Fatal(e)) => return Some(Err(e)),
                Err(loss) => loss,
            };
            let pause = match &loss {
                RoundLoss::Contention { all_rejected: true } if !informed => {
                    informed = true;
                    Duration::ZERO
                }
                RoundLoss::Contention { .. } if yield_on_contention => return None,
                _ => {
                    losses += 1;
                    informed = self.protocol == Protocol::Classic;
                    self.backoff(losses)
                }
            };
            if Instant::now() + pause >= deadline {
                break loss;
            }
            if let RoundLoss::Unreachable { failures, .. } = &loss {
                seen.clone_from(failures);
            }
            bump(&self.counters.retries, 1);
            tokio::time::sleep(pause).await;
        };
        Some(Err(self.loss_error(
            with_earlier_causes(last_loss, &seen),
            deadline.saturating_duration_since(started),
            u64::from(losses),
        )))
    }

    /// One attempt: pick LO (guess or read), then the conditional write.
    async fn round(
        &self,
        n: u64,
        deadline: Instant,
        batch: Option<Nonce>,
    ) -> Result<IdRange, RoundLoss> {
        let base = match self.protocol {
            Protocol::Fast => self.last_known.load(Ordering::Relaxed),
            Protocol::Classic => self.read_round(deadline).await?,
        };
        let exhausted = || {
            RoundLoss::Fatal(IdError::Exhausted {
                addr: "quorum".to_string(),
                current: base,
                count: n,
            })
        };
        let lo = base.checked_add(1).ok_or_else(exhausted)?;
        let hi = lo.checked_add(n - 1).ok_or_else(exhausted)?;
        self.write_round(lo, hi, deadline, batch)
            .await
            .map(|()| IdRange { lo, hi })
    }

    /// The pause after `losses` lost rounds in a row: one round time, doubling.
    fn backoff(&self, losses: u32) -> Duration {
        let round = self.round_time.get();
        self.backoff.pause(round, losses)
    }

    /// Records a node failure; a bad register value ends the request at once.
    fn note_failure(
        &self,
        node: &N,
        e: NodeError,
        failures: &mut Vec<NodeFailure>,
    ) -> Result<(), RoundLoss> {
        if let Some(i) = self.nodes.iter().position(|n| std::ptr::eq(n, node)) {
            // The node's own reply timeout is the one `Unavailable` reason that is a
            // timeout (`node::describe`).
            let timeout = matches!(&e, NodeError::Unavailable(r) if r == "timed out");
            self.count_node_failure(i, timeout);
        }
        match e {
            NodeError::BadValue(value) => Err(RoundLoss::Fatal(IdError::BadValue {
                addr: node.addr().to_string(),
                key: self.key.clone(),
                value,
            })),
            NodeError::Unsafe(reason) => {
                tracing::error!(node = node.addr(), %reason, "refusing unsafe node");
                failures.push(NodeFailure {
                    addr: node.addr().to_string(),
                    reason: format!("unsafe: {reason}"),
                });
                Ok(())
            }
            NodeError::NotIndependent(reason) => {
                tracing::error!(node = node.addr(), %reason, "refusing node");
                failures.push(NodeFailure {
                    addr: node.addr().to_string(),
                    reason: format!("refused: it {reason}"),
                });
                Ok(())
            }
            NodeError::Unavailable(reason) => {
                failures.push(NodeFailure {
                    addr: node.addr().to_string(),
                    reason,
                });
                Ok(())
            }
        }
    }
}

/// Requests: these may combine, so they need the node's rendezvous too.
impl<N: Register + Rendezvous> QuorumClient<N> {
    /// Reserves `n` IDs, retrying lost rounds with jittered backoff until `deadline`
    /// (the broker passes its callers' deadline here). Under contention (see [`Combine`])
    /// the request rides in a round shared with other clients instead.
    ///
    /// # Errors
    /// As [`IdSource::next_ids`]: [`IdError::BadRequest`] for `n` outside
    /// `1..=MAX_COUNT`; [`IdError::BadValue`] and [`IdError::Exhausted`] at once;
    /// [`IdError::NoQuorum`] or [`IdError::Deadline`] when the deadline passes.
    pub async fn next_ids_until(&self, n: u64, deadline: Instant) -> Result<IdRange, IdError> {
        bump(&self.counters.requests, 1);
        let result = self.next_ids_inner(n, deadline).await;
        if result.is_err() {
            bump(&self.counters.errors, 1);
        }
        result
    }

    async fn next_ids_inner(&self, n: u64, deadline: Instant) -> Result<IdRange, IdError> {
        if n == 0 || n > MAX_COUNT {
            return Err(IdError::BadRequest(format!(
                "count must be 1..={MAX_COUNT}, got {n}"
            )));
        }
        let started = Instant::now();
        let fast = self.protocol == Protocol::Fast && self.combine.mode != Combine::Never;
        if fast && self.combine.contended.load(Ordering::Relaxed) && self.rendezvous_now().is_some()
        {
            if let Some(result) = self.combined(n, deadline, started).await {
                return result;
            }
        } else {
            if fast && self.combine.contended.load(Ordering::Relaxed) {
                // Contended, but no rendezvous to be had (both failed): own rounds.
                bump(&self.counters.uncombined, 1);
            }
            // Yield a lost round to combining only when combining can happen now; else the
            // rounds go on with their backoff intact.
            match self
                .rounds(
                    n,
                    deadline,
                    started,
                    fast && self.rendezvous_now().is_some(),
                    None,
                )
                .await
            {
                Some(result) => return result,
                None => {
                    // Lost to another writer: share rounds from now on.
                    self.combine.contended.store(true, Ordering::Relaxed);
                    if let Some(result) = self.combined(n, deadline, started).await {
                        return result;
                    }
                }
            }
        }
        // No rendezvous (or a failed batch): rounds of our own, with backoff.
        bump(&self.counters.uncombined, 1);
        self.own_rounds(n, deadline, started, None).await
    }
}

impl<N: Register + Rendezvous> IdSource for QuorumClient<N> {
    async fn next_ids(&self, n: u64) -> Result<IdRange, IdError> {
        self.next_ids_until(n, Instant::now() + self.deadline).await
    }
}

#[cfg(test)]
mod tests;

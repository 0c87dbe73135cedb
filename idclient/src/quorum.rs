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
//! is a small state machine: `join_step` joins and hands over to `follow` (a member),
//! `lead_open_batch` (the leader of an open batch) or `lead` (running the batch), each of
//! which answers with what comes next ([`Next`]).

use crate::backoff::Backoff;
use crate::combine::{self, WaitEnd};
use crate::node::{Identities, Identity, Node, NodeAddr, TlsConfig};
use crate::register::{NodeError, Register, Rendezvous, WriteReply, Written, MAX_COUNT};
use crate::rendezvous::{member_range, BatchResult, Close, Join, Leases, Nonce};
use crate::script::MAX_RENDEZVOUS_TTL_MS;
use crate::{IdError, IdRange, IdSource};
use futures::stream::{FuturesUnordered, StreamExt};
use idproto::NodeFailure;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::broadcast::Receiver;
use tokio::time::Instant;

/// The backoff window starts at one round's duration (measured, see `round_ns`) and
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
    pub protocol: Protocol,
    /// Total time one `next_ids` call may take, all retries included.
    pub deadline: Duration,
    pub connect_timeout: Duration,
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

/// Counters for benchmarks and logs (monotonic since the client was created).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// `next_ids` calls.
    pub requests: u64,
    /// Conditional-write rounds sent.
    pub rounds: u64,
    /// Node replies that rejected a write.
    pub rejects: u64,
    /// Rounds retried after a loss.
    pub retries: u64,
    /// IDs of lost rounds that some node accepted: an upper bound on the holes this
    /// client left.
    pub burned: u64,
    /// Calls that ended in an error.
    pub errors: u64,
    /// Requests served by a batch that another client led (combined rounds).
    pub combined: u64,
    /// Batches this client led (its own request, and its members' if any).
    pub batches: u64,
}

/// One node's failures seen by this client's rounds (monotonic), for per-node metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCounters {
    /// The node's shown address ([`Register::addr`]: never a password).
    pub addr: String,
    /// Replies that were errors (unreachable, refused, broken connection, bad node),
    /// its own reply timeouts excluded.
    pub errors: u64,
    /// Calls that timed out: the node's reply timeout, or no reply before the round's
    /// deadline.
    pub timeouts: u64,
}

#[derive(Default)]
struct NodeAtomics {
    errors: AtomicU64,
    timeouts: AtomicU64,
}

#[derive(Default)]
struct AtomicCounters {
    requests: AtomicU64,
    rounds: AtomicU64,
    rejects: AtomicU64,
    retries: AtomicU64,
    burned: AtomicU64,
    errors: AtomicU64,
    combined: AtomicU64,
    batches: AtomicU64,
}

fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

/// Replies of one round so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub accepts: usize,
    pub rejects: usize,
    pub failures: usize,
    /// Highest register value any node reported (accepted HI included).
    pub max_seen: u64,
}

/// Where a round stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Neither outcome is certain yet.
    Pending,
    /// A majority accepted: the range is generated.
    Won,
    /// A majority can no longer accept.
    Lost,
}

/// The quorum decision, a pure function of the node count and the replies so far.
pub fn decide(nodes: usize, tally: &Tally) -> Decision {
    let majority = nodes / 2 + 1;
    if tally.accepts >= majority {
        Decision::Won
    } else if tally.rejects + tally.failures > nodes - majority {
        Decision::Lost
    } else {
        Decision::Pending
    }
}

/// Solo batches in a row (no other client at the rendezvous) after which a client stops
/// combining and goes back to plain rounds.
pub const SOLO_STREAK: u32 = 16;

/// A batch leader's lease is this many measured round times (see `QuorumClient::lease`):
/// room for a few lost rounds and their backoff. A round that needs longer is in trouble,
/// and its members had better try on their own than wait for a leader that may be gone.
pub const LEASE_ROUNDS: u32 = 16;

/// The shortest lease: scheduling noise on a busy machine must not end healthy batches.
pub const MIN_LEASE: Duration = Duration::from_millis(25);

/// The longest lease unless set from the reply timeout (2x): a leader cut off from the
/// nodes keeps its members waiting no longer than one of its node replies could take.
pub const DEFAULT_MAX_LEASE: Duration = Duration::from_secs(1);

/// After the preferred rendezvous node failed (down, paused, unreachable, stuck), clients
/// combine at the fallback node for this long before they try it again; after both
/// failed, they run their own rounds for this long.
pub const RENDEZVOUS_RETRY: Duration = Duration::from_secs(1);

/// Rendezvous waits that ended without progress (a member's leader vanished, a batch
/// stayed in flight past its lease) one request tolerates before it runs its own rounds
/// and the client leaves the rendezvous alone for [`RENDEZVOUS_RETRY`]: one is a crashed
/// leader, two in a row a stuck rendezvous (a stray key, an overloaded node).
pub const MAX_STALLS: u32 = 2;

/// A rendezvous call (one script, no fsync) may take this many leases before the client
/// gives up on the rendezvous: a paused node must not hold requests for a reply timeout.
pub const RENDEZVOUS_PATIENCE_LEASES: u32 = 2;

/// A leader polling `close` (its results subscription ended) waits at least this long
/// between calls, so a batch in flight without expiry cannot make it spin.
pub const MIN_POLL: Duration = Duration::from_millis(1);

/// The longest lease any client asks for, whatever its reply timeout: the rendezvous
/// script deletes keys that hold longer as stray (`script::MAX_RENDEZVOUS_TTL_MS`, 60 s).
pub const MAX_LEASE: Duration = Duration::from_secs(25);

// The rendezvous script keeps a key for at most MAX_RENDEZVOUS_TTL_MS; a batch lease
// (two leases) must fit, or the script would delete live batches as stray.
const _: () = assert!(MAX_LEASE.as_millis() * 2 <= MAX_RENDEZVOUS_TTL_MS as u128);

/// How long a member waits past its leader's lease before joining again: slack for the
/// time a reply takes to travel, not for the leader.
pub const LEADER_GRACE: Duration = Duration::from_millis(10);

/// Where a client combines. Every client on the same nodes prefers the same node, and
/// when it fails they all see it fail and move to the same fallback: combining goes on
/// through the failure instead of falling to contended own rounds. The rendezvous only
/// decides who writes, so clients that disagree for a moment contend, safely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Venue {
    /// At the node with the smallest address.
    Preferred,
    /// At the node with the second smallest address, until the preferred one is tried
    /// again.
    Fallback { until: Instant },
    /// Both failed: own rounds until then.
    Off { until: Instant },
}

/// Why a rendezvous call gave no answer.
enum Stop {
    /// The request's deadline passed.
    Deadline,
    /// The rendezvous failed or is too slow (already marked failed).
    Unavailable,
}

/// One request's way through the rendezvous (see `QuorumClient::combined`).
struct Combining {
    /// The rendezvous node.
    rv: usize,
    /// The IDs this request asks for.
    n: u64,
    deadline: Instant,
    started: Instant,
    /// How long one rendezvous call may take (see `QuorumClient::rendezvous_patience`).
    patience: Duration,
    /// Waits that ended without progress so far (see [`MAX_STALLS`]).
    stalls: u32,
    /// The longest wait an answer of the rendezvous is believed.
    longest: Duration,
}

/// Where a step of combining leads.
enum Next {
    /// The request's answer.
    Done(Result<IdRange, IdError>),
    /// Join again: this batch gave the request nothing, but the rendezvous works.
    Rejoin,
    /// This rendezvous failed (marked failed already): the request moves on to the next
    /// one (the fallback), if it has not failed too.
    Unavailable,
    /// Leave the rendezvous: the caller runs its own rounds.
    OwnRounds,
}

impl Combining {
    /// The request's deadline passed.
    fn past_deadline(&self) -> Next {
        Next::Done(Err(IdError::Deadline {
            deadline: self.deadline.saturating_duration_since(self.started),
            rounds: 0,
        }))
    }

    /// A rendezvous call gave no answer (see [`Stop`]).
    fn stopped(&self, stop: Stop) -> Next {
        match stop {
            Stop::Deadline => self.past_deadline(),
            Stop::Unavailable => Next::Unavailable,
        }
    }

    /// Until when to wait for a batch whose lease ends in `wait`: never beyond the
    /// deadline, nor beyond what any leader could hold, plus a grace for the reply's way.
    fn until(&self, wait: Duration) -> Instant {
        self.deadline
            .min(Instant::now() + wait.min(self.longest) + LEADER_GRACE)
    }
}

/// Why a round did not produce a range.
/// A node's failure in a round the deadline ended before the node answered.
const CUT_BY_DEADLINE: &str = "no reply before the deadline";

/// A majority read asks the other nodes too once its answers take this many usual read
/// times.
pub const READ_HEDGE_READS: u32 = 4;

/// The shortest wait before a majority read asks the other nodes.
pub const MIN_READ_HEDGE: Duration = Duration::from_micros(500);

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
/// Generic over the node type so the deterministic simulation (`idtools::sim`) runs this
/// very code over in-memory nodes; production uses the default, [`Node`] (Redis).
pub struct QuorumClient<N: Register = Node> {
    nodes: Vec<N>,
    key: String,
    protocol: Protocol,
    deadline: Duration,
    /// Highest register value seen on any node: the fast protocol's next guess is this + 1.
    last_known: AtomicU64,
    /// Fast protocol: another client writes the register too, so requests go through
    /// combined rounds. Set by a round lost to another writer; cleared after
    /// [`SOLO_STREAK`] batches that found nobody else.
    contended: AtomicBool,
    solo_streak: AtomicU32,
    /// The rendezvous nodes of combined rounds, preferred first: the nodes with the
    /// smallest and second smallest address, so clients configured with the same nodes
    /// in any order meet at the same one, and move to the same one when it fails.
    rendezvous: [usize; 2],
    results: combine::Results,
    combine: Combine,
    /// Which rendezvous is in use (see [`Venue`]).
    rendezvous_state: Mutex<Venue>,
    /// Upper bound of [`QuorumClient::lease`].
    max_lease: Duration,
    /// A node's reply timeout: the most a rendezvous call may take.
    reply_timeout: Duration,
    /// Moving average of a write round's duration, in ns: the backoff unit.
    round_ns: AtomicU64,
    /// Moving average of a majority read's duration, in ns: the read hedge's unit.
    read_ns: AtomicU64,
    /// The node a majority read asks first, in turn.
    read_cursor: AtomicUsize,
    /// Pauses after lost rounds, in units of `round_ns`.
    backoff: Backoff,
    counters: AtomicCounters,
    /// Per node, in `nodes` order.
    node_counters: Vec<NodeAtomics>,
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
        let mut client =
            QuorumClient::with_nodes(nodes, config.key, config.protocol, config.deadline)?;
        client.backoff = Backoff::new(config.backoff_cap);
        client = client.with_combine(config.combine);
        client.max_lease = (config.reply_timeout * 2).min(MAX_LEASE);
        client.reply_timeout = config.reply_timeout;
        let results = futures::future::join_all(client.nodes.iter().map(|n| n.warm_up())).await;
        let mut failures = Vec::new();
        let mut refused = Vec::new();
        for (node, result) in client.nodes.iter().zip(results) {
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
        if config.unsafe_skip_durability_check {
            tracing::warn!("durability check skipped: a node that loses writes can make this client repeat IDs");
        }
        let total = client.nodes.len();
        let reachable = total - failures.len();
        if reachable < client.majority() {
            return Err(IdError::NoQuorum {
                needed: client.majority(),
                reachable,
                accepted: None,
                total,
                failures,
            });
        }
        for f in &failures {
            tracing::warn!(node = %f.addr, reason = %f.reason, "node unreachable at connect; continuing with a majority");
        }
        Ok(client)
    }
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
            last_known: AtomicU64::new(0),
            contended: AtomicBool::new(false),
            solo_streak: AtomicU32::new(0),
            rendezvous,
            results: combine::Results::default(),
            combine: Combine::Auto,
            rendezvous_state: Mutex::new(Venue::Preferred),
            max_lease: DEFAULT_MAX_LEASE,
            reply_timeout: DEFAULT_MAX_LEASE,
            round_ns: AtomicU64::new(INITIAL_ROUND.as_nanos() as u64),
            read_ns: AtomicU64::new(INITIAL_ROUND.as_nanos() as u64),
            read_cursor: AtomicUsize::new(0),
            backoff: Backoff::new(BACKOFF_CAP),
            counters: AtomicCounters::default(),
            node_counters: (0..node_count).map(|_| NodeAtomics::default()).collect(),
        })
    }

    /// Sets when to share rounds (see [`Combine`]).
    pub fn with_combine(mut self, combine: Combine) -> QuorumClient<N> {
        self.combine = combine;
        self.contended
            .store(combine == Combine::Always, Ordering::Relaxed);
        self
    }

    /// The preferred rendezvous node of combined rounds (the smallest address).
    pub fn rendezvous_addr(&self) -> &str {
        self.nodes[self.rendezvous[0]].addr()
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
        self.max_lease = max_lease;
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

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counters {
            requests: get(&c.requests),
            rounds: get(&c.rounds),
            rejects: get(&c.rejects),
            retries: get(&c.retries),
            burned: get(&c.burned),
            errors: get(&c.errors),
            combined: get(&c.combined),
            batches: get(&c.batches),
        }
    }

    /// Each node's failures so far, in configured order.
    pub fn node_counters(&self) -> Vec<NodeCounters> {
        self.nodes
            .iter()
            .zip(&self.node_counters)
            .map(|(node, c)| NodeCounters {
                addr: node.addr().to_string(),
                errors: c.errors.load(Ordering::Relaxed),
                timeouts: c.timeouts.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Counts a failure of the node at `i` (a timeout or another error).
    fn count_node_failure(&self, i: usize, timeout: bool) {
        if let Some(c) = self.node_counters.get(i) {
            bump(if timeout { &c.timeouts } else { &c.errors }, 1);
        }
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

    /// Classic step 1: GET from every node, max of a majority of answers.
    async fn read_round(&self, deadline: Instant) -> Result<u64, RoundLoss> {
        let started = Instant::now();
        let count = self.nodes.len();
        let need = self.majority();
        // Thrifty: ask a majority, starting at the next node in turn so reads spread
        // evenly; one more for each that fails, and all the rest once the answers are
        // overdue (a hedge against a slow or silent node). Any majority will do: it
        // holds every value a majority accepted before this call.
        let first = self.read_cursor.fetch_add(1, Ordering::Relaxed) % count;
        let order: Vec<usize> = (0..count).map(|k| (first + k) % count).collect();
        let ask = |i: usize| {
            let node = &self.nodes[i];
            async move { (i, node.read(&self.key).await) }
        };
        let mut pending: FuturesUnordered<_> = order[..need].iter().map(|&i| ask(i)).collect();
        let mut unasked = order[need..].iter();
        let mut outstanding = vec![false; count];
        for &i in &order[..need] {
            outstanding[i] = true;
        }
        let hedge_at = started + self.read_hedge();
        let mut hedged = false;
        let (mut answers, mut max, mut failures) = (0, 0u64, Vec::new());
        loop {
            let wake = if hedged {
                deadline
            } else {
                deadline.min(hedge_at)
            };
            let (i, reply) = match tokio::time::timeout_at(wake, pending.next()).await {
                Ok(Some(reply)) => reply,
                Ok(None) => break,
                Err(_) if !hedged && Instant::now() < deadline => {
                    hedged = true;
                    for &i in unasked.by_ref() {
                        outstanding[i] = true;
                        pending.push(ask(i));
                    }
                    continue;
                }
                Err(_) => {
                    for (i, node) in self.nodes.iter().enumerate() {
                        if outstanding[i] {
                            self.count_node_failure(i, true);
                            failures.push(NodeFailure {
                                addr: node.addr().to_string(),
                                reason: CUT_BY_DEADLINE.to_string(),
                            });
                        }
                    }
                    break;
                }
            };
            outstanding[i] = false;
            match reply {
                Ok(v) => {
                    answers += 1;
                    max = max.max(v);
                }
                Err(e) => {
                    self.note_failure(&self.nodes[i], e, &mut failures)?;
                    if let Some(&next) = unasked.next() {
                        outstanding[next] = true;
                        pending.push(ask(next));
                    }
                }
            }
            if answers >= need {
                self.last_known.fetch_max(max, Ordering::Relaxed);
                if !hedged {
                    // Only reads the first majority answered count: a hedged read's time
                    // is the hedge's, and feeding it back would grow the hedge with
                    // every read that meets a silent node, up to half a reply timeout.
                    let took = started.elapsed().as_nanos() as u64;
                    let avg = self.read_ns.load(Ordering::Relaxed);
                    self.read_ns.store((avg * 7 + took) / 8, Ordering::Relaxed);
                }
                return Ok(max);
            }
            if failures.len() > count - need {
                break;
            }
        }
        // Only the nodes that answered: a node never asked (the read is thrifty) or still
        // silent at the deadline did not, and counting it said "3 of 5 nodes answered,
        // 3 needed" of a read that one node answered.
        Err(RoundLoss::Unreachable {
            reachable: answers,
            accepted: None,
            failures,
        })
    }

    /// How long a read waits for its first majority before asking the other nodes:
    /// a few times the usual read, at least [`MIN_READ_HEDGE`], at most half a reply
    /// timeout.
    fn read_hedge(&self) -> Duration {
        let usual = Duration::from_nanos(self.read_ns.load(Ordering::Relaxed));
        (usual * READ_HEDGE_READS)
            .clamp(MIN_READ_HEDGE, (self.reply_timeout / 2).max(MIN_READ_HEDGE))
    }

    /// The conditional write of `lo..=hi` on every node; ends as soon as the outcome is
    /// certain (late replies are dropped: they cannot change it).
    async fn write_round(
        &self,
        lo: u64,
        hi: u64,
        deadline: Instant,
        batch: Option<Nonce>,
    ) -> Result<(), RoundLoss> {
        bump(&self.counters.rounds, 1);
        let started = Instant::now();
        let (decision, tally, failures) = self.collect_writes(lo, hi, deadline, batch).await?;
        self.last_known.fetch_max(tally.max_seen, Ordering::Relaxed);
        let took = started.elapsed().as_nanos() as u64;
        let avg = self.round_ns.load(Ordering::Relaxed);
        self.round_ns.store((avg * 7 + took) / 8, Ordering::Relaxed);
        bump(&self.counters.rejects, tally.rejects as u64);
        match decision {
            Decision::Won => Ok(()),
            // Only the nodes that answered (a node still silent when the loss became
            // certain did not, nor is it among the failures).
            _ if tally.failures > self.nodes.len() - self.majority() => {
                Err(RoundLoss::Unreachable {
                    reachable: tally.accepts + tally.rejects,
                    accepted: Some(tally.accepts),
                    failures,
                })
            }
            _ => {
                if tally.accepts > 0 {
                    bump(&self.counters.burned, hi - lo + 1);
                }
                Err(RoundLoss::Contention {
                    all_rejected: tally.accepts == 0,
                })
            }
        }
    }

    /// Sends the conditional write to every node and tallies the replies until the
    /// decision is certain, every node answered, or the deadline passed (then `Lost`).
    async fn collect_writes(
        &self,
        lo: u64,
        hi: u64,
        deadline: Instant,
        batch: Option<Nonce>,
    ) -> Result<(Decision, Tally, Vec<NodeFailure>), RoundLoss> {
        let mut pending: FuturesUnordered<_> =
            self.nodes
                .iter()
                .enumerate()
                .map(|(i, node)| async move {
                    (i, node.conditional_write(&self.key, lo, hi, batch).await)
                })
                .collect();
        let mut tally = Tally::default();
        let mut failures = Vec::new();
        let mut answered = vec![false; self.nodes.len()];
        loop {
            let Some((i, reply)) = self
                .next_reply(&mut pending, &mut answered, &mut failures, deadline)
                .await
            else {
                tally.failures = failures.len();
                return Ok((Decision::Lost, tally, failures));
            };
            match reply {
                Ok(written) => self.count_write(&mut tally, written, hi),
                Err(e) => {
                    self.note_failure(&self.nodes[i], e, &mut failures)?;
                    tally.failures += 1;
                }
            }
            match decide(self.nodes.len(), &tally) {
                Decision::Pending => continue,
                done => return Ok((done, tally, failures)),
            }
        }
    }

    /// Adds one node's answer to the conditional write of `..=hi` to `tally`.
    fn count_write(&self, tally: &mut Tally, written: Written, hi: u64) {
        if written.combining && self.protocol == Protocol::Fast && self.combine == Combine::Auto {
            // Others share rounds at the rendezvous: join them next time rather than
            // race their leaders.
            self.contended.store(true, Ordering::Relaxed);
        }
        match written.reply {
            WriteReply::Accepted => {
                tally.accepts += 1;
                tally.max_seen = tally.max_seen.max(hi);
            }
            WriteReply::Rejected { current } => {
                tally.rejects += 1;
                tally.max_seen = tally.max_seen.max(current);
            }
        }
    }

    /// The next node reply of a round, or `None` when every node answered or the deadline
    /// passed; then every node that has not answered is added to `failures`.
    async fn next_reply<T>(
        &self,
        pending: &mut FuturesUnordered<impl std::future::Future<Output = (usize, T)>>,
        answered: &mut [bool],
        failures: &mut Vec<NodeFailure>,
        deadline: Instant,
    ) -> Option<(usize, T)> {
        match tokio::time::timeout_at(deadline, pending.next()).await {
            Ok(Some((i, reply))) => {
                answered[i] = true;
                Some((i, reply))
            }
            Ok(None) => None,
            Err(_) => {
                for (i, (node, _)) in self
                    .nodes
                    .iter()
                    .zip(answered.iter())
                    .enumerate()
                    .filter(|(_, (_, done))| !**done)
                {
                    self.count_node_failure(i, true);
                    failures.push(NodeFailure {
                        addr: node.addr().to_string(),
                        reason: CUT_BY_DEADLINE.to_string(),
                    });
                }
                None
            }
        }
    }

    /// The pause after `losses` lost rounds in a row: one round time, doubling.
    fn backoff(&self, losses: u32) -> Duration {
        let round = Duration::from_nanos(self.round_ns.load(Ordering::Relaxed));
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

    /// How long a rendezvous call may take, and a member may wait for the results
    /// channel: [`RENDEZVOUS_PATIENCE_LEASES`] leases, at most the reply timeout. A call
    /// is one script without fsync, so a reply slower than that means a paused or
    /// overloaded node, and the client does better on its own rounds.
    fn rendezvous_patience(&self) -> Duration {
        (self.lease() * RENDEZVOUS_PATIENCE_LEASES).min(self.reply_timeout)
    }

    /// How long a batch leader may take for its round before its members stop waiting and
    /// join again (an open batch may first wait as long for the batch in flight):
    /// [`LEASE_ROUNDS`] measured rounds, within [`MIN_LEASE`] and twice the reply timeout.
    /// Short, because a vanished leader (a crashed client, a killed broker) costs every
    /// member its lease; a leader that outlives it is safe, its members just stop waiting.
    fn lease(&self) -> Duration {
        let round = Duration::from_nanos(self.round_ns.load(Ordering::Relaxed));
        (round * LEASE_ROUNDS).clamp(MIN_LEASE, self.max_lease.max(MIN_LEASE))
    }

    /// The rendezvous node to combine at now, if any (see [`Venue`]).
    fn rendezvous_now(&self) -> Option<usize> {
        let mut state = self
            .rendezvous_state
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match *state {
            Venue::Fallback { until } | Venue::Off { until } if Instant::now() >= until => {
                *state = Venue::Preferred;
            }
            _ => {}
        }
        match *state {
            Venue::Preferred => Some(self.rendezvous[0]),
            Venue::Fallback { .. } => Some(self.rendezvous[1]),
            Venue::Off { .. } => None,
        }
    }

    /// The rendezvous at node `rv` failed (down, paused, too slow, stuck): the preferred
    /// one hands over to the fallback; a failed fallback means own rounds for a while.
    fn rendezvous_failed(&self, rv: usize) {
        let mut state = self
            .rendezvous_state
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let until = Instant::now() + RENDEZVOUS_RETRY;
        *state = match *state {
            // Another task saw the preferred node fail and moved already.
            Venue::Fallback { .. } if rv != self.rendezvous[1] => return,
            Venue::Off { .. } => return,
            Venue::Preferred if rv == self.rendezvous[0] && rv != self.rendezvous[1] => {
                Venue::Fallback { until }
            }
            _ => Venue::Off { until },
        };
    }
}

/// Requests, and combined rounds: these need the node's rendezvous too.
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
        let fast = self.protocol == Protocol::Fast && self.combine != Combine::Never;
        if fast && self.contended.load(Ordering::Relaxed) && self.rendezvous_now().is_some() {
            if let Some(result) = self.combined(n, deadline, started).await {
                return result;
            }
        } else {
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
                    self.contended.store(true, Ordering::Relaxed);
                    if let Some(result) = self.combined(n, deadline, started).await {
                        return result;
                    }
                }
            }
        }
        // No rendezvous (or a failed batch): rounds of our own, with backoff.
        self.own_rounds(n, deadline, started, None).await
    }

    /// `n` IDs through combined rounds (see [`crate::combine`]). `None`: no rendezvous
    /// to be had, or the batch this request was in failed; the caller runs its own rounds.
    ///
    /// A small state machine: [`Self::join_step`] joins and dispatches on the answer to
    /// [`Self::follow`] (a member), [`Self::lead_open_batch`] (the leader of an open
    /// batch) or [`Self::lead`] (a batch of its own); each says what comes next.
    async fn combined(
        &self,
        n: u64,
        deadline: Instant,
        started: Instant,
    ) -> Option<Result<IdRange, IdError>> {
        // A rendezvous that fails during the request (down, paused, stuck) is marked
        // failed and the request moves on to the fallback, where the other clients go
        // too: falling to its own rounds instead would have it contend with every
        // batch, and under load lose round after round until its deadline. Each node
        // is tried once per request, so this ends.
        let mut tried: [Option<usize>; 2] = [None; 2];
        for slot in 0..tried.len() {
            let rv = self.rendezvous_now()?;
            if tried.contains(&Some(rv)) {
                return None;
            }
            tried[slot] = Some(rv);
            match self.combined_at(rv, n, deadline, started).await {
                Next::Done(result) => return Some(result),
                Next::Unavailable => continue,
                Next::OwnRounds | Next::Rejoin => return None,
            }
        }
        None
    }

    /// `n` IDs through combined rounds at the rendezvous node `rv`, joining again as
    /// long as it makes progress; [`Next::Unavailable`] when it failed.
    async fn combined_at(&self, rv: usize, n: u64, deadline: Instant, started: Instant) -> Next {
        let patience = self.rendezvous_patience();
        let rx = tokio::time::timeout(
            patience,
            self.results.receiver(rv, &self.nodes[rv], &self.key),
        )
        .await;
        let Ok(Some(mut rx)) = rx else {
            tracing::debug!(
                node = self.nodes[rv].addr(),
                "rendezvous unavailable: no results channel within {patience:?}"
            );
            self.rendezvous_failed(rv);
            return Next::Unavailable;
        };
        let mut c = Combining {
            rv,
            n,
            deadline,
            started,
            patience,
            stalls: 0,
            // No wait the rendezvous announces is believed beyond what any leader could hold.
            longest: self.max_lease * 2 + LEADER_GRACE,
        };
        loop {
            match self.join_step(&mut c, &mut rx).await {
                Next::Rejoin => {}
                next => return next,
            }
        }
    }

    /// One `join` at the rendezvous, and what its answer leads to.
    async fn join_step(&self, c: &mut Combining, rx: &mut Receiver<BatchResult>) -> Next {
        let now = Instant::now();
        if now >= c.deadline {
            return c.past_deadline();
        }
        if c.stalls >= MAX_STALLS {
            return self.leave(c, "join", format!("{} waits without progress", c.stalls));
        }
        let nonce = Nonce::random();
        let remaining = c.deadline - now;
        let lease = self.lease();
        let leases = Leases {
            round: lease.min(remaining),
            batch: (lease * 2).min(remaining),
        };
        let join = self.nodes[c.rv].join(&self.key, c.n, nonce, leases);
        match self.ask(c.rv, "join", c.deadline, c.patience, join).await {
            Err(stop) => c.stopped(stop),
            Ok(Join::Full) => Next::OwnRounds,
            Ok(Join::Solo) => {
                self.note_solo_batch();
                Next::Done(self.lead(c, nonce, c.n).await)
            }
            Ok(Join::Follow {
                batch,
                offset,
                wait,
            }) => {
                self.solo_streak.store(0, Ordering::Relaxed);
                self.follow(c, rx, batch, offset, wait).await
            }
            Ok(Join::Lead { busy, wait }) => {
                self.solo_streak.store(0, Ordering::Relaxed);
                self.lead_open_batch(c, rx, nonce, busy, wait).await
            }
        }
    }

    /// A batch that found nobody else: after [`SOLO_STREAK`] in a row (with
    /// [`Combine::Auto`]), stop paying for the rendezvous.
    fn note_solo_batch(&self) {
        if self.combine == Combine::Auto
            && self.solo_streak.fetch_add(1, Ordering::Relaxed) + 1 >= SOLO_STREAK
        {
            self.solo_streak.store(0, Ordering::Relaxed);
            self.contended.store(false, Ordering::Relaxed);
        }
    }

    /// A member of `batch` at `offset`: waits for the leader's result (until the leader's
    /// lease `wait` ends) and takes its share of it.
    async fn follow(
        &self,
        c: &mut Combining,
        rx: &mut Receiver<BatchResult>,
        batch: Nonce,
        offset: u64,
        wait: Duration,
    ) -> Next {
        let result = combine::wait_for(rx, batch, c.until(wait), |r| self.learn(r)).await;
        match result {
            Ok(BatchResult {
                range: Some(range), ..
            }) => match member_range(range, offset, c.n) {
                Some(mine) => {
                    bump(&self.counters.combined, 1);
                    Next::Done(Ok(mine))
                }
                None => {
                    tracing::warn!(%batch, ?range, offset, n = c.n, "batch result does not cover this member; joining again");
                    Next::Rejoin
                }
            },
            // The batch's round failed (the leader retried until its deadline, or met an
            // error retrying cannot fix): our own rounds report why.
            Ok(BatchResult { range: None, .. }) => Next::OwnRounds,
            // The connection to the rendezvous ended (the node died or restarted): its
            // batches are gone with it.
            Err(WaitEnd::Closed) => {
                self.rendezvous_failed(c.rv);
                Next::Unavailable
            }
            // The leader vanished: its batch's IDs, if any, stay unused.
            Err(WaitEnd::TimedOut) => {
                c.stalls += 1;
                Next::Rejoin
            }
        }
    }

    /// The leader of the open batch `nonce`: waits for batch `busy` in flight (its lease
    /// ends in `wait`), then closes its own batch and runs it.
    async fn lead_open_batch(
        &self,
        c: &mut Combining,
        rx: &mut Receiver<BatchResult>,
        nonce: Nonce,
        mut busy: Nonce,
        mut wait: Duration,
    ) -> Next {
        loop {
            self.wait_in_flight(c, rx, busy, wait).await;
            let now = Instant::now();
            if now >= c.deadline {
                return c.past_deadline();
            }
            let lease = self.lease().min(c.deadline - now);
            let close = self.nodes[c.rv].close(&self.key, nonce, lease);
            match self.ask(c.rv, "close", c.deadline, c.patience, close).await {
                // The total comes from the rendezvous node: a batch that cannot hold our
                // own share is no batch to lead.
                Ok(Close::Closed { ids }) if ids < c.n => {
                    let reason = format!("batch closed with {ids} IDs, below our own {}", c.n);
                    return self.leave(c, "close", reason);
                }
                Ok(Close::Closed { ids }) => return Next::Done(self.lead(c, nonce, ids).await),
                Ok(Close::Busy { busy: b, .. }) if b == busy => {
                    // Still in flight after its lease: no progress.
                    c.stalls += 1;
                    if c.stalls >= MAX_STALLS {
                        let reason = format!("batch {busy} in flight past its lease");
                        return self.leave(c, "close", reason);
                    }
                    wait = MIN_POLL;
                }
                Ok(Close::Busy { busy: b, wait: w }) => (busy, wait) = (b, w),
                // Our open batch expired while we waited for the one in flight: no
                // progress either. (Uncounted, a stray mark that outlasts every lease had
                // leaders join, wait and find their batch expired, over and over until
                // their deadline.)
                Ok(Close::Gone) => {
                    c.stalls += 1;
                    return Next::Rejoin;
                }
                Err(stop) => return c.stopped(stop),
            }
        }
    }

    /// Waits for the result of batch `busy` in flight, at most until its lease `wait`
    /// ends; polls instead (sleeps) when the results subscription has ended.
    async fn wait_in_flight(
        &self,
        c: &Combining,
        rx: &mut Receiver<BatchResult>,
        busy: Nonce,
        wait: Duration,
    ) {
        let result = combine::wait_for(rx, busy, c.until(wait), |r| self.learn(r)).await;
        if result == Err(WaitEnd::Closed) {
            tokio::time::sleep(wait.clamp(MIN_POLL, c.longest)).await;
        }
    }

    /// A published batch result teaches the register's progress (the next fast guess).
    fn learn(&self, result: &BatchResult) {
        if let Some(range) = result.range {
            self.last_known.fetch_max(range.hi, Ordering::Relaxed);
        }
    }

    /// Leaves the rendezvous (marked failed: the fallback, or own rounds, for a while)
    /// because `op` made no progress.
    fn leave(&self, c: &Combining, op: &str, reason: String) -> Next {
        let node = self.nodes[c.rv].addr();
        tracing::debug!(node, op, error = %reason, "rendezvous unavailable");
        self.rendezvous_failed(c.rv);
        Next::Unavailable
    }

    /// Runs the batch `nonce` of `ids` IDs (the leader's own share first) and publishes
    /// the outcome to its members. The leader's share is checked like a member's.
    async fn lead(&self, c: &Combining, nonce: Nonce, ids: u64) -> Result<IdRange, IdError> {
        bump(&self.counters.batches, 1);
        let (n, deadline, started) = (c.n, c.deadline, c.started);
        let result = self.own_rounds(ids, deadline, started, Some(nonce)).await;
        let message = BatchResult {
            batch: nonce,
            range: result.as_ref().ok().copied(),
        }
        .message();
        // The result is ours already: a paused rendezvous must not hold it for a reply
        // timeout. Unpublished, the members stop waiting at the lease and join again.
        let patience = self.rendezvous_patience();
        let finish = self.nodes[c.rv].finish(&self.key, nonce, message);
        let _ = self.ask(c.rv, "finish", deadline, patience, finish).await;
        // The leader's share is checked like a member's: offset 0 of the batch's range.
        match result.map(|range| (range, member_range(range, 0, n))) {
            Ok((_, Some(mine))) => Ok(mine),
            Ok((range, None)) => {
                tracing::error!(
                    ?range,
                    n,
                    "batch range does not hold the leader's share; own round instead"
                );
                self.own_rounds(n, deadline, started, None).await
            }
            Err(e) => Err(e),
        }
    }

    /// One rendezvous call, given `patience` (and the deadline) to answer. A call that
    /// fails or times out marks the rendezvous failed: own rounds for a while.
    async fn ask<T>(
        &self,
        rv: usize,
        op: &'static str,
        deadline: Instant,
        patience: Duration,
        call: impl std::future::Future<Output = Result<T, NodeError>>,
    ) -> Result<T, Stop> {
        let until = deadline.min(Instant::now() + patience);
        let error = match tokio::time::timeout_at(until, call).await {
            Ok(Ok(value)) => return Ok(value),
            Err(_) if Instant::now() >= deadline => return Err(Stop::Deadline),
            Err(_) => format!("no reply within {patience:?}"),
            Ok(Err(e)) => format!("{e:?}"),
        };
        tracing::debug!(node = self.nodes[rv].addr(), op, %error, "rendezvous unavailable");
        self.rendezvous_failed(rv);
        Err(Stop::Unavailable)
    }
}

impl<N: Register + Rendezvous> IdSource for QuorumClient<N> {
    async fn next_ids(&self, n: u64) -> Result<IdRange, IdError> {
        self.next_ids_until(n, Instant::now() + self.deadline).await
    }
}

/// What `idctl check` found on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCheck {
    /// The node's address (never its password).
    pub addr: String,
    /// `Ok` with warnings (possibly none), or why the node is unusable.
    pub verdict: Result<Vec<String>, String>,
}

/// Checks every node (what `idctl check` runs), in parallel: reachable, a master, not the
/// same server as another node listed, durable. A master with replicas gets a warning.
///
/// `rediss://` nodes are reached as `tls` says.
///
/// # Errors
/// A URL that cannot be parsed, or unusable TLS settings.
pub async fn check_nodes(
    urls: &[String],
    connect_timeout: Duration,
    reply_timeout: Duration,
    tls: &TlsConfig,
) -> Result<Vec<NodeCheck>, IdError> {
    tls.load()
        .map_err(|e| IdError::Config(format!("TLS: {e}")))?;
    let mut nodes = Vec::new();
    for url in urls {
        nodes.push(
            Node::with_tls(url.trim(), connect_timeout, reply_timeout, true, tls)
                .map_err(|e| IdError::Config(format!("bad node URL: {e}")))?,
        );
    }
    let results = futures::future::join_all(nodes.iter().map(|n| n.inspect())).await;
    let mut servers: Vec<(&str, String)> = Vec::new();
    let mut checks = Vec::new();
    for (node, result) in nodes.iter().zip(results) {
        let verdict = match result {
            Ok(Identity {
                run_id, replicas, ..
            }) => match servers.iter().find(|(_, r)| *r == run_id) {
                Some((other, _)) => Err(format!(
                    "DUPLICATE: the same Redis server as {other} (run_id {run_id}): list each server once"
                )),
                None => {
                    servers.push((node.addr(), run_id));
                    Ok(if replicas > 0 {
                        vec![format!("WARNING: {replicas} connected replica(s): a failover to an asynchronous replica can lose acknowledged writes, and with them the order of IDs")]
                    } else {
                        Vec::new()
                    })
                }
            },
            Err(NodeError::Unsafe(reason)) => Err(format!("UNSAFE: {reason}")),
            Err(NodeError::NotIndependent(reason)) => Err(format!("REFUSED: it {reason}")),
            Err(NodeError::Unavailable(reason) | NodeError::BadValue(reason)) => {
                Err(format!("UNREACHABLE: {reason}"))
            }
        };
        checks.push(NodeCheck {
            addr: node.addr().to_string(),
            verdict,
        });
    }
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(addr: &str, reason: &str) -> NodeFailure {
        NodeFailure {
            addr: addr.into(),
            reason: reason.into(),
        }
    }

    /// A last round cut by the deadline keeps the cause the rounds before it saw.
    #[test]
    fn a_round_cut_by_the_deadline_keeps_the_earlier_cause() {
        let earlier = [
            failure("a", "the Redis ACL of this user denies it"),
            failure("b", CUT_BY_DEADLINE),
        ];
        let last = RoundLoss::Unreachable {
            reachable: 1,
            accepted: None,
            failures: vec![
                failure("a", CUT_BY_DEADLINE),
                failure("b", CUT_BY_DEADLINE),
                failure("c", "connection refused"),
            ],
        };
        let RoundLoss::Unreachable { failures, .. } = with_earlier_causes(last, &earlier) else {
            panic!("still unreachable");
        };
        let reasons: Vec<&str> = failures.iter().map(|f| f.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "the Redis ACL of this user denies it (the last round: no reply before the deadline)",
                CUT_BY_DEADLINE,
                "connection refused",
            ]
        );
        let contention = RoundLoss::Contention { all_rejected: true };
        assert!(matches!(
            with_earlier_causes(contention, &earlier),
            RoundLoss::Contention { all_rejected: true }
        ));
    }

    /// A node that refuses every connection at once, never answers, or accepts every
    /// write.
    struct Down {
        addr: String,
        silent: bool,
        accepts: bool,
    }

    impl Register for Down {
        fn addr(&self) -> &str {
            &self.addr
        }

        async fn conditional_write(
            &self,
            _key: &str,
            _lo: u64,
            _hi: u64,
            _batch: Option<Nonce>,
        ) -> Result<Written, NodeError> {
            if self.silent {
                std::future::pending::<()>().await;
            }
            if self.accepts {
                return Ok(Written {
                    reply: WriteReply::Accepted,
                    combining: false,
                });
            }
            Err(NodeError::Unavailable("connection refused".to_string()))
        }

        async fn read(&self, _key: &str) -> Result<u64, NodeError> {
            Err(NodeError::Unavailable("connection refused".to_string()))
        }

        async fn warm_up(&self) -> Result<(), NodeError> {
            Ok(())
        }
    }

    /// A write round lost as soon as three of five nodes refused counts the two silent
    /// ones as neither answered nor failed: "0 of 5 nodes answered", not "2 of 5".
    #[tokio::test(start_paused = true)]
    async fn a_lost_write_round_counts_only_the_nodes_that_answered() {
        let nodes = (0..5)
            .map(|i| Down {
                addr: format!("fake://{i}"),
                silent: i >= 3,
                accepts: false,
            })
            .collect();
        let client = QuorumClient::with_nodes(nodes, "k", Protocol::Fast, Duration::from_secs(5))
            .expect("five nodes");
        let err = client
            .reserve(1, 1, Instant::now() + Duration::from_secs(5))
            .await
            .expect_err("three of five nodes down");
        assert_eq!(
            err.to_string(),
            "no quorum: 0 of 5 nodes answered, 0 accepted, 3 needed; 5 did not (failed: fake://0: connection refused; fake://1: connection refused; fake://2: connection refused; 2 not asked, or not waited for)"
        );
    }

    /// A write round lost to unreachable nodes says how many of the nodes that answered
    /// accepted, beside how many answered and how many were needed.
    #[tokio::test(start_paused = true)]
    async fn a_lost_write_round_says_how_many_accepted() {
        // Node 0 accepts, nodes 1-3 refuse, node 4 never answers.
        let nodes = (0..5)
            .map(|i| Down {
                addr: format!("fake://{i}"),
                silent: i == 4,
                accepts: i == 0,
            })
            .collect();
        let client = QuorumClient::with_nodes(nodes, "k", Protocol::Fast, Duration::from_secs(5))
            .expect("five nodes");
        let err = client
            .reserve(1, 1, Instant::now() + Duration::from_secs(5))
            .await
            .expect_err("three of five nodes down");
        assert!(
            matches!(
                err,
                IdError::NoQuorum {
                    needed: 3,
                    reachable: 1,
                    accepted: Some(1),
                    total: 5,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "no quorum: 1 of 5 nodes answered, 1 accepted, 3 needed; 4 did not (failed: fake://1: connection refused; fake://2: connection refused; fake://3: connection refused; 1 not asked, or not waited for)"
        );
    }

    fn tally(accepts: usize, rejects: usize, failures: usize) -> Tally {
        Tally {
            accepts,
            rejects,
            failures,
            max_seen: 0,
        }
    }

    #[test]
    fn majority_of_accepts_wins() {
        assert_eq!(decide(5, &tally(3, 0, 0)), Decision::Won);
        assert_eq!(decide(5, &tally(3, 2, 0)), Decision::Won);
        assert_eq!(decide(3, &tally(2, 0, 1)), Decision::Won);
        assert_eq!(decide(1, &tally(1, 0, 0)), Decision::Won);
    }

    #[test]
    fn round_is_lost_once_a_majority_cannot_accept() {
        assert_eq!(decide(5, &tally(0, 3, 0)), Decision::Lost);
        assert_eq!(decide(5, &tally(2, 2, 1)), Decision::Lost);
        assert_eq!(decide(5, &tally(0, 0, 3)), Decision::Lost);
        assert_eq!(decide(3, &tally(1, 1, 1)), Decision::Lost);
    }

    #[test]
    fn undecided_until_certain() {
        assert_eq!(decide(5, &tally(2, 2, 0)), Decision::Pending);
        assert_eq!(decide(5, &tally(0, 2, 0)), Decision::Pending);
        assert_eq!(decide(5, &tally(2, 0, 2)), Decision::Pending);
    }
}

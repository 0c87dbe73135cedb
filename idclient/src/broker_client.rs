//! The broker client: IDs from one or more `idbroker`s, with failover.
//!
//! [`BrokerClient`] multiplexes any number of concurrent callers over a few TCP
//! connections (requests are pipelined, matched to replies by request id, and written in
//! batches by one writer task per connection). Connections are idproto's framed
//! connection ([`idproto::framed`]), the one the broker uses: a broker that leaves a
//! reply half-sent (frame timeout) or stops reading requests (write timeout) breaks the
//! connection, like a close does. It holds a list of brokers: when a
//! connection breaks it reconnects to the next broker and resends, within the caller's
//! deadline. That is the ONLY retry here: quorum trouble is retried by the broker, and
//! its typed error is returned as is (DESIGN.md: one retrying layer).
//!
//! Leaders: window-serving brokers elect one leader; the others answer every request
//! with a redirect naming it (its advertised address; the request was not started: no
//! ID was reserved). The client then sends it, and moves its connections, to that
//! broker, whether or not it is in the list: one address (a DNS name, a load balancer,
//! a Kubernetes Service, any one broker) is enough to reach the leader, as with etcd's
//! or TiKV PD's clients. A leader not in the list is remembered (at most
//! [`MAX_LEARNED`] such addresses) so the client's connections go to it and stay there,
//! pooled like any other; it is reached with the same token and TLS settings, its
//! certificate checked for the redirect's host (or the pinned server name). When it
//! fails, the client goes back to its own list, whose brokers name the next leader.
//! With [`BrokerClientConfig::closed_list`] the client never leaves its list: a leader
//! outside it is an error (and the client moves on to the next broker of the list).
//! "No leader known" (an election under way) moves on to the next broker.
//!
//! Redirects are bounded: one request follows at most [`MAX_REDIRECTS`] of them, then
//! fails with the addresses it was sent through, so brokers that disagree about the
//! leader, or a leader advertising a wrong address (one that leads to a follower), cost
//! a few connections per request instead of a storm until the deadline. Redirects also
//! count as failovers for the pause between tries; a caller still waiting at its
//! deadline gets [`IdError::BrokersUnavailable`] listing what each broker said.
//!
//! Never returning an ID twice: a request whose connection broke has an unknown outcome
//! (the broker may have reserved IDs for it); it is resent as a new request, and the old
//! one's reply can never arrive because its connection is gone. A request abandoned at
//! its deadline is removed from the pending table first, so a late reply finds no taker
//! and is dropped. Either way the first request's IDs, if any, become a hole.
//!
//! Coalescing (as TiKV's client batches timestamp requests): a client keeps at most
//! [`BrokerClientConfig::in_flight`] wire requests out. Callers that arrive while all are
//! out wait in one queue; when a request comes back, every caller waiting goes out as ONE
//! request for their total count (at most the broker's `max_count`, else the rest waits
//! for the next), and its range is split among them in queue order. This keeps the
//! guarantee: a coalesced request is sent only after every caller in it invoked, so the
//! range it gets lies above every ID returned before any of them invoked, exactly as if
//! each had sent its own request at that moment. Each caller keeps its own deadline: the
//! wire request carries the latest one; a caller whose deadline passes first is answered
//! [`IdError::Deadline`] then, and its share, should the reply come later, is burned (a
//! hole). A failed request's error goes to each of its callers; failover and resending
//! happen per wire request, as for a single caller.

use crate::backoff::Backoff;
use crate::broker_tls::{self, BrokerTls, ReadHalf, WriteHalf};
use crate::{IdError, IdRange, IdSource};
use idproto::auth::Token;
use idproto::framed::{self, FrameReader, FrameWriter, Timeouts};
use idproto::wire::{self, BrokerStats, ClientMsg, ServerMsg, WireError};
use idproto::NodeFailure;
use std::collections::HashMap;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::time::{timeout_at, Instant};

/// Default total time one `next_ids` call may take, failovers included.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// Default time to open a connection and finish the handshake with one broker. Short:
/// a broker that does not answer promptly is skipped for the next one.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Default number of connections. One pipelined connection carries 100k+ requests/s;
/// a second spreads the decoding over both of the broker's threads.
pub const DEFAULT_CONNECTIONS: usize = 2;

/// Default number of wire requests a client keeps out while coalescing: one. A window
/// broker pipelines confirmations itself (`idbroker --pipeline`), so a second request out
/// buys little latency, and one request carrying every waiting caller costs the client,
/// the broker and the nodes the least per ID: at 1, 16, 64 and 256 callers, 1 beat 2 and
/// 4 in IDs/s and in p50 (BENCHMARKS.md, "Pipelined confirmations").
pub const DEFAULT_IN_FLIGHT: usize = 1;

/// Callers waiting to be coalesced or answered. Beyond it callers wait (within their
/// deadline) to join the queue, so a stalled broker cannot make the client queue without
/// bound.
const COALESCE_QUEUE: usize = 1 << 16;

/// Most times a finished request yields to the runtime before freeing its slot, while
/// the callers it answered keep queueing again (see `dispatch`).
const HANDOFF_YIELDS: usize = 16;

/// Most callers in one coalesced request: bounds the work of splitting one reply.
const MAX_COALESCED: usize = 4096;

/// Requests waiting for a connection's writer. Callers wait (within their deadline)
/// when it is full, so a stalled broker cannot make the client queue without bound.
const WRITE_QUEUE: usize = 4096;

/// A slot whose connection could not be opened while another slot's was usable is not
/// tried again before this long: meanwhile its callers use the connections there are
/// (a broker at its connection cap refuses the extra one), and no caller pays for a
/// doomed connect on every call.
const SLOT_RETRY: Duration = Duration::from_secs(1);

/// Pause after every broker refused a connection (jittered, doubling up to
/// [`MAX_RECONNECT_PAUSE`]), so a client does not spin while all brokers restart.
const RECONNECT_PAUSE_BASE: Duration = Duration::from_millis(10);
const MAX_RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// Part of the remaining time NOT passed to the broker as the request's deadline (at
/// most [`MAX_MARGIN`]), so the broker's typed answer ("no quorum") arrives before the
/// client's own timer fires.
const MARGIN_DIVISOR: u32 = 20;
const MAX_MARGIN: Duration = Duration::from_millis(100);

/// Most redirects one request follows (each to the leader a broker named): enough for a
/// stale follower, then the broker it named, to lead the way to a new leader. Beyond
/// it the brokers disagree or one advertises a wrong address: more redirects would only
/// open connections (issue #23, finding 6).
pub const MAX_REDIRECTS: usize = 3;

/// Most leader addresses outside the list a client remembers (the oldest is replaced):
/// bounds what brokers naming ever new leaders can make it keep.
pub const MAX_LEARNED: usize = 8;

/// Time allowed for [`fetch_stats`] as a whole.
pub const STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// Configuration of a [`BrokerClient`].
#[derive(Debug, Clone)]
pub struct BrokerClientConfig {
    /// Total time one `next_ids` call may take, reconnects and failovers included.
    pub deadline: Duration,
    /// Time to connect and handshake with one broker before trying the next.
    pub connect_timeout: Duration,
    /// Connections kept open (all to the preferred broker; callers are spread over them).
    pub connections: usize,
    /// Seeds the jitter of failover and reconnect pauses, so a simulation replays
    /// exactly; `None` (the default) uses the thread RNG.
    pub jitter_seed: Option<u64>,
    /// How long a reply may take from its first byte to its last before the connection
    /// counts as broken (default [`framed::FRAME_TIMEOUT`]).
    pub frame_timeout: Duration,
    /// How long a write of requests may block before the connection counts as broken
    /// (default [`framed::WRITE_TIMEOUT`]).
    pub write_timeout: Duration,
    /// Wire requests out at once (default [`DEFAULT_IN_FLIGHT`]): callers that arrive
    /// while all are out go together as one request (see the module docs). 0 turns
    /// coalescing off: every call is its own request, sent at once.
    pub in_flight: usize,
    /// The brokers' shared secret (their `--auth-token-file`), sent in every Hello;
    /// `None` sends none. Its `Debug` never shows it.
    pub token: Option<Token>,
    /// TLS to brokers that listen with it (`idbroker --listen-tls-cert`); `None`: plain
    /// TCP. Set it whenever a token is: otherwise the token travels in clear text.
    pub tls: Option<BrokerTls>,
    /// Never connect to a broker outside the list (`--broker-closed-list`): a redirect
    /// to a leader not in it is an error instead of followed. Default `false`: follow
    /// it, with the same token and TLS settings (over plain TCP that sends the token to
    /// whatever address a broker names; TLS checks the target's certificate).
    pub closed_list: bool,
}

impl BrokerClientConfig {
    fn timeouts(&self) -> Timeouts {
        Timeouts {
            frame: self.frame_timeout,
            write: self.write_timeout,
        }
    }
}

impl Default for BrokerClientConfig {
    fn default() -> BrokerClientConfig {
        BrokerClientConfig {
            deadline: DEFAULT_DEADLINE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            connections: DEFAULT_CONNECTIONS,
            jitter_seed: None,
            frame_timeout: framed::FRAME_TIMEOUT,
            write_timeout: framed::WRITE_TIMEOUT,
            in_flight: DEFAULT_IN_FLIGHT,
            token: None,
            tls: None,
            closed_list: false,
        }
    }
}

/// A reply routed to a waiting caller.
enum Reply {
    Msg(ServerMsg),
    /// The connection broke before the reply came: outcome unknown.
    Lost(String),
}

#[derive(Default)]
struct PendingTable {
    waiting: HashMap<u64, oneshot::Sender<Reply>>,
    /// Set once: the connection is unusable, and why.
    broken: Option<String>,
    /// It broke with no caller waiting (e.g. the broker closed it for idleness): no
    /// reason to think the broker is in trouble.
    quiet: bool,
}

/// State shared by a connection's handle, its reader and its writer.
struct Shared {
    addr: String,
    pending: Mutex<PendingTable>,
    /// True once broken: stops the reader and the writer.
    dead: watch::Sender<bool>,
    /// The broker is shutting down or is not the leader: send it nothing new, let what
    /// it owes arrive.
    draining: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn table(&self) -> MutexGuard<'_, PendingTable> {
        // A panic while holding this lock leaves the table consistent (plain inserts
        // and removes), so a poisoned lock is still usable.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the connection broken and tells every waiting caller (once).
    fn fail(&self, reason: String) {
        let waiting = {
            let mut table = self.table();
            if table.broken.is_some() {
                return;
            }
            table.broken = Some(reason.clone());
            table.quiet = table.waiting.is_empty();
            std::mem::take(&mut table.waiting)
        };
        if !waiting.is_empty() {
            tracing::debug!(broker = %self.addr, waiting = waiting.len(), "connection lost: {reason}");
        }
        for (_, tx) in waiting {
            let _ = tx.send(Reply::Lost(reason.clone()));
        }
        self.dead.send_replace(true);
    }

    fn usable(&self) -> bool {
        !self.draining.load(Relaxed) && self.table().broken.is_none()
    }

    /// Closed for a reason that says nothing bad about the broker.
    fn closed_quietly(&self) -> bool {
        !self.draining.load(Relaxed) && self.table().quiet
    }
}

/// One open connection to one broker.
struct Conn {
    broker: usize,
    shared: Arc<Shared>,
    tx: mpsc::Sender<ClientMsg>,
    max_count: u64,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // The last handle is gone: close the socket (stops reader and writer).
        self.shared
            .fail("connection closed by the client".to_string());
    }
}

/// What one attempt on one connection came to.
enum Attempt {
    Done(Result<IdRange, IdError>),
    /// Safe to send elsewhere: the connection broke, or the broker refused to start it.
    Failover(NodeFailure),
    /// The broker is not the leader and did not start the request: send it to `leader`
    /// (`None`: no leader known, an election is under way).
    Redirect {
        from: String,
        leader: Option<String>,
    },
}

/// One of the client's connections: callers are spread over the slots.
#[derive(Default)]
struct Slot {
    /// Held while (re)connecting the slot: one caller connects, others wait or use
    /// another slot's connection.
    connecting: tokio::sync::Mutex<()>,
    /// Never held across an await.
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    conn: Option<Arc<Conn>>,
    /// Opening failed while another slot was usable: do not try before then.
    retry_at: Option<Instant>,
}

impl Slot {
    fn state(&self) -> MutexGuard<'_, SlotState> {
        // Plain field updates: a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn usable(&self) -> Option<Arc<Conn>> {
        self.state()
            .conn
            .as_ref()
            .filter(|c| c.shared.usable())
            .cloned()
    }
}

/// Leader addresses outside the list that brokers redirected the client to: a ring of
/// at most [`MAX_LEARNED`], so the index of an address (`addrs.len() + i`) stays valid
/// for as long as a connection to it may live.
#[derive(Default)]
struct Learned {
    addrs: Vec<String>,
    /// The entry replaced next once the ring is full.
    next: usize,
    /// Where a pass goes on when the learned leader cannot be reached: the broker of the
    /// list after the one that redirected there (as if the redirect had not been
    /// followed, so a leader listed under another name is still found).
    fallback: usize,
}

struct Inner {
    /// The configured brokers (`--broker`), in failover order.
    addrs: Vec<String>,
    /// Leaders outside `addrs` (index `addrs.len() + i`); never tried in failover.
    learned: Mutex<Learned>,
    config: BrokerClientConfig,
    slots: Vec<Slot>,
    next_slot: AtomicUsize,
    /// The broker new connections go to first; moves on when one fails.
    preferred: AtomicUsize,
    next_request: AtomicU64,
    /// Pauses between failovers of one request.
    failover_backoff: Backoff,
    /// Pauses between passes over brokers that all refused to connect.
    reconnect_backoff: Backoff,
    /// The `max_count` of the broker connected last: the most one coalesced request asks.
    max_count: AtomicU64,
    /// Wire requests sent by the coalescing path, and callers they carried.
    wire_requests: AtomicU64,
    wire_callers: AtomicU64,
}

/// What coalescing did so far ([`BrokerClient::coalescing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Coalescing {
    /// Wire requests sent for coalesced callers (each for one or more callers).
    pub requests: u64,
    /// Callers answered through them: `callers / requests` is the mean per request.
    pub callers: u64,
}

/// A caller waiting in the coalescing queue. The dispatcher owns it from the queue on:
/// it either takes it into a request or answers it at its deadline. `_room` is the
/// caller's place in the queue's bound, given back when the waiter is answered.
struct Waiter {
    n: u64,
    invoked: Instant,
    deadline: Instant,
    tx: oneshot::Sender<Result<IdRange, IdError>>,
    _room: OwnedSemaphorePermit,
}

impl Waiter {
    /// False if its caller is gone (its future was dropped): asking IDs for it would
    /// only burn them.
    fn wanted(&self) -> bool {
        !self.tx.is_closed()
    }

    fn expired(&self) -> IdError {
        deadline_error(self.invoked, self.deadline)
    }

    /// Answers `Deadline`: no request took it, so no ID of its exists anywhere.
    fn expire(self) {
        let expired = self.expired();
        let _ = self.tx.send(Err(expired));
    }
}

/// A caller's own deadline passed before its request was answered.
fn deadline_error(invoked: Instant, deadline: Instant) -> IdError {
    IdError::Deadline {
        deadline: deadline.saturating_duration_since(invoked),
        rounds: 0,
    }
}

/// A client of one or more `idbroker`s. Cheap to share: wrap it in an `Arc`, or clone it
/// (clones share connections).
#[derive(Clone)]
pub struct BrokerClient {
    inner: Arc<Inner>,
    /// The coalescing queue (`None` with `in_flight` 0). Its dispatcher ends when the
    /// last clone of the client is dropped.
    queue: Option<Arc<Queue>>,
}

impl std::fmt::Debug for BrokerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerClient")
            .field("addrs", &self.inner.addrs)
            .finish_non_exhaustive()
    }
}

impl BrokerClient {
    /// Connects to the first broker of `addrs` (`host:port`) that answers, trying them
    /// in order. More connections are opened on demand.
    ///
    /// # Errors
    /// [`IdError::Config`] for an empty list or zero connections;
    /// [`IdError::BrokersUnavailable`] if no broker completes a handshake within
    /// `config.deadline` (a broker speaking another protocol version counts as failed).
    pub async fn connect(
        addrs: Vec<String>,
        config: BrokerClientConfig,
    ) -> Result<BrokerClient, IdError> {
        let addrs: Vec<String> = addrs
            .into_iter()
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
        if addrs.is_empty() {
            return Err(IdError::Config("no broker address given".into()));
        }
        if config.connections == 0 {
            return Err(IdError::Config(
                "a broker client needs at least one connection".into(),
            ));
        }
        let slots = (0..config.connections).map(|_| Slot::default()).collect();
        let mut failover_backoff = Backoff::new(FAILOVER_PAUSE_CAP);
        let mut reconnect_backoff = Backoff::new(MAX_RECONNECT_PAUSE);
        if let Some(seed) = config.jitter_seed {
            failover_backoff = failover_backoff.seeded(seed);
            reconnect_backoff = reconnect_backoff.seeded(seed.wrapping_add(1));
        }
        let client = BrokerClient {
            inner: Arc::new(Inner {
                addrs,
                learned: Mutex::new(Learned::default()),
                config,
                slots,
                next_slot: AtomicUsize::new(0),
                preferred: AtomicUsize::new(0),
                next_request: AtomicU64::new(1),
                failover_backoff,
                reconnect_backoff,
                max_count: AtomicU64::new(0),
                wire_requests: AtomicU64::new(0),
                wire_callers: AtomicU64::new(0),
            }),
            queue: None,
        };
        let deadline = Instant::now() + client.inner.config.deadline;
        let mut failures = Vec::new();
        client.inner.conn(0, deadline, &mut failures).await?;
        let in_flight = client.inner.config.in_flight;
        if in_flight == 0 {
            return Ok(client);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let room = Arc::new(Semaphore::new(COALESCE_QUEUE));
        tokio::spawn(dispatch(client.inner.clone(), rx, room.clone(), in_flight));
        let queue = Queue { tx, room };
        Ok(BrokerClient {
            queue: Some(Arc::new(queue)),
            ..client
        })
    }

    /// What coalescing did so far.
    pub fn coalescing(&self) -> Coalescing {
        Coalescing {
            requests: self.inner.wire_requests.load(Relaxed),
            callers: self.inner.wire_callers.load(Relaxed),
        }
    }

    /// The broker addresses, in failover order.
    pub fn addrs(&self) -> &[String] {
        &self.inner.addrs
    }

    /// Leader addresses outside [`BrokerClient::addrs`] that brokers redirected the
    /// client to (empty with [`BrokerClientConfig::closed_list`]).
    pub fn learned(&self) -> Vec<String> {
        self.inner.learned().addrs.clone()
    }

    /// Reserves `n` IDs, giving up at `deadline`.
    ///
    /// # Errors
    /// As [`IdSource::next_ids`]; [`IdError::BrokersUnavailable`] when no broker could
    /// be reached (or none replied) before the deadline.
    pub async fn next_ids_until(&self, n: u64, deadline: Instant) -> Result<IdRange, IdError> {
        self.next_ids_between(n, Instant::now(), deadline).await
    }

    /// [`BrokerClient::next_ids_until`] for a caller that invoked at `invoked` (read
    /// once by `next_ids`: clock reads were a tenth of a busy client's CPU).
    async fn next_ids_between(
        &self,
        n: u64,
        invoked: Instant,
        deadline: Instant,
    ) -> Result<IdRange, IdError> {
        if n == 0 {
            return Err(IdError::BadRequest("count must be at least 1".into()));
        }
        let max_count = self.inner.max_count.load(Relaxed);
        if n > max_count {
            return Err(too_many(n, max_count));
        }
        match &self.queue {
            Some(queue) => coalesced(queue, n, invoked, deadline).await,
            None => self.inner.request(n, deadline).await,
        }
    }
}

fn too_many(n: u64, max_count: u64) -> IdError {
    IdError::BadRequest(format!(
        "count {n} exceeds the broker's limit of {max_count}"
    ))
}

/// One caller through the coalescing queue: queued, then answered by the request that
/// took it, or with [`IdError::Deadline`] by the dispatcher at `deadline` if none took it
/// by then. The caller holds no timer of its own (one per caller was a tenth of a
/// busy client's CPU): the dispatcher watches every queued deadline with one.
async fn coalesced(
    queue: &Queue,
    n: u64,
    invoked: Instant,
    deadline: Instant,
) -> Result<IdRange, IdError> {
    let stopped = || IdError::BrokersUnavailable {
        failures: vec![NodeFailure {
            addr: "broker client".into(),
            reason: "the client's dispatcher stopped".into(),
        }],
    };
    // The queue has room but under floods: only then does joining it need a timer.
    let room = match queue.room.clone().try_acquire_owned() {
        Ok(room) => room,
        Err(TryAcquireError::Closed) => return Err(stopped()),
        Err(TryAcquireError::NoPermits) => {
            match timeout_at(deadline, queue.room.clone().acquire_owned()).await {
                Err(_) => return Err(deadline_error(invoked, deadline)),
                Ok(Err(_)) => return Err(stopped()),
                Ok(Ok(room)) => room,
            }
        }
    };
    let (tx, rx) = oneshot::channel();
    let waiter = Waiter {
        n,
        invoked,
        deadline,
        tx,
        _room: room,
    };
    if queue.tx.send(waiter).is_err() {
        return Err(stopped());
    }
    rx.await.unwrap_or_else(|_| Err(stopped()))
}

/// The coalescing queue's sending side: callers join it while `room` has a permit.
struct Queue {
    tx: mpsc::UnboundedSender<Waiter>,
    room: Arc<Semaphore>,
}

/// Callers queued in the dispatcher, oldest first, with a lower bound of their deadlines
/// and the one timer that answers them at their deadlines.
struct Pending {
    waiters: VecDeque<Waiter>,
    /// No queued deadline comes before it (it may be stale: a lower bound).
    earliest: Option<Instant>,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl Pending {
    fn new() -> Pending {
        Pending {
            waiters: VecDeque::new(),
            earliest: None,
            timer: Box::pin(tokio::time::sleep_until(Instant::now())),
        }
    }

    fn push(&mut self, w: Waiter) {
        if self.earliest.is_none_or(|e| w.deadline < e) {
            self.earliest = Some(w.deadline);
            self.timer.as_mut().reset(w.deadline);
        }
        self.waiters.push_back(w);
    }

    /// The timer fired: answers every caller whose deadline passed, and sets the timer
    /// for the earliest deadline left.
    fn expire_due(&mut self) {
        let now = Instant::now();
        let (due, left): (VecDeque<Waiter>, VecDeque<Waiter>) =
            self.waiters.drain(..).partition(|w| w.deadline <= now);
        self.waiters = left;
        for w in due {
            w.expire();
        }
        self.earliest = self.waiters.iter().map(|w| w.deadline).min();
        if let Some(e) = self.earliest {
            self.timer.as_mut().reset(e);
        }
    }

    /// Every caller still wanted, oldest first, up to `max_count` IDs in all (a caller
    /// past its deadline is answered instead). Every caller taken has invoked already:
    /// the request goes out after it.
    fn take_batch(&mut self, max_count: u64) -> Vec<Waiter> {
        let now = Instant::now();
        let mut batch = Vec::new();
        let mut total = 0u64;
        while batch.len() < MAX_COALESCED {
            let Some(front) = self.waiters.front() else {
                break;
            };
            if !batch.is_empty() && total.saturating_add(front.n) > max_count {
                break;
            }
            let Some(w) = self.waiters.pop_front() else {
                break;
            };
            if !w.wanted() {
                continue;
            }
            if w.deadline <= now {
                w.expire();
                continue;
            }
            total += w.n;
            batch.push(w);
        }
        batch
    }
}

/// The coalescing dispatcher: with fewer than `in_flight` requests out, every caller
/// waiting goes out as one request; a caller still queued at its deadline is answered
/// then. Ends when every handle of the client is gone and every caller is answered.
async fn dispatch(
    inner: Arc<Inner>,
    mut queue: mpsc::UnboundedReceiver<Waiter>,
    room: Arc<Semaphore>,
    in_flight: usize,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    let mut slot = Box::pin(slots.clone().acquire_owned());
    let mut pending = Pending::new();
    let mut open = true;
    let mut out = tokio::task::JoinSet::new();
    while open || !pending.waiters.is_empty() {
        // Everyone queued by now joins the next request (callers answered by the last
        // one queue again while its task yields, before its slot is free).
        while let Ok(w) = queue.try_recv() {
            pending.push(w);
        }
        tokio::select! {
            biased;
            permit = &mut slot, if !pending.waiters.is_empty() => {
                slot.set(slots.clone().acquire_owned());
                let Ok(permit) = permit else { break };
                let batch = pending.take_batch(inner.max_count.load(Relaxed));
                if batch.is_empty() {
                    continue;
                }
                let inner = inner.clone();
                let room = room.clone();
                out.spawn(async move {
                    send_batch(&inner, batch).await;
                    // The callers just answered mostly call again at once: let them
                    // queue before the freed slot goes, or it leaves with the first of
                    // them alone and the rest wait a whole round for the next slot.
                    // Yield while they keep coming (each one joining takes room).
                    for _ in 0..HANDOFF_YIELDS {
                        let before = room.available_permits();
                        tokio::task::yield_now().await;
                        if room.available_permits() >= before {
                            break;
                        }
                    }
                    drop(permit);
                });
            }
            w = queue.recv(), if open => match w {
                Some(w) => pending.push(w),
                None => open = false,
            },
            () = pending.timer.as_mut(), if pending.earliest.is_some() => pending.expire_due(),
            Some(done) = out.join_next(), if !out.is_empty() => {
                if let Err(e) = done {
                    tracing::error!("a coalesced request's task failed: {e}");
                }
            }
            else => break,
        }
    }
    // Requests still out answer their callers; wait for them, then end.
    while let Some(done) = out.join_next().await {
        if let Err(e) = done {
            tracing::error!("a coalesced request's task failed: {e}");
        }
    }
}

/// Sends one request for the batch's total count, until its latest deadline, and
/// splits the range among its callers in queue order; callers whose own deadline comes
/// first are answered `Deadline` then (their shares become holes if it succeeds).
async fn send_batch(inner: &Inner, batch: Vec<Waiter>) {
    let total: u64 = batch.iter().map(|w| w.n).sum();
    let latest = batch.iter().map(|w| w.deadline).max();
    let Some(latest) = latest else { return };
    inner.wire_requests.fetch_add(1, Relaxed);
    inner.wire_callers.fetch_add(batch.len() as u64, Relaxed);
    let mut waiting: Vec<(u64, Option<Waiter>)> =
        batch.into_iter().map(|w| (w.n, Some(w))).collect();
    let work = inner.request(total, latest);
    tokio::pin!(work);
    let result = loop {
        let first_due = waiting
            .iter()
            .filter_map(|(_, w)| w.as_ref().map(|w| w.deadline))
            .filter(|d| *d < latest)
            .min();
        tokio::select! {
            r = &mut work => break r,
            _ = tokio::time::sleep_until(first_due.unwrap_or(latest)), if first_due.is_some() => {
                let now = Instant::now();
                for (_, slot) in waiting.iter_mut() {
                    if slot.as_ref().is_some_and(|w| w.deadline <= now) {
                        if let Some(w) = slot.take() {
                            let expired = w.expired();
                            let _ = w.tx.send(Err(expired));
                        }
                    }
                }
            }
        }
    };
    hand_out(waiting, result);
}

/// Splits `result` among the callers in queue order; the shares of callers already
/// answered (`None`) are skipped, never handed to anyone.
fn hand_out(waiting: Vec<(u64, Option<Waiter>)>, result: Result<IdRange, IdError>) {
    let mut offset = 0u64;
    for (n, slot) in waiting {
        let Some(w) = slot else {
            offset += n;
            continue;
        };
        let share = match &result {
            Ok(range) => {
                let lo = range.lo + offset;
                Ok(IdRange {
                    lo,
                    hi: lo + w.n - 1,
                })
            }
            Err(e) => Err(e.clone()),
        };
        offset += w.n;
        let _ = w.tx.send(share);
    }
}

impl Inner {
    /// One request for `n` IDs, failing over between brokers until `deadline`.
    async fn request(&self, n: u64, deadline: Instant) -> Result<IdRange, IdError> {
        let inner = self;
        let mut failures: Vec<NodeFailure> = Vec::new();
        let mut failovers: u32 = 0;
        // Redirects naming a leader that count: the first, then those from a broker an
        // earlier one named (a chain; who named whom, at most MAX_REDIRECTS + 1). A
        // follower naming a leader that cannot be reached (killed, its heartbeat not yet
        // expired) again and again is no chain: the request goes on, paced, until its
        // deadline or the next leader.
        let mut redirects: Vec<String> = Vec::new();
        let mut named: Vec<usize> = Vec::new();
        loop {
            let slot = inner.next_slot.fetch_add(1, Relaxed) % inner.slots.len();
            let conn = inner.conn(slot, deadline, &mut failures).await?;
            if n > conn.max_count {
                return Err(too_many(n, conn.max_count));
            }
            match inner.attempt(&conn, n, deadline).await {
                Attempt::Done(result) => return result,
                Attempt::Failover(failure) => {
                    tracing::debug!(broker = %failure.addr, "failing over: {}", failure.reason);
                    inner.move_on_from(conn.broker);
                    note(&mut failures, failure);
                }
                Attempt::Redirect { from, leader } => {
                    let chained = redirects.is_empty() || named.contains(&conn.broker);
                    if let (Some(l), true) = (&leader, chained) {
                        redirects.push(format!("{from} named {l}"));
                    }
                    let (said, target) = inner.follow(conn.broker, from, leader);
                    named.extend(target.filter(|t| !named.contains(t)));
                    note(&mut failures, said);
                    if redirects.len() > MAX_REDIRECTS {
                        failures.push(too_many_redirects(&redirects, target.is_some()));
                        return Err(unavailable(&failures));
                    }
                }
            }
            // The first failover or redirect goes at once (the next broker is likely
            // fine); after that, pause, so a broker that accepts and then drops every
            // request, or brokers that disagree on the leader, cannot pull callers into a
            // reconnect storm.
            failovers += 1;
            tokio::time::sleep_until(
                (Instant::now() + inner.failover_pause(failovers)).min(deadline),
            )
            .await;
        }
    }
}

/// First pause between failovers after the first one, doubling up to [`FAILOVER_PAUSE_CAP`].
pub const FAILOVER_PAUSE_BASE: Duration = Duration::from_millis(5);

/// Longest pause between two failovers of one request.
pub const FAILOVER_PAUSE_CAP: Duration = Duration::from_millis(200);

/// The request was redirected more than [`MAX_REDIRECTS`] times: `redirects` says
/// which broker named which leader, in order; `followed`: the last one was followed
/// (else the reason is the closed list, said by the broker's own entry).
fn too_many_redirects(redirects: &[String], followed: bool) -> NodeFailure {
    let hint = if followed {
        ": the brokers disagree about the leader, or a leader advertises an address that \
         does not reach it (check each idbroker's --advertise)"
    } else {
        ""
    };
    NodeFailure {
        addr: "broker client".into(),
        reason: format!(
            "redirected {} times in one request ({}), more than the {MAX_REDIRECTS} allowed{hint}",
            redirects.len(),
            redirects.join(", ")
        ),
    }
}

/// Records `failure`, keeping one entry per broker (the latest) so the list stays short.
fn note(failures: &mut Vec<NodeFailure>, failure: NodeFailure) {
    failures.retain(|f| f.addr != failure.addr);
    failures.push(failure);
}

/// Notes an attempt the request's deadline cut short: it says less than an earlier
/// failure of the same broker (a refused token, a refused connection), whose cause is
/// kept, with the cut said after it.
fn note_cut(failures: &mut Vec<NodeFailure>, failure: NodeFailure) {
    match failures.iter_mut().find(|f| f.addr == failure.addr) {
        Some(earlier) if !earlier.reason.contains("(the last attempt: ") => {
            earlier.reason = format!("{} (the last attempt: {})", earlier.reason, failure.reason);
        }
        Some(_) => {}
        None => failures.push(failure),
    }
}

impl Inner {
    /// None before the first failover of a request, then jittered and doubling from
    /// [`FAILOVER_PAUSE_BASE`] up to [`FAILOVER_PAUSE_CAP`].
    fn failover_pause(&self, failovers: u32) -> Duration {
        match failovers.checked_sub(2) {
            None => Duration::ZERO,
            Some(k) => self.failover_backoff.pause(FAILOVER_PAUSE_BASE, k),
        }
    }

    /// After broker `b` redirected a request: new connections go to the leader it named
    /// if that is one of our brokers (the same `host:port`, or the same socket address)
    /// or, unless the list is closed, wherever it is (remembered, see [`Learned`]); else
    /// to the broker after `b`. Returns what to note about `b`, and the broker the
    /// redirect was followed to (the leader it names), if it was.
    fn follow(
        &self,
        b: usize,
        from: String,
        leader: Option<String>,
    ) -> (NodeFailure, Option<usize>) {
        let target = leader.as_deref().and_then(|l| {
            self.index_of(l)
                .or_else(|| (!self.config.closed_list).then(|| self.learn(l, b)))
        });
        tracing::debug!(broker = %from, ?leader, found = target.is_some(), "redirected");
        match target {
            Some(t) => self.preferred.store(t, Relaxed),
            None => self.move_on_from(b),
        }
        let reason = match (&leader, target) {
            (None, _) => "not the leader; no leader known (election under way)".to_string(),
            (Some(l), Some(_)) => format!("not the leader; redirected to {l}"),
            (Some(l), None) => format!(
                "not the leader; the leader {l} is not among the --broker addresses \
                 (--broker-closed-list: add it to --broker, or drop --broker-closed-list \
                 to follow redirects)"
            ),
        };
        (NodeFailure { addr: from, reason }, target)
    }

    fn learned(&self) -> MutexGuard<'_, Learned> {
        // Plain field updates: a poisoned lock is still consistent.
        self.learned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers `addr`, a leader outside the list that broker `b` named; its index.
    fn learn(&self, addr: &str, b: usize) -> usize {
        let fallback = self.after(b); // Locks `learned` for a learned `b`: first.
        let mut learned = self.learned();
        learned.fallback = fallback;
        let i = if learned.addrs.len() < MAX_LEARNED {
            learned.addrs.push(addr.to_string());
            learned.addrs.len() - 1
        } else {
            let i = learned.next;
            learned.next = (i + 1) % MAX_LEARNED;
            learned.addrs[i] = addr.to_string();
            i
        };
        tracing::info!(leader = %addr, "following a redirect to a leader outside the broker list");
        self.addrs.len() + i
    }

    /// The address of broker `b`: one of the list, or a learned leader.
    fn addr_of(&self, b: usize) -> Option<String> {
        match b.checked_sub(self.addrs.len()) {
            None => self.addrs.get(b).cloned(),
            Some(i) => self.learned().addrs.get(i).cloned(),
        }
    }

    /// The index of the broker at `addr` (listed or learned): the same string, or the
    /// same socket address.
    fn index_of(&self, addr: &str) -> Option<usize> {
        let parsed = addr.parse::<std::net::SocketAddr>().ok();
        let same = |a: &String| {
            a == addr || parsed.is_some_and(|p| a.parse::<std::net::SocketAddr>().ok() == Some(p))
        };
        self.addrs.iter().position(same).or_else(|| {
            let learned = self.learned();
            let i = learned.addrs.iter().position(same)?;
            Some(self.addrs.len() + i)
        })
    }

    /// The broker of the list after broker `b`; after a learned leader, the one after
    /// the broker that redirected there (the list's brokers name the next leader).
    fn after(&self, b: usize) -> usize {
        if b < self.addrs.len() {
            (b + 1) % self.addrs.len()
        } else {
            self.learned().fallback
        }
    }

    /// After broker `b` failed, new connections start at the next one.
    fn move_on_from(&self, b: usize) {
        let next = self.after(b);
        let _ = self.preferred.compare_exchange(b, next, Relaxed, Relaxed);
    }

    /// The brokers one pass tries, in order: from the preferred one on through the list
    /// (a learned leader first, then the whole list from the one [`Inner::after`] it).
    fn pass_order(&self) -> Vec<usize> {
        let n = self.addrs.len();
        let p = self.preferred.load(Relaxed);
        let (first, from) = if p < n {
            (None, p)
        } else {
            (Some(p), self.after(p))
        };
        first
            .into_iter()
            .chain((0..n).map(|k| (from + k) % n))
            .collect()
    }

    /// A usable connection of any slot, starting after `slot`.
    fn any_usable(&self, slot: usize) -> Option<Arc<Conn>> {
        let n = self.slots.len();
        (1..=n).find_map(|k| self.slots[(slot + k) % n].usable())
    }

    /// A usable connection for a caller assigned `slot`: the slot's own, (re)connecting
    /// if needed (brokers tried from the preferred one on, with backoff after a full
    /// pass, until `deadline`). When the slot cannot be opened but another slot has a
    /// usable connection, that one is used: a client works with the connections it can
    /// get (e.g. when the broker is at its connection cap).
    async fn conn(
        &self,
        slot: usize,
        deadline: Instant,
        failures: &mut Vec<NodeFailure>,
    ) -> Result<Arc<Conn>, IdError> {
        let this = &self.slots[slot];
        if let Some(conn) = this.usable() {
            return Ok(conn);
        }
        if this.state().retry_at.is_some_and(|t| Instant::now() < t) {
            if let Some(conn) = self.any_usable(slot) {
                return Ok(conn);
            }
        }
        let _connecting = match this.connecting.try_lock() {
            Ok(g) => g,
            Err(_) => {
                // Someone is connecting this slot: do not queue behind them if there
                // is another connection to use.
                if let Some(conn) = self.any_usable(slot) {
                    return Ok(conn);
                }
                match timeout_at(deadline, this.connecting.lock()).await {
                    Ok(g) => g,
                    Err(_) => return Err(unavailable(failures)),
                }
            }
        };
        if let Some(conn) = self.retire(this) {
            return Ok(conn);
        }
        self.reconnect(slot, deadline, failures).await
    }

    /// With the slot's connecting lock held: the connection someone else opened
    /// meanwhile, or `None` after dropping the slot's broken one (moving on from its
    /// broker unless it closed quietly, like at the broker's idle timeout).
    fn retire(&self, this: &Slot) -> Option<Arc<Conn>> {
        let old = {
            let mut state = this.state();
            if let Some(conn) = state.conn.as_ref().filter(|c| c.shared.usable()) {
                return Some(conn.clone());
            }
            state.conn.take()
        };
        if let Some(old) = old {
            if !old.shared.closed_quietly() {
                self.move_on_from(old.broker);
            }
        }
        None
    }

    /// Opens a connection for `slot`, pass after pass over the brokers with backoff
    /// between passes, until `deadline`; meanwhile another slot's usable connection
    /// will do (and the slot is retried at most every [`SLOT_RETRY`]).
    async fn reconnect(
        &self,
        slot: usize,
        deadline: Instant,
        failures: &mut Vec<NodeFailure>,
    ) -> Result<Arc<Conn>, IdError> {
        let this = &self.slots[slot];
        let mut passes = 0;
        loop {
            let all_refused_token = match self.open_any(deadline, failures).await {
                Ok(conn) => {
                    let mut state = this.state();
                    state.conn = Some(conn.clone());
                    state.retry_at = None;
                    return Ok(conn);
                }
                Err(all_refused_token) => all_refused_token,
            };
            if let Some(conn) = self.any_usable(slot) {
                this.state().retry_at = Some(Instant::now() + SLOT_RETRY);
                return Ok(conn);
            }
            // A wrong or missing token fails at once, as redis-cli with a wrong password
            // does, instead of retrying until the deadline.
            let now = Instant::now();
            if now >= deadline || all_refused_token {
                return Err(unavailable(failures));
            }
            let pause = self.reconnect_backoff.pause(RECONNECT_PAUSE_BASE, passes);
            tokio::time::sleep_until(deadline.min(now + pause)).await;
            passes += 1;
        }
    }

    /// One pass over the brokers from the preferred one: the first connection that
    /// completes its handshake (before `deadline`), noting each failure. `Err(true)`:
    /// every broker refused the client's token, which no retry will change.
    async fn open_any(
        &self,
        deadline: Instant,
        failures: &mut Vec<NodeFailure>,
    ) -> Result<Arc<Conn>, bool> {
        let order = self.pass_order();
        let n = order.len();
        let mut refused = 0;
        for b in order {
            let now = Instant::now();
            if now >= deadline {
                return Err(false);
            }
            let until = deadline.min(now + self.config.connect_timeout);
            let Some(addr) = self.addr_of(b) else {
                continue; // A learned entry is never removed: cannot happen.
            };
            let addr = &addr;
            let failure = |reason| NodeFailure {
                addr: addr.clone(),
                reason,
            };
            match timeout_at(until, open(b, addr, &self.config)).await {
                Ok(Ok(conn)) => {
                    self.preferred.store(b, Relaxed);
                    self.max_count.store(conn.max_count, Relaxed);
                    return Ok(Arc::new(conn));
                }
                Ok(Err(e)) => {
                    refused += usize::from(refused_token(&e));
                    note(failures, failure(open_failure(e)));
                }
                Err(_) if until == deadline => note_cut(
                    failures,
                    failure(format!("no handshake within {:?}", until - now)),
                ),
                Err(_) => note(
                    failures,
                    failure(format!("no handshake within {:?}", until - now)),
                ),
            }
        }
        Err(refused == n)
    }

    /// Sends one request on `conn` and waits for its reply until `deadline`.
    async fn attempt(&self, conn: &Conn, n: u64, deadline: Instant) -> Attempt {
        let id = self.next_request.fetch_add(1, Relaxed);
        match exchange(conn, id, n, deadline).await {
            Ok(reply) => judge(&conn.shared, n, reply),
            Err(attempt) => attempt,
        }
    }
}

/// How the handshake error of a broker that refused the client's token (or its lack of
/// one) ends.
const TOKEN_REFUSED: &str = "refused the token";

/// True if `e` is a broker's refusal of the client's token.
fn refused_token(e: &IdError) -> bool {
    matches!(e, IdError::Protocol { reason, .. } if reason.ends_with(TOKEN_REFUSED))
}

/// Every broker failed: the error, with what each one did.
fn unavailable(failures: &[NodeFailure]) -> IdError {
    IdError::BrokersUnavailable {
        failures: failures.to_vec(),
    }
}

/// The request's outcome is unknown but no ID of it was returned: send it elsewhere.
fn lost(shared: &Shared, reason: String) -> Attempt {
    Attempt::Failover(NodeFailure {
        addr: shared.addr.clone(),
        reason,
    })
}

/// The deadline sent to the broker when `remaining` is left: a little less (see
/// [`MARGIN_DIVISOR`]), and at least 1 ms (0 would mean the broker's default).
fn broker_deadline_ms(remaining: Duration) -> u64 {
    let margin = (remaining / MARGIN_DIVISOR).min(MAX_MARGIN);
    u64::try_from((remaining - margin).as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Sends request `id` for `n` IDs on `conn` and waits for its reply until `deadline`.
/// `Err` is the attempt's end without a reply (lost, or timed out).
async fn exchange(conn: &Conn, id: u64, n: u64, deadline: Instant) -> Result<ServerMsg, Attempt> {
    let shared = &conn.shared;
    let (tx, rx) = oneshot::channel();
    {
        let mut table = shared.table();
        if let Some(reason) = &table.broken {
            return Err(lost(shared, reason.clone()));
        }
        table.waiting.insert(id, tx);
    }
    let remaining = deadline.saturating_duration_since(Instant::now());
    let msg = ClientMsg::NextIds {
        id,
        count: n,
        deadline_ms: broker_deadline_ms(remaining),
    };
    let timed_out = || {
        // Removed first: a late reply finds no taker (its IDs are burned).
        shared.table().waiting.remove(&id);
        Attempt::Done(Err(IdError::BrokersUnavailable {
            failures: vec![NodeFailure {
                addr: shared.addr.clone(),
                reason: format!("no reply within the deadline ({remaining:?})"),
            }],
        }))
    };
    match timeout_at(deadline, conn.tx.send(msg)).await {
        Err(_) => return Err(timed_out()),
        Ok(Err(_)) => {
            shared.table().waiting.remove(&id);
            return Err(lost(shared, "connection writer stopped".into()));
        }
        Ok(Ok(())) => {}
    }
    match timeout_at(deadline, rx).await {
        Err(_) => Err(timed_out()),
        Ok(Err(_)) => Err(lost(shared, "connection dropped the request".into())),
        Ok(Ok(Reply::Lost(reason))) => Err(lost(shared, reason)),
        Ok(Ok(Reply::Msg(msg))) => Ok(msg),
    }
}

/// What the broker's reply to a request for `n` IDs comes to.
fn judge(shared: &Shared, n: u64, reply: ServerMsg) -> Attempt {
    match reply {
        ServerMsg::Ids { lo, hi, .. } if (IdRange { lo, hi }).holds_exactly(n) => {
            Attempt::Done(Ok(IdRange { lo, hi }))
        }
        ServerMsg::Failed {
            error: IdError::BrokersUnavailable { failures },
            ..
        } => {
            // The broker is shutting down and never started this request.
            shared.draining.store(true, Relaxed);
            let reason = failures
                .first()
                .map_or_else(|| "broker unavailable".to_string(), |f| f.reason.clone());
            lost(shared, reason)
        }
        ServerMsg::Failed { error, .. } => Attempt::Done(Err(error)),
        ServerMsg::Redirect { leader, .. } => {
            // A follower: it started nothing for this request, and gets nothing new.
            shared.draining.store(true, Relaxed);
            Attempt::Redirect {
                from: shared.addr.clone(),
                leader,
            }
        }
        other => {
            let reason = format!("unexpected reply to a request for {n} IDs: {other:?}");
            shared.fail(reason.clone());
            Attempt::Done(Err(IdError::Protocol {
                addr: shared.addr.clone(),
                reason,
            }))
        }
    }
}

impl IdSource for BrokerClient {
    async fn next_ids(&self, n: u64) -> Result<IdRange, IdError> {
        let invoked = Instant::now();
        self.next_ids_between(n, invoked, invoked + self.inner.config.deadline)
            .await
    }
}

/// What a [`WireError`] on the connection to `addr` means to a caller: the broker is
/// unreachable (I/O, timeouts), or it broke the protocol (anything else).
fn wire_error(addr: &str, e: WireError) -> IdError {
    let unreachable = |reason: String| IdError::BrokersUnavailable {
        failures: vec![NodeFailure {
            addr: addr.to_string(),
            reason,
        }],
    };
    match e {
        WireError::Io(e) => unreachable(broker_tls::describe(&e)),
        e @ (WireError::FrameTimeout(_) | WireError::WriteTimeout(_)) => unreachable(e.to_string()),
        e => IdError::Protocol {
            addr: addr.to_string(),
            reason: e.to_string(),
        },
    }
}

/// Why opening a connection to one broker failed, without the broker's address (the
/// failure list names it): its own reason, not an error that wraps it again.
fn open_failure(e: IdError) -> String {
    match e {
        IdError::BrokersUnavailable { mut failures } if failures.len() == 1 => {
            failures.remove(0).reason
        }
        IdError::Protocol { reason, .. } => format!("protocol error: {reason}"),
        e => e.to_string(),
    }
}

/// A framed connection to `addr` after the handshake, and the broker's `max_count`.
type Handshaken = (FrameReader<ReadHalf>, FrameWriter<WriteHalf>, u64);

/// Connects (over TLS with `tls`) and handshakes; returns the framed connection and the
/// broker's `max_count`.
async fn handshake(
    addr: &str,
    timeouts: Timeouts,
    token: Option<&Token>,
    tls: Option<&BrokerTls>,
) -> Result<Handshaken, IdError> {
    let io = |e: std::io::Error| wire_error(addr, WireError::Io(e));
    let protocol = |reason: String| IdError::Protocol {
        addr: addr.to_string(),
        reason,
    };
    let stream = TcpStream::connect(addr).await.map_err(io)?;
    let (rd, wr) = match tls {
        None => broker_tls::split_plain(stream).map_err(io)?,
        Some(tls) => {
            stream.set_nodelay(true).map_err(io)?;
            let stream =
                tls.connect(addr, stream)
                    .await
                    .map_err(|reason| IdError::BrokersUnavailable {
                        failures: vec![NodeFailure {
                            addr: addr.to_string(),
                            reason,
                        }],
                    })?;
            broker_tls::split_tls(stream)
        }
    };
    let mut rd = FrameReader::new(rd, timeouts.frame);
    let mut wr = FrameWriter::new(wr, timeouts.write);
    let hello = ClientMsg::Hello {
        magic: wire::MAGIC,
        version: wire::VERSION,
        token: token.map(|t| t.as_str().to_string()),
    };
    wr.send(&hello).await.map_err(|e| wire_error(addr, e))?;
    match rd.read_msg::<ServerMsg>().await {
        Ok(Some(ServerMsg::Welcome {
            version, max_count, ..
        })) if version == wire::VERSION => Ok((rd, wr, max_count)),
        Ok(Some(ServerMsg::Refused { reason })) if reason == wire::AUTH_FAILED => {
            Err(protocol(format!("broker {addr} {TOKEN_REFUSED}")))
        }
        Ok(Some(ServerMsg::Refused { reason })) => {
            Err(protocol(format!("handshake refused: {reason}")))
        }
        Ok(Some(other)) => Err(protocol(format!("unexpected handshake reply {other:?}"))),
        Ok(None) => Err(io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "closed during the handshake",
        ))),
        Err(e) => Err(wire_error(addr, e)),
    }
}

/// Opens a connection to broker `broker` at `addr` and starts its reader and writer.
async fn open(broker: usize, addr: &str, config: &BrokerClientConfig) -> Result<Conn, IdError> {
    let (rd, wr, max_count) = handshake(
        addr,
        config.timeouts(),
        config.token.as_ref(),
        config.tls.as_ref(),
    )
    .await?;
    let (dead, _) = watch::channel(false);
    let shared = Arc::new(Shared {
        addr: addr.to_string(),
        pending: Mutex::new(PendingTable::default()),
        dead,
        draining: std::sync::atomic::AtomicBool::new(false),
    });
    let (tx, rx) = mpsc::channel(WRITE_QUEUE);
    tokio::spawn(read_loop(rd, shared.clone()));
    tokio::spawn(write_loop(wr, rx, shared.clone()));
    Ok(Conn {
        broker,
        shared,
        tx,
        max_count,
    })
}

/// Routes replies to their callers until the connection ends; then fails the rest.
async fn read_loop(mut rd: FrameReader<ReadHalf>, shared: Arc<Shared>) {
    let mut dead = shared.dead.subscribe();
    let reason = loop {
        // Cancel safe: a reply half-read when `dead` wins stays buffered (and is moot).
        let msg = tokio::select! {
            biased;
            _ = dead.wait_for(|d| *d) => return,
            msg = rd.read_msg::<ServerMsg>() => msg,
        };
        let msg = match msg {
            Ok(Some(m)) => m,
            Ok(None) => break "broker closed the connection".to_string(),
            Err(e) => break format!("reading: {e}"),
        };
        let Some(id) = msg.request_id() else {
            break match msg {
                ServerMsg::Refused { reason } => format!("broker closed the connection: {reason}"),
                other => format!("protocol error: unexpected {other:?}"),
            };
        };
        let waiter = shared.table().waiting.remove(&id);
        match waiter {
            Some(tx) => {
                let _ = tx.send(Reply::Msg(msg));
            }
            // Its caller gave up (deadline): the IDs in it are burned, never returned.
            None => tracing::debug!(broker = %shared.addr, id, "late reply dropped"),
        }
    };
    shared.fail(reason);
}

/// Writes queued requests, as many per system call as are waiting.
async fn write_loop(
    mut wr: FrameWriter<WriteHalf>,
    mut rx: mpsc::Receiver<ClientMsg>,
    shared: Arc<Shared>,
) {
    let mut dead = shared.dead.subscribe();
    let reason = loop {
        // A batch dropped mid-write when `dead` wins is moot: the connection is gone.
        let written = tokio::select! {
            biased;
            _ = dead.wait_for(|d| *d) => return,
            w = wr.write_batch(&mut rx, |w, msg| w.push(&msg)) => w,
        };
        match written {
            Ok(0) => break "connection closed by the client".to_string(),
            Ok(_) => {}
            Err(e @ (WireError::Encode(_) | WireError::TooLarge { .. })) => {
                break format!("cannot encode a request: {e}")
            }
            Err(e) => break format!("writing: {e}"),
        }
    };
    shared.fail(reason);
}

/// Reads the counters of the broker at `addr` (`host:port`).
///
/// # Errors
/// [`IdError::BrokersUnavailable`] if it cannot be reached or does not answer within
/// [`STATS_TIMEOUT`]; [`IdError::Protocol`] if it answers something else.
pub async fn fetch_stats(addr: &str) -> Result<BrokerStats, IdError> {
    fetch_stats_with_token(addr, None).await
}

/// [`fetch_stats`] from a broker that requires `token` (its `--auth-token-file`).
///
/// # Errors
/// As [`fetch_stats`]; [`IdError::Protocol`] saying "refused the token" for a missing
/// or wrong token.
pub async fn fetch_stats_with_token(
    addr: &str,
    token: Option<&Token>,
) -> Result<BrokerStats, IdError> {
    fetch_stats_with(addr, token, None).await
}

/// [`fetch_stats_with_token`] from a broker that listens with TLS (`tls`).
///
/// # Errors
/// As [`fetch_stats_with_token`]; [`IdError::BrokersUnavailable`] saying why for a
/// failed TLS handshake (e.g. "certificate verification failed").
pub async fn fetch_stats_with(
    addr: &str,
    token: Option<&Token>,
    tls: Option<&BrokerTls>,
) -> Result<BrokerStats, IdError> {
    let unavailable = |reason: String| IdError::BrokersUnavailable {
        failures: vec![NodeFailure {
            addr: addr.to_string(),
            reason,
        }],
    };
    let work = async {
        let (mut rd, mut wr, _) = handshake(addr, Timeouts::default(), token, tls).await?;
        wr.send(&ClientMsg::Stats { id: 1 })
            .await
            .map_err(|e| wire_error(addr, e))?;
        match rd.read_msg::<ServerMsg>().await {
            Ok(Some(ServerMsg::Stats { stats, .. })) => Ok(*stats),
            Ok(Some(other)) => Err(IdError::Protocol {
                addr: addr.to_string(),
                reason: format!("expected stats, got {other:?}"),
            }),
            Ok(None) => Err(unavailable("closed before answering".into())),
            Err(e) => Err(unavailable(e.to_string())),
        }
    };
    match tokio::time::timeout(STATS_TIMEOUT, work).await {
        Ok(r) => r,
        Err(_) => Err(unavailable(format!("no stats within {STATS_TIMEOUT:?}"))),
    }
}

/// The client against a scripted fake broker: a loopback listener in the test that
/// speaks the wire protocol and answers every request as its [`Script`] says.
#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// How a fake broker answers.
    #[derive(Debug, Clone)]
    enum Script {
        /// Welcome, then the right IDs for every request.
        Normal,
        /// Refused instead of Welcome.
        RefuseHello,
        /// A reply for a request id never sent, then the right reply.
        UnknownIdFirst,
        /// An undecodable frame in reply to a request.
        Garbage,
        /// The first bytes of a reply, then silence (the connection stays open).
        HalfFrame,
        /// Closes the connection when a request arrives.
        CloseOnRequest,
        /// Answers every request with this error.
        Fail(IdError),
        /// Answers with one ID too many.
        WrongCount,
        /// A follower: answers every request with a redirect to this leader.
        Redirect(Option<String>),
    }

    struct FakeBroker {
        addr: String,
        /// Connections accepted, and requests read (over all of them).
        conns: Arc<AtomicUsize>,
        requests: Arc<AtomicUsize>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for FakeBroker {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl FakeBroker {
        async fn start(script: Script) -> FakeBroker {
            FakeBroker::start_gated(script, None).await
        }

        /// Like `start`, but every reply first takes a permit of `gate` (the test
        /// releases replies one by one, or all at once).
        async fn start_gated(script: Script, gate: Option<Arc<Semaphore>>) -> FakeBroker {
            FakeBroker::serve_gated(fake_listener().await, script, gate)
        }

        /// A fake broker on `listener` (bound first, so that brokers can name each other).
        fn serve_on(listener: TcpListener, script: Script) -> FakeBroker {
            FakeBroker::serve_gated(listener, script, None)
        }

        fn serve_gated(
            listener: TcpListener,
            script: Script,
            gate: Option<Arc<Semaphore>>,
        ) -> FakeBroker {
            let addr = addr_of(&listener);
            let conns = Arc::new(AtomicUsize::new(0));
            let requests = Arc::new(AtomicUsize::new(0));
            let (c, r) = (conns.clone(), requests.clone());
            let task = tokio::spawn(async move {
                // IDs are handed out from one counter per fake broker.
                let next = Arc::new(AtomicU64::new(1));
                let mut serving = tokio::task::JoinSet::new();
                while let Ok((stream, _)) = listener.accept().await {
                    c.fetch_add(1, Relaxed);
                    let (script, r, next, gate) =
                        (script.clone(), r.clone(), next.clone(), gate.clone());
                    serving.spawn(serve(stream, script, r, next, gate));
                }
            });
            FakeBroker {
                addr,
                conns,
                requests,
                task,
            }
        }

        fn conns(&self) -> usize {
            self.conns.load(Relaxed)
        }

        fn requests(&self) -> usize {
            self.requests.load(Relaxed)
        }
    }

    async fn fake_listener() -> TcpListener {
        TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the fake broker")
    }

    fn addr_of(listener: &TcpListener) -> String {
        listener.local_addr().expect("local addr").to_string()
    }

    async fn write(wr: &mut tokio::net::tcp::OwnedWriteHalf, msg: &ServerMsg) {
        let mut buf = Vec::new();
        wire::encode(msg, &mut buf).expect("encode");
        wr.write_all(&buf).await.expect("fake broker write");
    }

    /// One connection of a fake broker.
    async fn serve(
        stream: TcpStream,
        script: Script,
        requests: Arc<AtomicUsize>,
        next: Arc<AtomicU64>,
        gate: Option<Arc<Semaphore>>,
    ) {
        let (rd, mut wr) = stream.into_split();
        let mut rd = FrameReader::new(rd, framed::FRAME_TIMEOUT);
        let Ok(Some(ClientMsg::Hello { .. })) = rd.read_msg::<ClientMsg>().await else {
            return;
        };
        if let Script::RefuseHello = script {
            let reason = "go away".to_string();
            return write(&mut wr, &ServerMsg::Refused { reason }).await;
        }
        let welcome = ServerMsg::Welcome {
            version: wire::VERSION,
            max_count: 1000,
            max_in_flight: 64,
        };
        write(&mut wr, &welcome).await;
        while let Ok(Some(msg)) = rd.read_msg::<ClientMsg>().await {
            let ClientMsg::NextIds { id, count, .. } = msg else {
                continue;
            };
            requests.fetch_add(1, Relaxed);
            if let Some(gate) = &gate {
                gate.acquire().await.expect("gate open").forget();
            }
            let lo = next.fetch_add(count, Relaxed);
            let ids = ServerMsg::ids(
                id,
                IdRange {
                    lo,
                    hi: lo + count - 1,
                },
            );
            match &script {
                Script::Normal | Script::RefuseHello => write(&mut wr, &ids).await,
                Script::UnknownIdFirst => {
                    let stray = ServerMsg::ids(id + 1000, IdRange { lo: 1, hi: 1 });
                    write(&mut wr, &stray).await;
                    write(&mut wr, &ids).await;
                }
                Script::Garbage => {
                    let _ = wr.write_all(&[3, 0, 0, 0, 0xde, 0xad, 0xbe]).await;
                }
                Script::HalfFrame => {
                    let mut frame = Vec::new();
                    wire::encode(&ids, &mut frame).expect("encode");
                    wr.write_all(&frame[..6]).await.expect("fake broker write");
                    // Silence, with the connection open, until the test ends.
                    std::future::pending::<()>().await;
                }
                Script::CloseOnRequest => return,
                Script::Fail(error) => {
                    let error = error.clone();
                    write(&mut wr, &ServerMsg::Failed { id, error }).await;
                }
                Script::WrongCount => {
                    let wrong = ServerMsg::ids(id, IdRange { lo, hi: lo + count });
                    write(&mut wr, &wrong).await;
                }
                Script::Redirect(leader) => {
                    let leader = leader.clone();
                    write(&mut wr, &ServerMsg::Redirect { id, leader }).await;
                }
            }
        }
    }

    fn config(deadline: Duration) -> BrokerClientConfig {
        BrokerClientConfig {
            deadline,
            connections: 1,
            jitter_seed: Some(7),
            ..Default::default()
        }
    }

    async fn client(brokers: &[&FakeBroker], config: BrokerClientConfig) -> BrokerClient {
        let addrs = brokers.iter().map(|b| b.addr.clone()).collect();
        BrokerClient::connect(addrs, config)
            .await
            .expect("connect to the fake broker")
    }

    /// The reasons of a `BrokersUnavailable`, or a panic naming what came instead.
    #[track_caller]
    fn unavailable_reasons<T: std::fmt::Debug>(r: Result<T, IdError>) -> Vec<String> {
        match r {
            Err(IdError::BrokersUnavailable { failures }) => {
                failures.into_iter().map(|f| f.reason).collect()
            }
            other => panic!("expected BrokersUnavailable, got {other:?}"),
        }
    }

    /// Plenty: failover tests must not depend on how fast the machine is.
    const LONG: Duration = Duration::from_secs(20);

    #[tokio::test]
    async fn a_refused_connect_is_reported_once_with_its_cause() {
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = closed.local_addr().unwrap().to_string();
        drop(closed);
        let config = BrokerClientConfig {
            deadline: Duration::from_millis(200),
            ..Default::default()
        };
        let e = BrokerClient::connect(vec![addr.clone()], config)
            .await
            .expect_err("nothing listens there");
        let text = e.to_string();
        assert_eq!(text.matches("no broker reachable").count(), 1, "{text}");
        assert_eq!(text.matches(addr.as_str()).count(), 1, "{text}");
        assert!(text.contains("refused"), "{text}");
    }

    #[tokio::test]
    async fn normal_replies_are_returned_in_order() {
        let b = FakeBroker::start(Script::Normal).await;
        let c = client(&[&b], config(LONG)).await;
        assert_eq!(c.next_ids(3).await.expect("ids"), IdRange { lo: 1, hi: 3 });
        assert_eq!(c.next_id().await.expect("id"), 4);
        assert!(matches!(c.next_ids(0).await, Err(IdError::BadRequest(_))));
        // Above the broker's max_count (from its Welcome): refused without asking it.
        assert!(matches!(
            c.next_ids(1001).await,
            Err(IdError::BadRequest(_))
        ));
        assert_eq!((b.conns(), b.requests()), (1, 2));
    }

    #[tokio::test]
    async fn refused_handshake_is_unavailable_and_the_next_broker_is_used() {
        let refuser = FakeBroker::start(Script::RefuseHello).await;
        let addrs = vec![refuser.addr.clone()];
        let r = BrokerClient::connect(addrs, config(Duration::from_millis(300))).await;
        let reasons = unavailable_reasons(r);
        // The last pass's reason (or, if the deadline cut a pass short, that).
        assert!(
            reasons
                .iter()
                .all(|r| r.contains("handshake refused: go away") || r.contains("no handshake")),
            "{reasons:?}"
        );
        assert!(refuser.conns() >= 1);
        let good = FakeBroker::start(Script::Normal).await;
        let c = client(&[&refuser, &good], config(LONG)).await;
        assert_eq!(c.next_ids(2).await.expect("ids"), IdRange { lo: 1, hi: 2 });
        assert_eq!(good.requests(), 1);
    }

    /// A reply nobody waits for (its caller gave up, or a confused broker) is dropped;
    /// the connection stays and the real reply reaches its caller.
    #[tokio::test]
    async fn a_reply_for_an_unknown_request_is_dropped() {
        let b = FakeBroker::start(Script::UnknownIdFirst).await;
        let c = client(&[&b], config(LONG)).await;
        assert_eq!(c.next_ids(2).await.expect("ids"), IdRange { lo: 1, hi: 2 });
        assert_eq!(c.next_ids(1).await.expect("ids"), IdRange { lo: 3, hi: 3 });
        assert_eq!(
            b.conns(),
            1,
            "the stray reply must not break the connection"
        );
    }

    /// An undecodable frame breaks the connection; the request is resent on a new one
    /// (to the second broker), never answered from the garbage.
    #[tokio::test]
    async fn a_garbage_frame_breaks_the_connection_and_fails_over() {
        let bad = FakeBroker::start(Script::Garbage).await;
        let good = FakeBroker::start(Script::Normal).await;
        let c = client(&[&bad, &good], config(LONG)).await;
        assert_eq!(c.next_ids(4).await.expect("ids"), IdRange { lo: 1, hi: 4 });
        assert_eq!((bad.requests(), good.requests()), (1, 1));

        // With nowhere else to go: resent on new connections, then unavailable at the
        // deadline, saying what was read (or, if the deadline fell while a resent
        // request was out, that no reply came).
        let before = bad.requests();
        let c = client(&[&bad], config(Duration::from_secs(2))).await;
        let reasons = unavailable_reasons(c.next_ids(1).await);
        assert!(bad.requests() - before >= 2, "{}", bad.requests());
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("undecodable") || r.contains("no reply within")),
            "{reasons:?}"
        );
    }

    /// A reply that stops halfway breaks the connection at the frame timeout, and the
    /// request goes to the second broker well within its deadline.
    #[tokio::test]
    async fn a_half_sent_reply_times_out_and_fails_over() {
        let stuck = FakeBroker::start(Script::HalfFrame).await;
        let good = FakeBroker::start(Script::Normal).await;
        let config = BrokerClientConfig {
            frame_timeout: Duration::from_millis(200),
            ..config(LONG)
        };
        let c = client(&[&stuck, &good], config.clone()).await;
        assert_eq!(c.next_ids(1).await.expect("ids"), IdRange { lo: 1, hi: 1 });
        assert_eq!((stuck.requests(), good.requests()), (1, 1));

        // Alone, the stuck broker costs the caller its deadline; meanwhile every frame
        // timeout breaks the connection and the request is resent on a new one
        // (without the frame timeout it would wait on the first one: 1 request).
        let config = BrokerClientConfig {
            deadline: Duration::from_secs(3),
            ..config
        };
        let before = stuck.requests();
        let c = client(&[&stuck], config).await;
        unavailable_reasons(c.next_ids(1).await);
        assert!(stuck.requests() - before >= 2, "{}", stuck.requests());
    }

    /// A connection closed with the request unanswered: outcome unknown, so the request
    /// is resent as a new one elsewhere; with no other broker, the error says so.
    #[tokio::test]
    async fn a_close_mid_request_fails_over_to_the_second_broker() {
        let closer = FakeBroker::start(Script::CloseOnRequest).await;
        let good = FakeBroker::start(Script::Normal).await;
        let c = client(&[&closer, &good], config(LONG)).await;
        assert_eq!(c.next_ids(5).await.expect("ids"), IdRange { lo: 1, hi: 5 });
        assert_eq!((closer.requests(), good.requests()), (1, 1));
        // The next call starts at the broker that worked.
        assert_eq!(c.next_ids(1).await.expect("ids"), IdRange { lo: 6, hi: 6 });
        assert_eq!(closer.requests(), 1);

        let before = closer.requests();
        let c = client(&[&closer], config(Duration::from_secs(2))).await;
        let reasons = unavailable_reasons(c.next_ids(1).await);
        assert!(closer.requests() - before >= 2, "{}", closer.requests());
        assert!(
            reasons.iter().any(
                |r| r.contains("broker closed the connection") || r.contains("no reply within")
            ),
            "{reasons:?}"
        );
    }

    /// A broker's typed error is final (it already retried): returned as is, not
    /// resent. Only `BrokersUnavailable` (shutting down, never started) fails over.
    #[tokio::test]
    async fn typed_errors_are_returned_and_only_shutdown_fails_over() {
        let no_quorum = IdError::NoQuorum {
            needed: 3,
            reachable: 1,
            accepted: Some(1),
            total: 5,
            failures: Vec::new(),
        };
        let b = FakeBroker::start(Script::Fail(no_quorum.clone())).await;
        let good = FakeBroker::start(Script::Normal).await;
        let c = client(&[&b, &good], config(LONG)).await;
        assert_eq!(c.next_ids(1).await, Err(no_quorum));
        assert_eq!((b.requests(), good.requests()), (1, 0));

        let draining = IdError::BrokersUnavailable {
            failures: vec![NodeFailure {
                addr: "broker".into(),
                reason: "shutting down".into(),
            }],
        };
        let b = FakeBroker::start(Script::Fail(draining)).await;
        let c = client(&[&b, &good], config(LONG)).await;
        assert_eq!(c.next_ids(2).await.expect("ids"), IdRange { lo: 1, hi: 2 });
        assert_eq!((b.requests(), good.requests()), (1, 1));
    }

    /// A follower's redirect sends the request, and every later one, to the leader.
    #[tokio::test]
    async fn a_redirect_moves_the_client_to_the_leader() {
        let leader = FakeBroker::start(Script::Normal).await;
        let follower = FakeBroker::start(Script::Redirect(Some(leader.addr.clone()))).await;
        let c = client(&[&follower, &leader], config(LONG)).await;
        assert_eq!(c.next_ids(2).await.expect("ids"), IdRange { lo: 1, hi: 2 });
        for k in 0..5 {
            let lo = 3 + 2 * k;
            assert_eq!(
                c.next_ids(2).await.expect("ids"),
                IdRange { lo, hi: lo + 1 }
            );
        }
        assert_eq!((follower.requests(), leader.requests()), (1, 6));
    }

    /// The redirect goes to the broker it names, not merely the next one; a leader not
    /// in the list that cannot be reached sends the client on to the broker after the
    /// one that redirected (as if the redirect had not been followed).
    #[tokio::test]
    async fn a_redirect_goes_to_the_named_broker_or_on_if_unreachable() {
        let leader = FakeBroker::start(Script::Normal).await;
        let other = FakeBroker::start(Script::Normal).await;
        let follower = FakeBroker::start(Script::Redirect(Some(leader.addr.clone()))).await;
        let c = client(&[&follower, &other, &leader], config(LONG)).await;
        assert_eq!(c.next_ids(1).await.expect("ids"), IdRange { lo: 1, hi: 1 });
        assert_eq!((other.requests(), leader.requests()), (0, 1));

        let good = FakeBroker::start(Script::Normal).await;
        let stranger = "192.0.2.1:7400".to_string();
        let follower = FakeBroker::start(Script::Redirect(Some(stranger))).await;
        let c = client(&[&follower, &good], config(LONG)).await;
        assert_eq!(c.next_ids(1).await.expect("ids"), IdRange { lo: 1, hi: 1 });
        assert_eq!((follower.requests(), good.requests()), (1, 1));
    }

    /// One address, a follower's: the client follows the redirect to the leader it was
    /// not given, and keeps its connection there (pooled: one connection for every
    /// request after the redirect).
    #[tokio::test]
    async fn a_leader_outside_the_list_is_followed_and_kept() {
        let leader = FakeBroker::start(Script::Normal).await;
        let follower = FakeBroker::start(Script::Redirect(Some(leader.addr.clone()))).await;
        let c = client(&[&follower], config(LONG)).await;
        for k in 0..10 {
            let lo = 1 + 2 * k;
            assert_eq!(
                c.next_ids(2).await.expect("ids"),
                IdRange { lo, hi: lo + 1 }
            );
        }
        assert_eq!((follower.requests(), leader.requests()), (1, 10));
        assert_eq!(leader.conns(), 1);
        assert_eq!(c.learned(), vec![leader.addr.clone()]);
    }

    /// `closed_list`: a leader outside the list is never connected to; the request fails
    /// saying so, and how to allow it.
    #[tokio::test]
    async fn a_closed_list_refuses_a_leader_outside_it() {
        let leader = FakeBroker::start(Script::Normal).await;
        let follower = FakeBroker::start(Script::Redirect(Some(leader.addr.clone()))).await;
        let closed = BrokerClientConfig {
            closed_list: true,
            ..config(Duration::from_millis(400))
        };
        let c = client(&[&follower], closed).await;
        let reasons = unavailable_reasons(c.next_ids(1).await);
        let want = format!(
            "the leader {} is not among the --broker addresses",
            leader.addr
        );
        assert!(
            reasons
                .iter()
                .any(|r| r.contains(&want) && r.contains("--broker-closed-list")),
            "{reasons:?}"
        );
        assert_eq!((leader.conns(), leader.requests()), (0, 0));
        assert!(c.learned().is_empty());
    }

    /// Two brokers naming each other (A says B, B says A): each request stops after
    /// [`MAX_REDIRECTS`] redirects with an error naming the path, long before its
    /// deadline, whether the brokers are listed or learned.
    #[tokio::test]
    async fn a_redirect_loop_is_bounded_per_request() {
        // Listed: both in the list.
        let (la, lb) = (fake_listener().await, fake_listener().await);
        let (a_addr, b_addr) = (addr_of(&la), addr_of(&lb));
        let a = FakeBroker::serve_on(la, Script::Redirect(Some(b_addr.clone())));
        let b = FakeBroker::serve_on(lb, Script::Redirect(Some(a_addr.clone())));
        for listed in [vec![&a, &b], vec![&a]] {
            let c = client(&listed, config(LONG)).await;
            for _ in 0..3 {
                let before = a.requests() + b.requests();
                let reasons = unavailable_reasons(c.next_ids(1).await);
                let asked = a.requests() + b.requests() - before;
                assert_eq!(asked, MAX_REDIRECTS + 1, "{reasons:?}");
                let path = [&a_addr, &b_addr].map(|s| s.as_str());
                assert!(
                    reasons
                        .iter()
                        .any(|r| r.contains("redirected 4 times in one request")
                            && path.iter().all(|p| r.contains(p))),
                    "{reasons:?}"
                );
            }
        }
    }

    /// "No leader known" (an election under way): the request goes to another broker.
    #[tokio::test]
    async fn no_known_leader_moves_on_to_the_next_broker() {
        let electing = FakeBroker::start(Script::Redirect(None)).await;
        let good = FakeBroker::start(Script::Normal).await;
        let c = client(&[&electing, &good], config(LONG)).await;
        assert_eq!(c.next_ids(3).await.expect("ids"), IdRange { lo: 1, hi: 3 });
        assert_eq!((electing.requests(), good.requests()), (1, 1));
    }

    /// While no broker leads, a request waits (pausing between tries) until its deadline,
    /// then fails saying why; it never spins: tries are bounded by the backoff.
    #[tokio::test]
    async fn without_a_leader_a_request_fails_at_its_deadline_saying_why() {
        let a = FakeBroker::start(Script::Redirect(None)).await;
        let b = FakeBroker::start(Script::Redirect(None)).await;
        let c = client(&[&a, &b], config(Duration::from_millis(400))).await;
        let reasons = unavailable_reasons(c.next_ids(1).await);
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        for r in &reasons {
            assert!(r.contains("no leader known"), "{r}");
        }
        assert!(a.requests() >= 1 && b.requests() >= 1);
        // 400 ms with pauses doubling from 5 ms up to 200 ms: a few dozen tries at most.
        assert!(
            a.requests() + b.requests() < 100,
            "{}",
            a.requests() + b.requests()
        );
    }

    /// A reply with the wrong number of IDs is a protocol error, never a range.
    #[tokio::test]
    async fn a_wrong_count_is_a_protocol_error() {
        let b = FakeBroker::start(Script::WrongCount).await;
        let c = client(&[&b], config(LONG)).await;
        match c.next_ids(3).await {
            Err(IdError::Protocol { addr, reason }) => {
                assert_eq!(addr, b.addr);
                assert!(reason.contains("unexpected reply"), "{reason}");
            }
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn stats_are_fetched_and_a_refusal_is_an_error() {
        let refuser = FakeBroker::start(Script::RefuseHello).await;
        match fetch_stats(&refuser.addr).await {
            Err(IdError::Protocol { reason, .. }) => {
                assert!(reason.contains("go away"), "{reason}")
            }
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }

    /// Callers waiting in the coalescing queue.
    fn queued(c: &BrokerClient) -> usize {
        // Callers that joined and are not answered yet (the tests' runtime has one
        // thread, and a caller joins in one poll).
        let q = c.queue.as_ref().expect("coalescing is on");
        COALESCE_QUEUE - q.room.available_permits()
    }

    /// Waits (polling) until `cond` holds; panics, naming `what`, after 10 s.
    #[track_caller]
    fn wait_for(what: &str, cond: impl Fn() -> bool) -> impl std::future::Future<Output = ()> {
        let caller = std::panic::Location::caller();
        let what = what.to_string();
        async move {
            let until = Instant::now() + Duration::from_secs(10);
            while !cond() {
                assert!(Instant::now() < until, "{caller}: never reached: {what}");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    type Call = tokio::task::JoinHandle<Result<IdRange, IdError>>;

    fn call(c: &BrokerClient, n: u64, deadline: Duration) -> Call {
        let c = c.clone();
        tokio::spawn(async move { c.next_ids_until(n, Instant::now() + deadline).await })
    }

    /// A client with one request out at a time, and a first caller whose request the
    /// gated broker holds: callers after it queue up in a known order.
    async fn one_out(b: &FakeBroker) -> (BrokerClient, Call) {
        let config = BrokerClientConfig {
            in_flight: 1,
            ..config(LONG)
        };
        let c = client(&[b], config).await;
        let first = call(&c, 1, LONG);
        wait_for("the first request reached the broker", || b.requests() == 1).await;
        (c, first)
    }

    /// Queues callers for `counts` one after another (each queued before the next
    /// calls), with deadline `deadline`.
    async fn queue_up(c: &BrokerClient, counts: &[u64], deadline: Duration) -> Vec<Call> {
        let mut calls = Vec::new();
        for &n in counts {
            let before = queued(c);
            calls.push(call(c, n, deadline));
            wait_for("the caller is queued", || queued(c) == before + 1).await;
        }
        calls
    }

    async fn outcome(call: Call) -> Result<IdRange, IdError> {
        call.await.expect("caller task")
    }

    /// Ten callers queued behind a request go out as ONE request for their total, and
    /// get consecutive ranges in queue order.
    #[tokio::test]
    async fn queued_callers_go_as_one_request_split_in_queue_order() {
        let gate = Arc::new(Semaphore::new(0));
        let b = FakeBroker::start_gated(Script::Normal, Some(gate.clone())).await;
        let (c, first) = one_out(&b).await;
        let counts: Vec<u64> = (1..=10).collect();
        let calls = queue_up(&c, &counts, LONG).await;
        gate.add_permits(100);
        assert_eq!(outcome(first).await, Ok(IdRange { lo: 1, hi: 1 }));
        let mut lo = 2;
        for (n, call) in counts.iter().zip(calls) {
            assert_eq!(outcome(call).await, Ok(IdRange { lo, hi: lo + n - 1 }));
            lo += n;
        }
        assert_eq!(b.requests(), 2, "11 callers, 2 wire requests");
        let seen = c.coalescing();
        assert_eq!((seen.requests, seen.callers), (2, 11));
    }

    /// A caller whose deadline passes while queued gets `Deadline` and is never sent; one
    /// whose deadline passes while its coalesced request is out gets `Deadline` at its
    /// own deadline, its share burned; the caller beside it still gets its IDs.
    #[tokio::test]
    async fn a_caller_past_its_deadline_gets_deadline_the_others_get_ids() {
        let gate = Arc::new(Semaphore::new(0));
        let b = FakeBroker::start_gated(Script::Normal, Some(gate.clone())).await;
        let (c, first) = one_out(&b).await;
        let mut calls = queue_up(&c, &[1], Duration::from_secs(2)).await;
        let short = queue_up(&c, &[1], Duration::from_millis(100)).await;
        calls.extend(queue_up(&c, &[1], LONG).await);
        let [short] = <[Call; 1]>::try_from(short).expect("one call");
        assert!(matches!(
            outcome(short).await,
            Err(IdError::Deadline { rounds: 0, .. })
        ));
        // The first reply lets the two live callers go, as one request; the broker
        // holds it past the first one's deadline.
        gate.add_permits(1);
        assert_eq!(outcome(first).await, Ok(IdRange { lo: 1, hi: 1 }));
        wait_for("the coalesced request reached the broker", || {
            b.requests() == 2
        })
        .await;
        let [expiring, patient] = <[Call; 2]>::try_from(calls).expect("two calls");
        assert!(matches!(
            outcome(expiring).await,
            Err(IdError::Deadline { rounds: 0, .. })
        ));
        gate.add_permits(100);
        // ID 2 was the expired caller's share: a hole. The one never sent cost nothing.
        assert_eq!(outcome(patient).await, Ok(IdRange { lo: 3, hi: 3 }));
        assert_eq!(c.next_ids(1).await, Ok(IdRange { lo: 4, hi: 4 }));
        assert_eq!(b.requests(), 3);
    }

    /// A caller whose future is dropped while it is queued is left out of the next
    /// request: no ID is asked for it, so it leaves no hole.
    #[tokio::test]
    async fn a_caller_dropped_while_queued_is_left_out() {
        let gate = Arc::new(Semaphore::new(0));
        let b = FakeBroker::start_gated(Script::Normal, Some(gate.clone())).await;
        let (c, first) = one_out(&b).await;
        let calls = queue_up(&c, &[1, 5, 1], LONG).await;
        let [before, dropped, after] = <[Call; 3]>::try_from(calls).expect("three calls");
        dropped.abort();
        assert!(dropped.await.expect_err("aborted").is_cancelled());
        gate.add_permits(100);
        assert_eq!(outcome(first).await, Ok(IdRange { lo: 1, hi: 1 }));
        assert_eq!(outcome(before).await, Ok(IdRange { lo: 2, hi: 2 }));
        assert_eq!(outcome(after).await, Ok(IdRange { lo: 3, hi: 3 }));
        assert_eq!(b.requests(), 2);
    }

    /// A queue holding more than the broker's `max_count` (1000 here) goes out as
    /// several requests, none above it, still in queue order.
    #[tokio::test]
    async fn a_queue_above_max_count_is_split_into_several_requests() {
        let gate = Arc::new(Semaphore::new(0));
        let b = FakeBroker::start_gated(Script::Normal, Some(gate.clone())).await;
        let (c, first) = one_out(&b).await;
        let counts = [600, 600, 300, 1000];
        let calls = queue_up(&c, &counts, LONG).await;
        gate.add_permits(100);
        assert_eq!(outcome(first).await, Ok(IdRange { lo: 1, hi: 1 }));
        let mut lo = 2;
        for (n, call) in counts.iter().zip(calls) {
            assert_eq!(outcome(call).await, Ok(IdRange { lo, hi: lo + n - 1 }));
            lo += n;
        }
        // [1], [600], [600, 300], [1000].
        assert_eq!(b.requests(), 4);
    }

    /// Every caller of a failed coalesced request gets its error.
    #[tokio::test]
    async fn every_caller_of_a_failed_request_gets_the_error() {
        let no_quorum = IdError::NoQuorum {
            needed: 3,
            reachable: 1,
            accepted: Some(1),
            total: 5,
            failures: Vec::new(),
        };
        let gate = Arc::new(Semaphore::new(0));
        let b = FakeBroker::start_gated(Script::Fail(no_quorum.clone()), Some(gate.clone())).await;
        let (c, first) = one_out(&b).await;
        let calls = queue_up(&c, &[1, 2, 3], LONG).await;
        gate.add_permits(100);
        assert_eq!(outcome(first).await, Err(no_quorum.clone()));
        for call in calls {
            assert_eq!(outcome(call).await, Err(no_quorum.clone()));
        }
        assert_eq!(b.requests(), 2);
    }

    /// A connection attempt cut short by the request's deadline keeps the cause an
    /// earlier attempt on the same broker saw.
    #[test]
    fn a_cut_attempt_keeps_the_earlier_cause() {
        let f = |addr: &str, reason: &str| NodeFailure {
            addr: addr.into(),
            reason: reason.into(),
        };
        let mut failures = vec![f("a", "broker a refused the token")];
        note_cut(&mut failures, f("a", "no handshake within 3ms"));
        note_cut(&mut failures, f("a", "no handshake within 1ms"));
        note_cut(&mut failures, f("b", "no handshake within 2ms"));
        let reasons: Vec<&str> = failures.iter().map(|f| f.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "broker a refused the token (the last attempt: no handshake within 3ms)",
                "no handshake within 2ms",
            ]
        );
    }

    /// With `in_flight` 0 every call is its own request, as before coalescing.
    #[tokio::test]
    async fn in_flight_zero_sends_every_call_alone() {
        let b = FakeBroker::start(Script::Normal).await;
        let config = BrokerClientConfig {
            in_flight: 0,
            ..config(LONG)
        };
        let c = client(&[&b], config).await;
        let calls: Vec<Call> = (0..8).map(|_| call(&c, 1, LONG)).collect();
        let mut ids = Vec::new();
        for call in calls {
            ids.push(outcome(call).await.expect("ids").lo);
        }
        ids.sort_unstable();
        assert_eq!(ids, (1..=8).collect::<Vec<u64>>());
        assert_eq!(b.requests(), 8);
        assert_eq!(c.coalescing(), Coalescing::default());
    }
}

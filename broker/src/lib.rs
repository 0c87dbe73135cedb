//! broker: the idbroker ID server.
//!
//! Clients send `NextIds` requests over TCP (protocol: [`idproto::wire`],
//! `docs/wire-protocol.md`); the [batcher] runs ONE quorum round at a time and
//! serves every request queued when the round starts from the single range it reserves
//! (group commit), split in arrival order. Requests arriving during a round wait for the
//! next one; nothing is ever reserved ahead for later requests, which is what keeps IDs
//! in real-time order across several brokers (DESIGN.md, "The broker").
//!
//! Main items:
//! - [`run`]: the server, generic over a [`RoundSource`] (production passes
//!   [`idclient::QuorumClient`]; tests pass fakes), stopped by a future; [`run_with`]
//!   also serves RESP (any Redis client, `QLIST.NEXT`) on a second listener.
//! - [`BrokerConfig`]: every limit, with defaults from the named constants below, the
//!   token, and [`ListenTls`] (TLS on both listeners, `--listen-tls-cert`).
//! - [`Stats`]: counters, readable over the wire (`ClientMsg::Stats`) and logged.
//! - [`WindowSource`] (`--serve window`): batches served from confirmed windows; wrapped
//!   in a [`LeaderSource`] ([`leader`]) it serves only while elected, and otherwise
//!   answers each request with a redirect to the leader ([`RoundSource::redirect`]).
//!
//! Limits: at most [`BrokerConfig::max_connections`] connections (at the cap, a new
//! connection evicts the longest-idle one, those not yet authenticated first, or is
//! refused if none has been idle for [`BrokerConfig::evict_min_idle`]; the accept loop
//! never waits for an eviction), a handshake and token within
//! [`BrokerConfig::handshake_timeout`] of the connect, [`MAX_AUTH_FAILURES`] wrong
//! tokens per connection, at most [`BrokerConfig::max_in_flight_per_conn`]
//! unanswered requests per connection (then the broker stops reading it), frames of at
//! most [`idproto::wire::MAX_FRAME_LEN`] bytes, each completed within
//! [`BrokerConfig::frame_timeout`] of its first byte, an idle timeout, and a write timeout
//! that drops a client that does not read. Memory is therefore bounded by connections x
//! (buffers + in-flight), and no connection holds its slot without doing something.

pub mod batcher;
mod conn;
mod forward;
pub mod leader;
pub mod metrics;
mod resp;
pub mod stats;
mod tls;
pub mod window;

pub use batcher::RoundSource;
pub use idproto::wire::BrokerStats;
pub use leader::{ElectionConfig, ElectionQuorum, LeaderSource, QuorumElection};
pub use resp::MAX_REQUEST_LEN as MAX_RESP_REQUEST_LEN;
pub use stats::Stats;
pub use tls::ListenTls;
pub use window::{WindowMutant, WindowQuorum, WindowSource, WindowStats};

use idproto::framed::FrameWriter;
use idproto::wire::{ServerMsg, WireError};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Default cap on open connections. Each costs ~100 KiB of buffers at most; clients
/// multiplex many callers over one or two connections, so a thousand is plenty.
pub const MAX_CONNECTIONS: usize = 1024;

/// Default cap on unanswered requests per connection. Above the largest batch a single
/// connection usefully contributes to one round, small enough to bound memory.
pub const MAX_IN_FLIGHT_PER_CONN: usize = 4096;

/// Default cap on IDs per broker request (`--max-count`): a producer reserving a batch
/// asks for thousands, not billions; the cap keeps a round's total far from u64 overflow.
/// (The quorum client's own hard cap per round, `idclient::MAX_COUNT`, is 2^32.)
pub const DEFAULT_MAX_COUNT: u64 = 1 << 20;

/// Default cap on requests per round: bounds the work of fanning one round out, while
/// being well above what a round collects at the target load.
pub const MAX_BATCH: usize = 16 * 1024;

/// Default cap on IDs per round; a larger batch is split over rounds.
pub const MAX_ROUND_IDS: u64 = idclient::MAX_COUNT;

/// Deadline used when a client sends 0 ("broker's default").
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// The longest deadline a client may ask for: a round that cannot reach a quorum holds
/// up every later request until its deadline, so one client must not pick hours.
pub const MAX_DEADLINE: Duration = Duration::from_secs(60);

/// No configuration may allow deadlines beyond this: an ID request that may wait a day
/// is a mistake, and `now + deadline` must never overflow.
pub const LONGEST_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// How long a reply write may block before the client is deemed not to read (dropped).
/// The framed connection's default, which the broker client uses too.
pub const WRITE_TIMEOUT: Duration = idproto::framed::WRITE_TIMEOUT;

/// How long the handshake (connect to complete `Hello`) may take: a client that connects
/// and says nothing must not hold a connection slot.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long any frame may take from its first byte (header included) to its last: a
/// half-sent frame must not hold a connection slot forever. A frame is at most 64 KiB,
/// so a live client sends one in far less. The framed connection's default.
pub const FRAME_TIMEOUT: Duration = idproto::framed::FRAME_TIMEOUT;

/// A connection with no request in flight and no partial frame for this long is closed
/// (its client reconnects when it needs to). Long enough that a client calling every
/// few seconds keeps its connections; short enough that forgotten ones free their slot.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// At the connection cap, a new connection evicts the longest-idle one if it has been
/// idle at least this long. Not zero: two clients that together want more than the cap
/// would otherwise evict each other on every call.
pub const EVICT_MIN_IDLE: Duration = Duration::from_secs(1);

/// How long a connection admitted at the cap waits for its evicted victim's slot before
/// it is refused (an idle victim frees its slot at once; this only bounds a race). The
/// wait is the admission's own task's, never the accept loop's.
const EVICT_WAIT: Duration = Duration::from_secs(1);

/// Connections waiting at the cap for a slot at once (each evicted a victim); beyond
/// that a new connection at the cap is refused at once.
const MAX_ADMITTING: usize = 64;

/// Wrong tokens a RESP connection may send (`AUTH`, `HELLO .. AUTH`) before it is
/// closed; a binary connection has one try, its Hello. Client libraries try at most
/// two forms of `AUTH`, so three is never reached by a client that has the token.
pub const MAX_AUTH_FAILURES: u32 = 3;

/// Pause after each wrong token before the client hears of it: with the cap on tries,
/// a guesser gets a few guesses a second per connection slot. Well under the broker
/// client's connect timeout (`idclient::broker_client::DEFAULT_CONNECT_TIMEOUT`, 500
/// ms, which covers the Hello), so a client with a wrong token is still told so, and
/// fails at once instead of retrying until its deadline.
pub const AUTH_FAILURE_PAUSE: Duration = Duration::from_millis(200);

/// Connections being refused at the cap at once (each is told why, then closed);
/// beyond that a refused connection is just closed.
const MAX_REFUSING: usize = 64;

/// How long a refused connection is drained after its `Refused` is sent, so the
/// client's own `Hello` does not turn the close into a reset that hides the reason.
const REFUSE_LINGER: Duration = Duration::from_millis(500);

/// How often the counters are logged (at info level).
pub const STATS_INTERVAL: Duration = Duration::from_secs(60);

/// Capacity of the queue in front of the batcher. Connections wait (and so stop
/// reading) when it is full: backpressure, not an unbounded queue.
pub const QUEUE_CAPACITY: usize = 64 * 1024;

/// Window confirmations in flight at once by default (`idbroker --pipeline`).
pub const DEFAULT_PIPELINE: usize = 4;

/// The broker's limits and timeouts.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub max_connections: usize,
    pub max_in_flight_per_conn: usize,
    pub max_count: u64,
    pub max_batch: usize,
    pub max_round_ids: u64,
    /// Batches whose rounds run at once (`--pipeline`): 1 for `--serve rounds`, more
    /// to pipeline window confirmations.
    pub pipeline: usize,
    pub default_deadline: Duration,
    pub max_deadline: Duration,
    pub write_timeout: Duration,
    pub handshake_timeout: Duration,
    pub frame_timeout: Duration,
    pub idle_timeout: Duration,
    pub evict_min_idle: Duration,
    pub stats_interval: Duration,
    pub queue_capacity: usize,
    /// The shared secret clients must present (`--auth-token-file`): in the binary
    /// Hello, and with `AUTH` on RESP. `None`: no authentication.
    pub auth_token: Option<idproto::auth::Token>,
    /// TLS on both listeners (`--listen-tls-cert`, `--listen-tls-key`); `None`: plain
    /// TCP.
    pub tls: Option<ListenTls>,
    /// How a follower reaches the leader when it forwards RESP requests, when brokers
    /// listen with TLS (`--peer-tls-ca`); `None`: plain TCP.
    pub peer_tls: Option<idclient::BrokerTls>,
}

impl Default for BrokerConfig {
    fn default() -> BrokerConfig {
        BrokerConfig {
            max_connections: MAX_CONNECTIONS,
            max_in_flight_per_conn: MAX_IN_FLIGHT_PER_CONN,
            max_count: DEFAULT_MAX_COUNT,
            max_batch: MAX_BATCH,
            max_round_ids: MAX_ROUND_IDS,
            pipeline: 1,
            default_deadline: DEFAULT_DEADLINE,
            max_deadline: MAX_DEADLINE,
            write_timeout: WRITE_TIMEOUT,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            frame_timeout: FRAME_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            evict_min_idle: EVICT_MIN_IDLE,
            stats_interval: STATS_INTERVAL,
            queue_capacity: QUEUE_CAPACITY,
            auth_token: None,
            tls: None,
            peer_tls: None,
        }
    }
}

/// What can stop the broker from starting.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("invalid broker configuration: {0}")]
    Config(String),
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
}

impl BrokerConfig {
    /// Checks that every limit is usable.
    ///
    /// # Errors
    /// [`BrokerError::Config`] naming the first bad field.
    pub fn validate(&self) -> Result<(), BrokerError> {
        let positive = [
            ("max_connections", self.max_connections as u64),
            ("max_in_flight_per_conn", self.max_in_flight_per_conn as u64),
            ("max_count", self.max_count),
            ("max_batch", self.max_batch as u64),
            ("pipeline", self.pipeline as u64),
            ("queue_capacity", self.queue_capacity as u64),
            ("max_deadline", self.max_deadline.as_millis() as u64),
            ("default_deadline", self.default_deadline.as_millis() as u64),
            ("write_timeout", self.write_timeout.as_millis() as u64),
            (
                "handshake_timeout",
                self.handshake_timeout.as_millis() as u64,
            ),
            ("frame_timeout", self.frame_timeout.as_millis() as u64),
            ("idle_timeout", self.idle_timeout.as_millis() as u64),
            ("stats_interval", self.stats_interval.as_millis() as u64),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(BrokerError::Config(format!("{name} must be positive")));
        }
        if self.max_round_ids > idclient::MAX_COUNT {
            return Err(BrokerError::Config(format!(
                "max_round_ids {} exceeds what one quorum round may reserve ({})",
                self.max_round_ids,
                idclient::MAX_COUNT
            )));
        }
        if self.max_deadline > LONGEST_DEADLINE {
            return Err(BrokerError::Config(format!(
                "max_deadline {:?} exceeds {LONGEST_DEADLINE:?}",
                self.max_deadline
            )));
        }
        if self.max_round_ids < self.max_count {
            return Err(BrokerError::Config(format!(
                "max_round_ids {} is below max_count {}",
                self.max_round_ids, self.max_count
            )));
        }
        if self.default_deadline > self.max_deadline {
            return Err(BrokerError::Config(
                "default_deadline exceeds max_deadline".into(),
            ));
        }
        if u32::try_from(self.max_in_flight_per_conn).is_err() {
            return Err(BrokerError::Config(
                "max_in_flight_per_conn must fit in u32".into(),
            ));
        }
        Ok(())
    }
}

/// Serves `listener` until `shutdown` completes, then shuts down gracefully: stops
/// accepting, stops reading requests, lets the round in flight finish and answers its
/// requests, refuses every queued request (retryable: it was never started), flushes the
/// replies and returns the final counters.
///
/// # Errors
/// Only an invalid `config`; accept errors (e.g. out of file descriptors) are logged and
/// retried after a pause.
pub async fn run<S: RoundSource>(
    listener: TcpListener,
    source: Arc<S>,
    config: BrokerConfig,
    shutdown: impl Future,
) -> Result<BrokerStats, BrokerError> {
    run_with(listener, None, Arc::default(), source, config, shutdown).await
}

/// [`run`], also serving the RESP protocol (any Redis client, `docs/wire-protocol.md`)
/// on `resp` when given (both listeners share the batcher, the counters and the
/// connection slots), and counting into `stats`, which the caller may read while the
/// broker serves (the metrics endpoint, [`metrics`]). `stats` should be fresh: one
/// broker, one [`Stats`].
///
/// # Errors
/// As [`run`].
pub async fn run_with<S: RoundSource>(
    listener: TcpListener,
    resp: Option<TcpListener>,
    stats: Arc<Stats>,
    source: Arc<S>,
    config: BrokerConfig,
    shutdown: impl Future,
) -> Result<BrokerStats, BrokerError> {
    config.validate()?;
    let config = Arc::new(config);
    stats.set_source(source.clone());
    let name = listener
        .local_addr()
        .map_or_else(|_| "idbroker".to_string(), |a| a.to_string());
    let (stop_tx, stopping) = watch::channel(false);
    let (batch_tx, batch_rx) = mpsc::channel(config.queue_capacity);
    let batcher_config = batcher::BatcherConfig {
        max_batch: config.max_batch,
        max_round_ids: config.max_round_ids,
        name: name.clone(),
        pipeline: config.pipeline,
    };
    let redirect: conn::Redirect = {
        let source = source.clone();
        Arc::new(move || source.redirect())
    };
    let election = source.election();
    let batcher = tokio::spawn(batcher::run(
        source,
        batch_rx,
        stats.clone(),
        batcher_config,
        stopping.clone(),
    ));
    let logger = tokio::spawn(log_stats(stats.clone(), config.stats_interval));
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    // Only RESP requests are forwarded (binary clients follow redirects themselves).
    let forward = election
        .filter(|_| resp.is_some())
        .map(|election| Arc::new(forward::Forwarder::new(election, &config)));
    let mut acceptor = Acceptor::new(config, stats.clone(), batch_tx, stopping, done_tx);
    acceptor.redirect = Some(redirect);
    acceptor.forward = forward;
    let acceptor = Arc::new(acceptor);
    tracing::info!(listen = %name, "broker serving");
    if let Some(addr) = resp.as_ref().and_then(|l| l.local_addr().ok()) {
        tracing::info!(listen = %addr, "broker serving RESP");
    }
    acceptor.serve(&listener, resp.as_ref(), shutdown).await;

    tracing::info!("shutting down: no new connections; finishing the round in flight");
    drop(listener);
    drop(resp);
    let _ = stop_tx.send(true);
    // Drops the batcher's queue sender and our clone of `done_tx`: `done_rx` sees the
    // end once the last connection task has finished.
    drop(acceptor);
    let _ = done_rx.recv().await;
    if let Err(e) = batcher.await {
        tracing::error!("batcher task failed: {e}");
    }
    logger.abort();
    let final_stats = stats.snapshot();
    log_line(&final_stats);
    Ok(final_stats)
}

/// The accept loop's state: what every connection shares, and the connection slots.
/// Shared (behind an `Arc`) with the tasks admitting connections at the cap.
struct Acceptor {
    config: Arc<BrokerConfig>,
    stats: Arc<Stats>,
    batch_tx: mpsc::Sender<batcher::Pending>,
    stopping: watch::Receiver<bool>,
    /// Every connection task holds a clone; the receiver's `recv()` returning `None`
    /// means all of them are done.
    done: mpsc::Sender<()>,
    /// One permit per connection slot.
    limit: Arc<Semaphore>,
    /// One permit per connection being told it was refused at the cap.
    refusing: Arc<Semaphore>,
    /// One permit per connection waiting at the cap for an evicted victim's slot.
    admitting: Arc<Semaphore>,
    conns: Conns,
    next_conn: AtomicU64,
    /// The source's redirect check (none: serve everything).
    redirect: Option<conn::Redirect>,
    /// Forwarding of RESP requests to the leader, when the source takes part in an
    /// election.
    forward: Option<Arc<forward::Forwarder>>,
}

impl Acceptor {
    fn new(
        config: Arc<BrokerConfig>,
        stats: Arc<Stats>,
        batch_tx: mpsc::Sender<batcher::Pending>,
        stopping: watch::Receiver<bool>,
        done: mpsc::Sender<()>,
    ) -> Acceptor {
        Acceptor {
            limit: Arc::new(Semaphore::new(config.max_connections)),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            admitting: Arc::new(Semaphore::new(MAX_ADMITTING)),
            conns: Arc::default(),
            next_conn: AtomicU64::new(0),
            redirect: None,
            forward: None,
            config,
            stats,
            batch_tx,
            stopping,
            done,
        }
    }

    /// Accepts connections (binary on `listener`, RESP on `resp`) until `shutdown`
    /// completes. Never waits for anything but the next connection: at the cap, room
    /// is made by a task of the new connection's own ([`Acceptor::admit_at_cap`]).
    async fn serve(
        self: &Arc<Self>,
        listener: &TcpListener,
        resp: Option<&TcpListener>,
        shutdown: impl Future,
    ) {
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                biased;
                _ = &mut shutdown => return,
                accepted = listener.accept() => (accepted, false),
                accepted = accept_resp(resp) => (accepted, true),
            };
            let (accepted, is_resp) = accepted;
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Typically EMFILE: pausing lets connections close instead of spinning.
                    tracing::warn!("accept failed: {e}; pausing 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            match self.limit.clone().try_acquire_owned() {
                Ok(slot) => self.spawn_conn(stream, peer, slot, is_resp),
                Err(_) => self.admit_at_cap(stream, peer, is_resp),
            }
        }
    }

    /// At the cap: evicts a victim (see [`choose_victim`]) and, in a task of its own,
    /// waits for a free slot for the new connection, or refuses it at once when no
    /// connection may be evicted or too many already wait.
    fn admit_at_cap(self: &Arc<Self>, stream: TcpStream, peer: SocketAddr, is_resp: bool) {
        let Ok(waiting) = self.admitting.clone().try_acquire_owned() else {
            return self.refuse(stream, peer, is_resp);
        };
        if choose_victim(&self.conns, self.config.evict_min_idle).is_none() {
            return self.refuse(stream, peer, is_resp);
        }
        let this = self.clone();
        tokio::spawn(async move {
            let slot = tokio::time::timeout(EVICT_WAIT, this.limit.clone().acquire_owned()).await;
            drop(waiting);
            match slot {
                Ok(Ok(slot)) => this.spawn_conn(stream, peer, slot, is_resp),
                _ => this.refuse(stream, peer, is_resp),
            }
        });
    }

    /// Tells a connection over the cap that it is refused, in its protocol.
    fn refuse(&self, stream: TcpStream, peer: SocketAddr, is_resp: bool) {
        if self.config.tls.is_some() {
            tls::refuse_at_cap(peer, &self.stats);
        } else if is_resp {
            resp::refuse_at_cap(stream, peer, &self.refusing, &self.stats);
        } else {
            refuse_at_cap(stream, peer, &self.refusing, &self.config, &self.stats);
        }
    }

    /// Serves `stream` in its own task; the connection holds the slot `slot` until it
    /// ends or leaves ([`conn::ConnState::release_slot`]).
    fn spawn_conn(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        slot: OwnedSemaphorePermit,
        is_resp: bool,
    ) {
        let ctx = conn::Ctx {
            config: self.config.clone(),
            stats: self.stats.clone(),
            batch_tx: self.batch_tx.clone(),
            stopping: self.stopping.clone(),
            redirect: self.redirect.clone().unwrap_or_else(|| Arc::new(|| None)),
        };
        let state = Arc::new(conn::ConnState::new(self.config.max_in_flight_per_conn));
        state.hold_slot(slot);
        let key = self.next_conn.fetch_add(1, Relaxed);
        lock(&self.conns).insert(key, state.clone());
        let conns = self.conns.clone();
        let done = self.done.clone();
        let forward = self.forward.clone();
        tokio::spawn(async move {
            if is_resp {
                resp::serve(stream, peer, ctx, state.clone(), forward).await;
            } else {
                conn::serve(stream, peer, ctx, state.clone()).await;
            }
            lock(&conns).remove(&key);
            state.release_slot();
            drop(done);
        });
    }
}

/// The next connection on the RESP listener; never, without one.
async fn accept_resp(resp: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match resp {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// The open connections, by a broker-local key, for eviction at the cap.
type Conns = Arc<Mutex<HashMap<u64, Arc<conn::ConnState>>>>;

fn lock(conns: &Conns) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<conn::ConnState>>> {
    // Plain inserts and removes: a panic elsewhere cannot leave the map inconsistent.
    conns.lock().unwrap_or_else(|p| p.into_inner())
}

/// At the cap: asks one connection idle at least `min_idle` to leave, and returns how
/// long it was idle; `None` if every connection is busy, was active more recently, or
/// is already leaving. Connections not yet admitted (no handshake, or no token yet)
/// go first, then the longest idle. Each victim is chosen once (under the lock), so
/// concurrent admissions evict different connections.
fn choose_victim(conns: &Conns, min_idle: Duration) -> Option<Duration> {
    let now = Instant::now();
    let conns = lock(conns);
    let (_, idle, victim) = conns
        .values()
        .filter_map(|c| c.idle_for(now).map(|idle| (c.admitted(), idle, c)))
        .filter(|(_, idle, _)| *idle >= min_idle)
        .filter(|(_, _, c)| !c.leaving())
        .min_by_key(|(admitted, idle, _)| (*admitted, std::cmp::Reverse(*idle)))?;
    if !victim.choose_to_evict() {
        return None;
    }
    tracing::info!(
        ?idle,
        admitted = victim.admitted(),
        "connection cap reached: evicting the longest-idle connection"
    );
    victim.evict();
    Some(idle)
}

/// Tells a connection over the cap why it is closed (a `Refused`), so its client moves
/// on to another broker at once instead of waiting in the accept queue.
fn refuse_at_cap(
    stream: TcpStream,
    peer: SocketAddr,
    refusing: &Arc<Semaphore>,
    config: &BrokerConfig,
    stats: &Arc<Stats>,
) {
    stats.connections_total.fetch_add(1, Relaxed);
    stats.connections_dropped.fetch_add(1, Relaxed);
    let reason = format!(
        "connection cap ({}) reached and no connection idle for {:?}: try another broker or later",
        config.max_connections, config.evict_min_idle
    );
    tracing::info!(%peer, "connection refused: {reason}");
    let Ok(permit) = refusing.clone().try_acquire_owned() else {
        return; // too many refusals under way: just close
    };
    tokio::spawn(async move {
        let (mut rd, wr) = stream.into_split();
        let mut wr = FrameWriter::new(wr, REFUSE_LINGER);
        let linger = async {
            wr.send(&ServerMsg::Refused { reason }).await?;
            wr.shutdown().await?;
            let mut sink = [0u8; 512];
            while rd.read(&mut sink).await? > 0 {}
            Ok::<(), WireError>(())
        };
        let _ = tokio::time::timeout(REFUSE_LINGER, linger).await;
        drop(permit);
    });
}

async fn log_stats(stats: Arc<Stats>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        log_line(&stats.snapshot());
    }
}

fn log_line(s: &BrokerStats) {
    tracing::info!(
        connections = s.connections_open,
        requests = s.requests,
        ok = s.requests_ok,
        failed = s.requests_failed,
        ids = s.ids,
        rounds = s.rounds,
        rounds_failed = s.rounds_failed,
        mean_batch = format_args!("{:.1}", s.mean_batch()),
        max_batch = s.batch_max,
        mean_round_us = format_args!("{:.0}", s.mean_round_us()),
        max_round_us = s.round_us_max,
        "broker stats"
    );
}

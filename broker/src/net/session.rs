//! What the connections of both protocols share: the context every connection gets
//! ([`Ctx`]), what it holds ([`SlotHolder`]: its slot, activity and eviction), the
//! bounded wait for a client's bytes ([`wait_for_bytes`]), and the path of a `NextIds`
//! request into the batch queue ([`next_ids`]).

use crate::config::{BrokerConfig, AUTH_FAILURE_PAUSE};
use crate::net::refuse::Protocol;
use crate::net::tls::{self, TlsError};
use crate::serve::queue::{IdRequest, Outgoing};
use crate::serve::source::Admit;
use crate::stats::Stats;
use idproto::tls::{self as socket, ReadHalf, WriteHalf};
use idproto::wire::ServerMsg;
use idproto::IdError;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{sleep_until, Instant};

/// Replies sent without an in-flight permit (Welcome, Refused, the error before a
/// close): room for them in a connection's outbound queues on top of the permits.
pub(crate) const CONTROL_SLOTS: usize = 2;

/// Why a step both protocols share ended the connection; each protocol says it in its
/// own words (`ConnError`, `RespError`).
#[derive(Debug)]
pub(crate) enum SessionEnd {
    /// The connection's writer is gone (the client left, or did not read).
    WriterGone,
    /// The batcher stopped.
    BatcherGone,
    /// Evicted at the cap, after being idle this long.
    Evicted(Duration),
    /// No handshake (binary `Hello`, RESP token) within the handshake timeout.
    HandshakeTimeout(Duration),
    /// A partial frame or request not completed within the frame timeout.
    FrameTimeout(Duration),
    /// Nothing in flight and nothing partial for the idle timeout.
    IdleTimeout(Duration),
}

/// A connection holding one of the broker's slots, as the accept loop sees it to pick
/// one to evict at the cap, and as its own reader uses it: activity, requests in
/// flight, admission, eviction, and the slot itself.
#[derive(Debug)]
pub(crate) struct SlotHolder {
    pub(crate) epoch: Instant,
    /// Milliseconds after `epoch` of the last frame read or reply written.
    last_active_ms: AtomicU64,
    /// Part of a frame is buffered: the peer is mid-message, not idle.
    pub(crate) partial: AtomicBool,
    pub(crate) in_flight: Arc<Semaphore>,
    max_in_flight: usize,
    /// Set by the accept loop: close if still idle.
    pub(crate) evict: Notify,
    /// The client completed its handshake and, with a token configured, authenticated.
    /// Until then nothing it does counts as activity (see [`SlotHolder::idle_for`]).
    admitted: AtomicBool,
    /// Chosen as an eviction victim (or closing): not to be chosen again. Changed under
    /// the `slot` lock (read without it), so that a choice and a release do not cross.
    leaving: AtomicBool,
    /// The connection slot it holds, and who inherits it.
    slot: Mutex<Slot>,
}

/// A connection's slot, released when it leaves (before any linger), and the newcomer
/// that evicted it, if one did: the slot passes to that newcomer, never through the
/// pool, where a connection accepted meanwhile could take it and leave the newcomer
/// that made room refused.
#[derive(Debug, Default)]
struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    heir: Option<oneshot::Sender<OwnedSemaphorePermit>>,
}

impl SlotHolder {
    pub(crate) fn new(max_in_flight: usize) -> SlotHolder {
        SlotHolder {
            epoch: Instant::now(),
            last_active_ms: AtomicU64::new(0),
            partial: AtomicBool::new(false),
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            evict: Notify::new(),
            admitted: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            slot: Mutex::default(),
        }
    }

    /// A connection idle for `idle` at `now` (connected then, nothing since), admitted
    /// or not: what `choose_victim`'s tests set up without waiting.
    #[cfg(test)]
    pub(crate) fn idle_at(now: Instant, idle: Duration, admitted: bool) -> SlotHolder {
        let holder = SlotHolder::new(1);
        let holder = SlotHolder {
            epoch: now - idle,
            ..holder
        };
        holder.admitted.store(admitted, Relaxed);
        holder
    }

    pub(crate) fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_active_ms.fetch_max(ms, Relaxed);
    }

    pub(crate) fn last_active(&self) -> Instant {
        self.epoch + Duration::from_millis(self.last_active_ms.load(Relaxed))
    }

    /// How long the connection has been idle, `None` if it is busy (a request in
    /// flight or a partial frame). A connection not yet admitted is idle since it
    /// connected, whatever it sends: requests refused for want of a token, or a
    /// trickled frame, must not keep a slot from clients that have the token.
    pub(crate) fn idle_for(&self, now: Instant) -> Option<Duration> {
        if !self.admitted() {
            return Some(now.saturating_duration_since(self.epoch));
        }
        let busy =
            self.partial.load(Relaxed) || self.in_flight.available_permits() < self.max_in_flight;
        (!busy).then(|| now.saturating_duration_since(self.last_active()))
    }

    /// The client may now make requests: handshake done, token given (if needed).
    pub(crate) fn admit(&self) {
        self.touch();
        self.admitted.store(true, Relaxed);
    }

    pub(crate) fn admitted(&self) -> bool {
        self.admitted.load(Relaxed)
    }

    /// Marks the connection as an eviction victim, its slot promised to the receiver
    /// returned; `None` if it already was one (or is closing), so that concurrent
    /// admissions each pick a different victim.
    pub(crate) fn choose_to_evict(&self) -> Option<oneshot::Receiver<OwnedSemaphorePermit>> {
        let mut slot = self.lock_slot();
        if self.leaving.swap(true, Relaxed) {
            return None;
        }
        let (heir, inherits) = oneshot::channel();
        slot.heir = Some(heir);
        Some(inherits)
    }

    /// Asks the connection to close if it is (still) idle.
    pub(crate) fn evict(&self) {
        self.evict.notify_one();
    }

    /// Chosen as a victim, or closing: no longer a candidate for eviction.
    pub(crate) fn leaving(&self) -> bool {
        self.leaving.load(Relaxed)
    }

    /// An eviction request found the connection busy: it may be chosen again later,
    /// and the newcomer that chose it inherits nothing (it is refused at once).
    pub(crate) fn stay(&self) {
        let mut slot = self.lock_slot();
        self.leaving.store(false, Relaxed);
        slot.heir = None;
    }

    /// Holds `slot` until [`SlotHolder::release_slot`].
    pub(crate) fn hold_slot(&self, permit: OwnedSemaphorePermit) {
        self.lock_slot().permit = Some(permit);
    }

    /// Gives the connection slot up now: the connection is leaving (evicted, or
    /// lingering only so its client reads why). It goes to the newcomer that evicted
    /// the connection, if one did and still waits; else back to the pool.
    pub(crate) fn release_slot(&self) {
        let (permit, heir) = {
            let mut slot = self.lock_slot();
            self.leaving.store(true, Relaxed);
            (slot.permit.take(), slot.heir.take())
        };
        if let (Some(permit), Some(heir)) = (permit, heir) {
            // A newcomer that gave up waiting: the slot goes back to the pool.
            let _ = heir.send(permit);
        }
    }

    fn lock_slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        // Plain field moves: a panic elsewhere cannot leave it inconsistent.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The source's [`RoundSource::admit`](crate::RoundSource::admit), asked before a
/// request is queued.
pub(crate) type Admission = Arc<dyn Fn() -> Admit + Send + Sync>;

/// What every connection shares.
pub(crate) struct Ctx {
    pub config: Arc<BrokerConfig>,
    pub stats: Arc<Stats>,
    pub batch_tx: mpsc::Sender<IdRequest>,
    pub stopping: watch::Receiver<bool>,
    pub admit: Admission,
}

/// Runs one connection's `work` (of either protocol), counted open while it runs and
/// dropped when it ends in an error; logs how it ended (`what`: "connection", ...).
pub(crate) async fn counted<E: std::fmt::Display>(
    stats: &Stats,
    peer: SocketAddr,
    what: &str,
    work: impl Future<Output = Result<(), E>>,
) {
    stats.connections_open.fetch_add(1, Relaxed);
    stats.connections_total.fetch_add(1, Relaxed);
    match work.await {
        Ok(()) => tracing::debug!(%peer, "{what} closed"),
        Err(e) => {
            stats.connections_dropped.fetch_add(1, Relaxed);
            tracing::info!(%peer, "{what} dropped: {e}");
        }
    }
    stats.connections_open.fetch_sub(1, Relaxed);
}

/// The connection's halves: at once on a plain listener; on a TLS one after the TLS
/// handshake, within the handshake timeout from accept, raced with the broker stopping
/// and with eviction. `Ok(None)`: the client left, or the broker began stopping, first.
///
/// # Errors
/// A handshake that failed, timed out or never began (plain TCP: told so first, in
/// `protocol`), or the connection evicted meanwhile (its slot is released).
pub(crate) async fn open(
    stream: TcpStream,
    ctx: &Ctx,
    holder: &SlotHolder,
    protocol: Protocol,
) -> Result<Option<(ReadHalf, WriteHalf)>, TlsError> {
    let config = &ctx.config;
    let Some(listen_tls) = &config.tls else {
        return Ok(Some(socket::split_plain(stream)?));
    };
    let (limit, mut stopping) = (config.handshake_timeout, ctx.stopping.clone());
    tokio::select! {
        biased;
        _ = stopping.wait_for(|s| *s) => Ok(None),
        () = holder.evict.notified() => {
            // Not yet admitted: always idle, so always leaves.
            holder.release_slot();
            Err(TlsError::Evicted)
        }
        halves = tls::accept(listen_tls, stream, protocol, holder.epoch + limit, limit) => halves,
    }
}

/// Which limit bounds a connection's current wait for bytes.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    /// The handshake (binary `Hello`; RESP: the token) must be complete by then.
    Handshake(Instant),
    /// A partial frame (or request) must be complete by then (from its first byte).
    Frame(Instant),
    /// Nothing in flight, nothing partial: close at that time.
    Idle(Instant),
    /// Requests in flight: not idle; look again at that time.
    Busy(Instant),
}

impl Wait {
    /// The wait of an admitted connection: a partial frame must be complete by `frame`
    /// (its deadline, when one is buffered); else an idle one closes at the idle timeout.
    pub(crate) fn after(
        frame: Option<Instant>,
        holder: &SlotHolder,
        config: &BrokerConfig,
        now: Instant,
    ) -> Wait {
        if let Some(until) = frame {
            Wait::Frame(until)
        } else if holder.idle_for(now).is_some() {
            Wait::Idle(holder.last_active() + config.idle_timeout)
        } else {
            Wait::Busy(now + config.idle_timeout)
        }
    }

    pub(crate) fn until(self) -> Instant {
        match self {
            Wait::Handshake(t) | Wait::Frame(t) | Wait::Idle(t) | Wait::Busy(t) => t,
        }
    }
}

/// What a bounded wait for bytes came to, short of ending the connection.
pub(crate) enum Woken<T> {
    /// The read finished, with this.
    Read(T),
    /// The broker is stopping: read no more.
    Stopping,
    /// Nothing final (a busy connection's timer, an eviction found it busy): decide the
    /// next wait and wait again.
    Again,
}

/// Waits for `read` (a cancel-safe read of the client's bytes), bounded by `wait`, and
/// raced with the broker stopping, the writer going (`writer_closed`) and eviction. One
/// wait of the reader loop of either protocol.
///
/// # Errors
/// The limit of `wait` passed (an idle one only if the connection is still idle), the
/// writer is gone, or the connection was evicted while idle (its slot is released).
pub(crate) async fn wait_for_bytes<T>(
    ctx: &Ctx,
    holder: &SlotHolder,
    wait: Wait,
    writer_closed: impl Future<Output = ()>,
    read: impl Future<Output = T>,
) -> Result<Woken<T>, SessionEnd> {
    let config = &ctx.config;
    let mut stopping = ctx.stopping.clone();
    tokio::select! {
        biased;
        _ = stopping.wait_for(|s| *s) => Ok(Woken::Stopping),
        () = writer_closed => Err(SessionEnd::WriterGone),
        () = holder.evict.notified() => {
            // Only an idle connection gives up its slot (it may have woken up since).
            if let Some(idle) = holder.idle_for(Instant::now()) {
                holder.release_slot();
                return Err(SessionEnd::Evicted(idle));
            }
            holder.stay();
            Ok(Woken::Again)
        }
        r = read => Ok(Woken::Read(r)),
        () = sleep_until(wait.until()) => match wait {
            Wait::Handshake(_) => Err(SessionEnd::HandshakeTimeout(config.handshake_timeout)),
            Wait::Frame(_) => Err(SessionEnd::FrameTimeout(config.frame_timeout)),
            // A reply may have been written since the deadline was computed.
            Wait::Idle(_) if holder.idle_for(Instant::now()).is_some_and(|d| d >= config.idle_timeout) => {
                Err(SessionEnd::IdleTimeout(config.idle_timeout))
            }
            Wait::Idle(_) | Wait::Busy(_) => Ok(Woken::Again),
        },
    }
}

/// Counts a wrong or missing token, then pauses before the client hears of it: a
/// guesser gets a few tries a second per connection slot, not hundreds of thousands.
pub(crate) async fn auth_failed(stats: &Stats) {
    stats.auth_failures.fetch_add(1, Relaxed);
    tokio::time::sleep(AUTH_FAILURE_PAUSE).await;
}

/// Backpressure: with max_in_flight replies owed, stop reading until one is written.
pub(crate) async fn in_flight_permit(
    out_tx: &mpsc::Sender<Outgoing>,
    holder: &SlotHolder,
) -> Result<OwnedSemaphorePermit, SessionEnd> {
    tokio::select! {
        biased;
        () = out_tx.closed() => Err(SessionEnd::WriterGone),
        p = holder.in_flight.clone().acquire_owned() => p.map_err(|_| SessionEnd::WriterGone),
    }
}

/// Checks a `NextIds` request `(id, count, deadline_ms)` and queues it for the batcher
/// (or answers a bad count at once).
pub(crate) async fn next_ids(
    out_tx: &mpsc::Sender<Outgoing>,
    ctx: &Ctx,
    (id, count, deadline_ms): (u64, u64, u64),
    permit: OwnedSemaphorePermit,
) -> Result<(), SessionEnd> {
    let config = &ctx.config;
    ctx.stats.requests.fetch_add(1, Relaxed);
    if count == 0 || count > config.max_count {
        ctx.stats.requests_failed.fetch_add(1, Relaxed);
        let error =
            IdError::BadRequest(format!("count {count} is outside 1..={}", config.max_count));
        return queue_reply(out_tx, ServerMsg::Failed { id, error }, Some(permit)).await;
    }
    if let Admit::Redirect(leader) = (ctx.admit)() {
        // Not the leader: nothing is started for this request (DESIGN.md, "Leader and
        // followers"); the client resends it to `leader`.
        return queue_reply(out_tx, ServerMsg::Redirect { id, leader }, Some(permit)).await;
    }
    let requested = match deadline_ms {
        0 => config.default_deadline,
        ms => Duration::from_millis(ms).min(config.max_deadline),
    };
    let request = IdRequest {
        id,
        count,
        deadline: Instant::now() + requested,
        requested,
        reply: out_tx.clone(),
        permit: Some(permit),
    };
    ctx.batch_tx
        .send(request)
        .await
        .map_err(|_| SessionEnd::BatcherGone)
}

/// Queues `msg` for the writer; `permit` is released once it is written.
async fn queue_reply(
    out_tx: &mpsc::Sender<Outgoing>,
    msg: ServerMsg,
    permit: Option<OwnedSemaphorePermit>,
) -> Result<(), SessionEnd> {
    out_tx
        .send(Outgoing { msg, permit })
        .await
        .map_err(|_| SessionEnd::WriterGone)
}

//! One client connection: a reader (handshake, frames, timeouts, backpressure) and a
//! writer task (batches replies into few writes, bounded by a write timeout), both over
//! idproto's framed connection ([`idproto::framed`]), the one the broker client uses too,
//! over plain TCP or TLS (`crate::net::tls`: the handshake comes first, in this task).
//!
//! Every wait of the reader is bounded: the handshake by the handshake timeout, every
//! partial frame (header included) by the frame timeout, a connection with nothing in
//! flight by the idle timeout. Reads go through a cancel-safe [`FrameReader`], so all
//! of them are raced in one `select!` with shutdown and eviction.

use crate::serve::batcher::{Outgoing, Pending};
use crate::serve::source::Admit;
use crate::stats::Stats;
use crate::net::tls::{self, Proto, TlsError};
use crate::config::BrokerConfig;
use idclient::broker_tls::{ReadHalf, WriteHalf};
use idclient::IdError;
use idproto::framed::{FrameReader, FrameWriter};
use idproto::wire::{self, ClientMsg, ServerMsg, WireError};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{sleep_until, Instant};

/// Replies sent without an in-flight permit (Welcome, Refused): room for them in the
/// outbound queue on top of the permits.
const CONTROL_SLOTS: usize = 2;

/// Why a connection was closed by the broker.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    /// Its message is the whole story (no `source()`, so a chain prints it once).
    #[error("{0}")]
    Wire(WireError),
    #[error("no complete handshake within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("frame not completed within {0:?} of its first byte")]
    FrameTimeout(Duration),
    #[error("idle for {0:?} with no request in flight")]
    IdleTimeout(Duration),
    #[error("evicted: idle for {0:?} while the broker is at its connection cap")]
    Evicted(Duration),
    #[error("handshake refused: {0}")]
    BadHello(String),
    /// A missing or wrong token: the reason says nothing of what was sent.
    #[error("{}", wire::AUTH_FAILED)]
    AuthFailed,
    #[error("unexpected message: {0}")]
    Unexpected(&'static str),
    #[error("client did not read its replies within {0:?}")]
    WriteTimeout(Duration),
    #[error("writer stopped")]
    WriterGone,
    #[error("batcher stopped")]
    BatcherGone,
    #[error("{0}")]
    Tls(#[from] TlsError),
}

impl From<WireError> for ConnError {
    fn from(e: WireError) -> ConnError {
        match e {
            WireError::FrameTimeout(d) => ConnError::FrameTimeout(d),
            WireError::WriteTimeout(d) => ConnError::WriteTimeout(d),
            other => ConnError::Wire(other),
        }
    }
}

impl ConnError {
    /// Errors the peer should hear about: it is told why before the close.
    fn tell_peer(&self) -> bool {
        matches!(
            self,
            ConnError::Wire(_)
                | ConnError::BadHello(_)
                | ConnError::AuthFailed
                | ConnError::Unexpected(_)
                | ConnError::HandshakeTimeout(_)
                | ConnError::FrameTimeout(_)
                | ConnError::IdleTimeout(_)
                | ConnError::Evicted(_)
        )
    }
}

/// What the accept loop sees of a connection, to pick one to evict at the cap.
#[derive(Debug)]
pub(crate) struct ConnState {
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
    /// Until then nothing it does counts as activity (see [`ConnState::idle_for`]).
    admitted: AtomicBool,
    /// Chosen as an eviction victim (or closing): not to be chosen again.
    leaving: AtomicBool,
    /// The connection slot it holds; released when it leaves, before any linger.
    slot: Mutex<Option<OwnedSemaphorePermit>>,
}

impl ConnState {
    pub(crate) fn new(max_in_flight: usize) -> ConnState {
        ConnState {
            epoch: Instant::now(),
            last_active_ms: AtomicU64::new(0),
            partial: AtomicBool::new(false),
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            evict: Notify::new(),
            admitted: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            slot: Mutex::new(None),
        }
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

    /// Marks the connection as an eviction victim; `false` if it already was one (or
    /// is closing), so that concurrent admissions each pick a different victim.
    pub(crate) fn choose_to_evict(&self) -> bool {
        !self.leaving.swap(true, Relaxed)
    }

    /// Asks the connection to close if it is (still) idle.
    pub(crate) fn evict(&self) {
        self.evict.notify_one();
    }

    /// Chosen as a victim, or closing: no longer a candidate for eviction.
    pub(crate) fn leaving(&self) -> bool {
        self.leaving.load(Relaxed)
    }

    /// An eviction request found the connection busy: it may be chosen again later.
    pub(crate) fn stay(&self) {
        self.leaving.store(false, Relaxed);
    }

    /// Holds `slot` until [`ConnState::release_slot`].
    pub(crate) fn hold_slot(&self, slot: OwnedSemaphorePermit) {
        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(slot);
    }

    /// Gives the connection slot back now: the connection is leaving (evicted, or
    /// lingering only so its client reads why), and a waiting client may have it.
    pub(crate) fn release_slot(&self) {
        self.leaving.store(true, Relaxed);
        drop(self.slot.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// The source's [`RoundSource::admit`](crate::RoundSource::admit), asked before a
/// request is queued.
pub(crate) type Admission = Arc<dyn Fn() -> Admit + Send + Sync>;

/// What every connection shares.
pub(crate) struct Ctx {
    pub config: Arc<BrokerConfig>,
    pub stats: Arc<Stats>,
    pub batch_tx: mpsc::Sender<Pending>,
    pub stopping: watch::Receiver<bool>,
    pub admit: Admission,
}

/// Serves one connection until the peer leaves, misbehaves, idles out, is evicted or
/// the broker stops, and every request it sent has been answered. Never fails:
/// problems are logged.
pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, ctx: Ctx, state: Arc<ConnState>) {
    let stats = ctx.stats.clone();
    let work = async {
        match tls::accept(stream, &ctx, &state, Proto::Binary).await? {
            Some((rd, wr)) => handle(rd, wr, ctx, state).await,
            None => Ok(()),
        }
    };
    counted(&stats, peer, "connection", work).await;
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

async fn handle(
    rd: ReadHalf,
    wr: WriteHalf,
    ctx: Ctx,
    state: Arc<ConnState>,
) -> Result<(), ConnError> {
    let mut rd = FrameReader::new(rd, ctx.config.frame_timeout);
    let wr = FrameWriter::new(wr, ctx.config.write_timeout);
    let max_in_flight = ctx.config.max_in_flight_per_conn;
    let (out_tx, out_rx) = mpsc::channel(max_in_flight + CONTROL_SLOTS);
    let writer = tokio::spawn(write_loop(wr, out_rx, state.clone()));
    let read = read_loop(&mut rd, &out_tx, &ctx, &state).await;
    if let Err(e) = &read {
        if e.tell_peer() {
            let _ = out_tx.try_send(Outgoing {
                msg: ServerMsg::Refused {
                    reason: e.to_string(),
                },
                permit: None,
            });
        }
    }
    drop(out_tx);
    // The writer ends once every request of this connection has been answered (the
    // batcher holds a sender per pending request) and written, or on a write timeout.
    let write = match writer.await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("connection writer task failed: {e}");
            Err(ConnError::WriterGone)
        }
    };
    match (read, write) {
        (_, Err(e)) => Err(e),
        (r, Ok(())) => r,
    }
}

/// Which limit bounds the current wait for bytes.
#[derive(Clone, Copy)]
enum Wait {
    /// The Hello must be complete by then (from accept).
    Handshake(Instant),
    /// A partial frame must be complete by then (from when its first byte was seen).
    Frame(Instant),
    /// Nothing in flight, nothing partial: close at that time.
    Idle(Instant),
    /// Requests in flight: not idle; look again at that time.
    Busy(Instant),
}

impl Wait {
    fn until(self) -> Instant {
        match self {
            Wait::Handshake(t) | Wait::Frame(t) | Wait::Idle(t) | Wait::Busy(t) => t,
        }
    }
}

/// The next message, or `None` when the peer closed at a frame boundary or the broker is
/// stopping. Every wait is bounded (see [`Wait`]). `handshake` is set for the Hello.
async fn next_msg(
    rd: &mut FrameReader<ReadHalf>,
    out_tx: &mpsc::Sender<Outgoing>,
    ctx: &Ctx,
    state: &ConnState,
    handshake: Option<Instant>,
) -> Result<Option<ClientMsg>, ConnError> {
    let config = &ctx.config;
    let mut stopping = ctx.stopping.clone();
    loop {
        if let Some(msg) = rd.next_with(wire::decode_client)? {
            state.partial.store(false, Relaxed);
            state.touch();
            return Ok(Some(msg));
        }
        state.partial.store(rd.partial(), Relaxed);
        let now = Instant::now();
        let wait = if let Some(until) = handshake {
            Wait::Handshake(until)
        } else if let Some(until) = rd.frame_deadline() {
            Wait::Frame(until)
        } else if state.idle_for(now).is_some() {
            Wait::Idle(state.last_active() + config.idle_timeout)
        } else {
            Wait::Busy(now + config.idle_timeout)
        };
        tokio::select! {
            biased;
            _ = stopping.wait_for(|s| *s) => return Ok(None),
            () = out_tx.closed() => return Err(ConnError::WriterGone),
            () = state.evict.notified() => {
                // Only an idle connection gives up its slot (it may have woken up since).
                if let Some(idle) = state.idle_for(Instant::now()) {
                    state.release_slot();
                    return Err(ConnError::Evicted(idle));
                }
                state.stay();
            }
            n = rd.fill() => {
                if n? == 0 {
                    return if rd.partial() {
                        Err(WireError::Truncated.into())
                    } else {
                        Ok(None)
                    };
                }
            }
            () = sleep_until(wait.until()) => match wait {
                Wait::Handshake(_) => return Err(ConnError::HandshakeTimeout(config.handshake_timeout)),
                Wait::Frame(_) => return Err(ConnError::FrameTimeout(config.frame_timeout)),
                Wait::Idle(_) => {
                    // A reply may have been written since the deadline was computed.
                    if state.idle_for(Instant::now()).is_some_and(|d| d >= config.idle_timeout) {
                        return Err(ConnError::IdleTimeout(config.idle_timeout));
                    }
                }
                Wait::Busy(_) => {}
            },
        }
    }
}

/// Reads the Hello and answers it: `Ok(false)` if the peer left (or the broker stops)
/// before sending it.
async fn handshake(
    rd: &mut FrameReader<ReadHalf>,
    out_tx: &mpsc::Sender<Outgoing>,
    ctx: &Ctx,
    state: &ConnState,
) -> Result<bool, ConnError> {
    let until = state.epoch + ctx.config.handshake_timeout;
    match next_msg(rd, out_tx, ctx, state, Some(until)).await? {
        None => return Ok(false),
        Some(ClientMsg::Hello {
            magic,
            version,
            token,
        }) if magic == wire::MAGIC && version == wire::VERSION => {
            if let Some(want) = &ctx.config.auth_token {
                let presented = token.as_deref().unwrap_or_default().as_bytes();
                if !want.matches(presented) {
                    auth_failed(&ctx.stats).await;
                    // Never says what was sent, nor whether anything was.
                    return Err(ConnError::AuthFailed);
                }
            }
            state.admit();
        }
        Some(ClientMsg::Hello { magic, version, .. }) if magic == wire::MAGIC => {
            return Err(ConnError::BadHello(format!(
                "protocol version {version} not supported (this broker speaks {})",
                wire::VERSION
            )));
        }
        Some(ClientMsg::Hello { magic, .. }) => {
            return Err(ConnError::BadHello(format!(
                "bad magic {magic:02x?}, expected {:02x?}",
                wire::MAGIC
            )));
        }
        Some(_) => return Err(ConnError::Unexpected("a request before Hello")),
    }
    let config = &ctx.config;
    let welcome = ServerMsg::Welcome {
        version: wire::VERSION,
        max_count: config.max_count,
        max_in_flight: u32::try_from(config.max_in_flight_per_conn).unwrap_or(u32::MAX),
    };
    reply(out_tx, welcome, None).await?;
    Ok(true)
}

/// Counts a wrong or missing token, then pauses before the client hears of it: a
/// guesser gets a few tries a second per connection slot, not hundreds of thousands.
pub(crate) async fn auth_failed(stats: &Stats) {
    stats.auth_failures.fetch_add(1, Relaxed);
    tokio::time::sleep(crate::config::AUTH_FAILURE_PAUSE).await;
}

/// Handshake, then requests until the peer leaves or the broker stops.
async fn read_loop(
    rd: &mut FrameReader<ReadHalf>,
    out_tx: &mpsc::Sender<Outgoing>,
    ctx: &Ctx,
    state: &ConnState,
) -> Result<(), ConnError> {
    if !handshake(rd, out_tx, ctx, state).await? {
        return Ok(());
    }
    while let Some(msg) = next_msg(rd, out_tx, ctx, state, None).await? {
        let permit = in_flight_permit(out_tx, state).await?;
        match msg {
            ClientMsg::NextIds {
                id,
                count,
                deadline_ms,
            } => next_ids(out_tx, ctx, (id, count, deadline_ms), permit).await?,
            ClientMsg::Stats { id } => {
                let stats = Box::new(ctx.stats.snapshot());
                reply(out_tx, ServerMsg::Stats { id, stats }, Some(permit)).await?;
            }
            ClientMsg::Hello { .. } => return Err(ConnError::Unexpected("a second Hello")),
        }
    }
    Ok(())
}

/// Backpressure: with max_in_flight replies owed, stop reading until one is written.
pub(crate) async fn in_flight_permit(
    out_tx: &mpsc::Sender<Outgoing>,
    state: &ConnState,
) -> Result<OwnedSemaphorePermit, ConnError> {
    tokio::select! {
        biased;
        () = out_tx.closed() => Err(ConnError::WriterGone),
        p = state.in_flight.clone().acquire_owned() => p.map_err(|_| ConnError::WriterGone),
    }
}

/// Checks a `NextIds` request `(id, count, deadline_ms)` and queues it for the batcher
/// (or answers a bad count at once).
pub(crate) async fn next_ids(
    out_tx: &mpsc::Sender<Outgoing>,
    ctx: &Ctx,
    (id, count, deadline_ms): (u64, u64, u64),
    permit: OwnedSemaphorePermit,
) -> Result<(), ConnError> {
    let config = &ctx.config;
    ctx.stats.requests.fetch_add(1, Relaxed);
    if count == 0 || count > config.max_count {
        ctx.stats.requests_failed.fetch_add(1, Relaxed);
        let error =
            IdError::BadRequest(format!("count {count} is outside 1..={}", config.max_count));
        return reply(out_tx, ServerMsg::Failed { id, error }, Some(permit)).await;
    }
    if let Admit::Redirect(leader) = (ctx.admit)() {
        // Not the leader: nothing is started for this request (DESIGN.md, "Leader and
        // followers"); the client resends it to `leader`.
        return reply(out_tx, ServerMsg::Redirect { id, leader }, Some(permit)).await;
    }
    let requested = match deadline_ms {
        0 => config.default_deadline,
        ms => Duration::from_millis(ms).min(config.max_deadline),
    };
    let pending = Pending {
        id,
        count,
        deadline: Instant::now() + requested,
        requested,
        reply: out_tx.clone(),
        permit: Some(permit),
    };
    ctx.batch_tx
        .send(pending)
        .await
        .map_err(|_| ConnError::BatcherGone)
}

/// Queues `msg` for the writer; `permit` is released once it is written.
async fn reply(
    out_tx: &mpsc::Sender<Outgoing>,
    msg: ServerMsg,
    permit: Option<OwnedSemaphorePermit>,
) -> Result<(), ConnError> {
    out_tx
        .send(Outgoing { msg, permit })
        .await
        .map_err(|_| ConnError::WriterGone)
}

/// Writes replies as they come, as many per write as are queued, until every sender is
/// gone; then shuts the write side down.
async fn write_loop(
    mut wr: FrameWriter<WriteHalf>,
    mut rx: mpsc::Receiver<Outgoing>,
    state: Arc<ConnState>,
) -> Result<(), ConnError> {
    // Held until their replies are on the wire: that is what bounds a slow reader.
    let mut permits = Vec::new();
    loop {
        let written = wr
            .write_batch(&mut rx, |w, out| {
                push(w, &out.msg);
                permits.push(out.permit);
                Ok(())
            })
            .await?;
        if written == 0 {
            break;
        }
        // Active before the permits are released, so it is never seen idle in between.
        state.touch();
        permits.clear();
    }
    let _ = wr.shutdown().await;
    Ok(())
}

/// Encodes `msg`; a reply too large for a frame (an error listing absurdly many nodes)
/// is replaced by a short error so the request still gets its answer.
fn push(w: &mut FrameWriter<WriteHalf>, msg: &ServerMsg) {
    if let Err(e) = w.push(msg) {
        tracing::error!("reply not encodable ({e}): sending a short error instead");
        let reason = format!("reply not encodable: {e}");
        let fallback = match msg.request_id() {
            Some(id) => ServerMsg::Failed {
                id,
                error: IdError::Protocol {
                    addr: "broker".into(),
                    reason,
                },
            },
            None => ServerMsg::Refused { reason },
        };
        if let Err(e) = w.push(&fallback) {
            tracing::error!("fallback reply not encodable either: {e}");
        }
    }
}

//! One client connection: a reader (handshake, frames, timeouts, backpressure) and a
//! writer task (batches replies into few writes, bounded by a write timeout), both over
//! idproto's framed connection ([`idproto::framed`]), the one the broker client uses too,
//! over plain TCP or TLS (`crate::net::tls`: the handshake comes first, in this task).
//!
//! Every wait of the reader is bounded: the handshake by the handshake timeout, every
//! partial frame (header included) by the frame timeout, a connection with nothing in
//! flight by the idle timeout. Reads go through a cancel-safe [`FrameReader`], so all
//! of them are raced in one `select!` with shutdown and eviction.

use crate::net::refuse::Protocol;
use crate::net::session::{
    self, counted, in_flight_permit, next_ids, wait_for_bytes, Ctx, SessionEnd, SlotHolder, Wait,
    Woken, CONTROL_SLOTS,
};
use crate::net::tls::TlsError;
use crate::serve::queue::Outgoing;
use idclient::IdError;
use idproto::framed::{FrameReader, FrameWriter};
use idproto::tls::{ReadHalf, WriteHalf};
use idproto::wire::{self, ClientMsg, ServerMsg, WireError};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::Instant;

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

impl From<SessionEnd> for ConnError {
    fn from(e: SessionEnd) -> ConnError {
        match e {
            SessionEnd::WriterGone => ConnError::WriterGone,
            SessionEnd::BatcherGone => ConnError::BatcherGone,
            SessionEnd::Evicted(idle) => ConnError::Evicted(idle),
            SessionEnd::HandshakeTimeout(d) => ConnError::HandshakeTimeout(d),
            SessionEnd::FrameTimeout(d) => ConnError::FrameTimeout(d),
            SessionEnd::IdleTimeout(d) => ConnError::IdleTimeout(d),
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

/// Serves one connection until the peer leaves, misbehaves, idles out, is evicted or
/// the broker stops, and every request it sent has been answered. Never fails:
/// problems are logged.
pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, ctx: Ctx, state: Arc<SlotHolder>) {
    let stats = ctx.stats.clone();
    let work = async {
        match session::open(stream, &ctx, &state, Protocol::Binary).await? {
            Some((rd, wr)) => handle(rd, wr, ctx, state).await,
            None => Ok(()),
        }
    };
    counted(&stats, peer, "connection", work).await;
}

async fn handle(
    rd: ReadHalf,
    wr: WriteHalf,
    ctx: Ctx,
    state: Arc<SlotHolder>,
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

/// The next message, or `None` when the peer closed at a frame boundary or the broker is
/// stopping. Every wait is bounded (see [`Wait`]). `handshake` is set for the Hello.
async fn next_msg(
    rd: &mut FrameReader<ReadHalf>,
    out_tx: &mpsc::Sender<Outgoing>,
    ctx: &Ctx,
    state: &SlotHolder,
    handshake: Option<Instant>,
) -> Result<Option<ClientMsg>, ConnError> {
    loop {
        if let Some(msg) = rd.next_with(wire::decode_client)? {
            state.partial.store(false, Relaxed);
            state.touch();
            return Ok(Some(msg));
        }
        state.partial.store(rd.partial(), Relaxed);
        let wait = match handshake {
            Some(until) => Wait::Handshake(until),
            None => Wait::after(rd.frame_deadline(), state, &ctx.config, Instant::now()),
        };
        match wait_for_bytes(ctx, state, wait, out_tx.closed(), rd.fill()).await? {
            Woken::Read(n) => {
                if n? == 0 {
                    return if rd.partial() {
                        Err(WireError::Truncated.into())
                    } else {
                        Ok(None)
                    };
                }
            }
            Woken::Again => {}
            Woken::Stopping => return Ok(None),
        }
    }
}

/// Reads the Hello and answers it: `Ok(false)` if the peer left (or the broker stops)
/// before sending it.
async fn handshake(
    rd: &mut FrameReader<ReadHalf>,
    out_tx: &mpsc::Sender<Outgoing>,
    ctx: &Ctx,
    state: &SlotHolder,
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
                    session::auth_failed(&ctx.stats).await;
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

/// Handshake, then requests until the peer leaves or the broker stops.
async fn read_loop(
    rd: &mut FrameReader<ReadHalf>,
    out_tx: &mpsc::Sender<Outgoing>,
    ctx: &Ctx,
    state: &SlotHolder,
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
    state: Arc<SlotHolder>,
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

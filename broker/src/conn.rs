//! One client connection: a reader (handshake, frames, backpressure) and a writer task
//! (batches replies into few writes, bounded by a write timeout).

use crate::batcher::{Outgoing, Pending};
use crate::stats::Stats;
use crate::BrokerConfig;
use idclient::wire::{self, ClientMsg, ServerMsg, WireError};
use idclient::IdError;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::time::{timeout, Instant};

/// Socket read buffer: a few hundred pipelined requests per read system call.
const READ_BUF: usize = 16 * 1024;

/// The writer flushes once this much is buffered even if more replies are waiting, so
/// one slow burst cannot grow the buffer without bound.
const WRITE_BUF: usize = 64 * 1024;

/// Replies sent without an in-flight permit (Welcome, Refused): room for them in the
/// outbound queue on top of the permits.
const CONTROL_SLOTS: usize = 2;

/// Why a connection was closed by the broker.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("{0}")]
    Wire(#[from] WireError),
    #[error("no complete handshake within {0:?}")]
    HandshakeTimeout(std::time::Duration),
    #[error("frame not completed within {0:?} of its header")]
    FrameTimeout(std::time::Duration),
    #[error("handshake refused: {0}")]
    BadHello(String),
    #[error("unexpected message: {0}")]
    Unexpected(&'static str),
    #[error("client did not read its replies within {0:?}")]
    WriteTimeout(std::time::Duration),
    #[error("writer stopped")]
    WriterGone,
    #[error("batcher stopped")]
    BatcherGone,
}

impl ConnError {
    /// Errors the peer caused by what it sent: it is told why before the close.
    fn tell_peer(&self) -> bool {
        matches!(
            self,
            ConnError::Wire(_)
                | ConnError::BadHello(_)
                | ConnError::Unexpected(_)
                | ConnError::HandshakeTimeout(_)
                | ConnError::FrameTimeout(_)
        )
    }
}

/// What every connection shares.
pub(crate) struct Ctx {
    pub config: Arc<BrokerConfig>,
    pub stats: Arc<Stats>,
    pub batch_tx: mpsc::Sender<Pending>,
    pub stopping: watch::Receiver<bool>,
}

/// Serves one connection until the peer leaves, misbehaves or the broker stops, and
/// every request it sent has been answered. Never fails: problems are logged.
pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, ctx: Ctx) {
    ctx.stats.connections_open.fetch_add(1, Relaxed);
    ctx.stats.connections_total.fetch_add(1, Relaxed);
    let stats = ctx.stats.clone();
    match handle(stream, ctx).await {
        Ok(()) => tracing::debug!(%peer, "connection closed"),
        Err(e) => {
            stats.connections_dropped.fetch_add(1, Relaxed);
            tracing::info!(%peer, "connection dropped: {e}");
        }
    }
    stats.connections_open.fetch_sub(1, Relaxed);
}

async fn handle(stream: TcpStream, ctx: Ctx) -> Result<(), ConnError> {
    // Replies are small and latency-bound: do not let Nagle hold them back.
    stream.set_nodelay(true).map_err(WireError::from)?;
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(READ_BUF, rd);
    let max_in_flight = ctx.config.max_in_flight_per_conn;
    let (out_tx, out_rx) = mpsc::channel(max_in_flight + CONTROL_SLOTS);
    let writer = tokio::spawn(write_loop(wr, out_rx, ctx.config.write_timeout));
    let read = read_loop(&mut rd, &out_tx, &ctx).await;
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

async fn read_loop(
    rd: &mut BufReader<OwnedReadHalf>,
    out_tx: &mpsc::Sender<Outgoing>,
    ctx: &Ctx,
) -> Result<(), ConnError> {
    let config = &ctx.config;
    let mut stopping = ctx.stopping.clone();
    let mut buf = Vec::new();
    let handshake = config.handshake_timeout;
    let hello = match timeout(handshake, wire::read_msg::<ClientMsg, _>(rd, &mut buf)).await {
        Err(_) => return Err(ConnError::HandshakeTimeout(handshake)),
        Ok(r) => r?,
    };
    match hello {
        None => return Ok(()),
        Some(ClientMsg::Hello { magic, version })
            if magic == wire::MAGIC && version == wire::VERSION => {}
        Some(ClientMsg::Hello { magic, version }) if magic == wire::MAGIC => {
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
    let welcome = ServerMsg::Welcome {
        version: wire::VERSION,
        max_count: config.max_count,
        max_in_flight: u32::try_from(config.max_in_flight_per_conn).unwrap_or(u32::MAX),
    };
    out_tx
        .send(Outgoing {
            msg: welcome,
            permit: None,
        })
        .await
        .map_err(|_| ConnError::WriterGone)?;

    let in_flight = Arc::new(Semaphore::new(config.max_in_flight_per_conn));
    loop {
        let len = tokio::select! {
            biased;
            _ = stopping.wait_for(|s| *s) => return Ok(()),
            () = out_tx.closed() => return Err(ConnError::WriterGone),
            header = wire::read_header(rd) => match header? {
                None => return Ok(()),
                Some(len) => len,
            },
        };
        match timeout(
            config.handshake_timeout,
            wire::read_payload(rd, len, &mut buf),
        )
        .await
        {
            Err(_) => return Err(ConnError::FrameTimeout(config.handshake_timeout)),
            Ok(r) => r?,
        }
        let msg: ClientMsg = wire::decode(&buf)?;
        // Backpressure: with max_in_flight replies owed, stop reading until one is written.
        let permit = tokio::select! {
            biased;
            () = out_tx.closed() => return Err(ConnError::WriterGone),
            p = in_flight.clone().acquire_owned() => p.map_err(|_| ConnError::WriterGone)?,
        };
        match msg {
            ClientMsg::NextIds {
                id,
                count,
                deadline_ms,
            } => {
                ctx.stats.requests.fetch_add(1, Relaxed);
                if count == 0 || count > config.max_count {
                    ctx.stats.requests_failed.fetch_add(1, Relaxed);
                    let error = IdError::BadRequest(format!(
                        "count {count} is outside 1..={}",
                        config.max_count
                    ));
                    let msg = ServerMsg::Failed { id, error };
                    out_tx
                        .send(Outgoing {
                            msg,
                            permit: Some(permit),
                        })
                        .await
                        .map_err(|_| ConnError::WriterGone)?;
                    continue;
                }
                let requested = match deadline_ms {
                    0 => config.default_deadline,
                    ms => std::time::Duration::from_millis(ms).min(config.max_deadline),
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
                    .map_err(|_| ConnError::BatcherGone)?;
            }
            ClientMsg::Stats { id } => {
                let msg = ServerMsg::Stats {
                    id,
                    stats: ctx.stats.snapshot(),
                };
                out_tx
                    .send(Outgoing {
                        msg,
                        permit: Some(permit),
                    })
                    .await
                    .map_err(|_| ConnError::WriterGone)?;
            }
            ClientMsg::Hello { .. } => return Err(ConnError::Unexpected("a second Hello")),
        }
    }
}

async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Outgoing>,
    write_timeout: std::time::Duration,
) -> Result<(), ConnError> {
    let mut buf = Vec::with_capacity(WRITE_BUF);
    // Held until their replies are on the wire: that is what bounds a slow reader.
    let mut permits = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(out) = next.take() {
            push(&mut buf, &out.msg);
            permits.push(out.permit);
            if buf.len() >= WRITE_BUF {
                break;
            }
            next = rx.try_recv().ok();
        }
        match timeout(write_timeout, wr.write_all(&buf)).await {
            Err(_) => return Err(ConnError::WriteTimeout(write_timeout)),
            Ok(r) => r.map_err(WireError::from)?,
        }
        buf.clear();
        permits.clear();
    }
    let _ = timeout(write_timeout, wr.shutdown()).await;
    Ok(())
}

/// Encodes `msg`; a reply too large for a frame (an error listing absurdly many nodes)
/// is replaced by a short error so the request still gets its answer.
fn push(buf: &mut Vec<u8>, msg: &ServerMsg) {
    if let Err(e) = wire::encode(msg, buf) {
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
        if let Err(e) = wire::encode(&fallback, buf) {
            tracing::error!("fallback reply not encodable either: {e}");
        }
    }
}

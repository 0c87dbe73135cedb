//! One framed connection to one broker: the handshake, a reader task that routes replies
//! to the requests waiting for them, and a writer task that batches requests.

use super::BrokerClientConfig;
use crate::broker_tls::{self, ReadHalf, WriteHalf};
use crate::{BrokerTls, IdError};
use idproto::auth::Token;
use idproto::framed::{FrameReader, FrameWriter, Timeouts};
use idproto::wire::{self, ClientMsg, ServerMsg, WireError};
use idproto::NodeFailure;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};

/// Requests waiting for a connection's writer. Callers wait (within their deadline)
/// when it is full, so a stalled broker cannot make the client queue without bound.
const WRITE_QUEUE: usize = 4096;

/// A reply routed to a waiting caller.
pub(super) enum Reply {
    Msg(ServerMsg),
    /// The connection broke before the reply came: outcome unknown.
    Lost(String),
}

#[derive(Default)]
pub(super) struct PendingTable {
    pub(super) waiting: HashMap<u64, oneshot::Sender<Reply>>,
    /// Set once: the connection is unusable, and why.
    pub(super) broken: Option<String>,
    /// It broke with no caller waiting (e.g. the broker closed it for idleness): no
    /// reason to think the broker is in trouble.
    quiet: bool,
}

/// State shared by a connection's handle, its reader and its writer.
pub(super) struct Shared {
    pub(super) addr: String,
    pending: Mutex<PendingTable>,
    /// True once broken: stops the reader and the writer.
    dead: watch::Sender<bool>,
    /// The broker is shutting down or is not the leader: send it nothing new, let what
    /// it owes arrive.
    pub(super) draining: AtomicBool,
}

impl Shared {
    pub(super) fn table(&self) -> MutexGuard<'_, PendingTable> {
        // A panic while holding this lock leaves the table consistent (plain inserts
        // and removes), so a poisoned lock is still usable.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the connection broken and tells every waiting caller (once).
    pub(super) fn fail(&self, reason: String) {
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

    pub(super) fn usable(&self) -> bool {
        !self.draining.load(Relaxed) && self.table().broken.is_none()
    }

    /// Closed for a reason that says nothing bad about the broker.
    pub(super) fn closed_quietly(&self) -> bool {
        !self.draining.load(Relaxed) && self.table().quiet
    }
}

/// One open connection to one broker.
pub(super) struct Conn {
    pub(super) broker: usize,
    pub(super) shared: Arc<Shared>,
    pub(super) tx: mpsc::Sender<ClientMsg>,
    pub(super) max_count: u64,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // The last handle is gone: close the socket (stops reader and writer).
        self.shared
            .fail("connection closed by the client".to_string());
    }
}

/// How the handshake error of a broker that refused the client's token (or its lack of
/// one) ends.
const TOKEN_REFUSED: &str = "refused the token";

/// True if `e` is a broker's refusal of the client's token.
pub(super) fn refused_token(e: &IdError) -> bool {
    matches!(e, IdError::Protocol { reason, .. } if reason.ends_with(TOKEN_REFUSED))
}

/// What a [`WireError`] on the connection to `addr` means to a caller: the broker is
/// unreachable (I/O, timeouts), or it broke the protocol (anything else).
pub(super) fn wire_error(addr: &str, e: WireError) -> IdError {
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
pub(super) fn open_failure(e: IdError) -> String {
    match e {
        IdError::BrokersUnavailable { mut failures } if failures.len() == 1 => {
            failures.remove(0).reason
        }
        IdError::Protocol { reason, .. } => format!("protocol error: {reason}"),
        e => e.to_string(),
    }
}

/// A framed connection to `addr` after the handshake, and the broker's `max_count`.
pub(super) type Handshaken = (FrameReader<ReadHalf>, FrameWriter<WriteHalf>, u64);

/// Connects (over TLS with `tls`) and handshakes; returns the framed connection and the
/// broker's `max_count`.
pub(super) async fn handshake(
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
pub(super) async fn open(
    broker: usize,
    addr: &str,
    config: &BrokerClientConfig,
) -> Result<Conn, IdError> {
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
        draining: AtomicBool::new(false),
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

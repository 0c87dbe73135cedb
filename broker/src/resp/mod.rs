//! The RESP listener (`idbroker --resp-listen`): any Redis client is an idbroker client.
//!
//! Requests are decoded by the `redis-protocol` crate's RESP2 decoder (clients send
//! arrays of bulk strings in RESP2 and RESP3 alike); replies are encoded by its RESP2 or
//! RESP3 encoder, whichever the client chose with `HELLO`. `QLIST.NEXT` requests go to
//! the batcher through the same queue, with the same checks, deadline and in-flight
//! permits as binary ones ([`conn::next_ids`]), so they share rounds with binary
//! clients. Connection slots, eviction and the counters are the binary listener's.
//!
//! Order: Redis clients match replies to requests by position, while batches may answer
//! out of order (a request that hits its deadline, a local reply next to one waiting
//! for a round). Every request takes the next sequence number of its connection (the
//! batcher sees it as the request id) and the writer puts replies back in that order.
//!
//! Hostile input costs only its connection: a request larger than [`MAX_REQUEST_LEN`]
//! (whatever length it declares, nothing is allocated for more), anything but an array
//! of bulk strings (inline commands included: refused, see below), a request not
//! completed within the frame timeout, and a connection idle past the idle timeout are
//! told why (`-ERR ...`) and closed; a client that pipelines without reading stops being
//! read at the in-flight cap.
//!
//! Followers: on a broker that does not lead (leader election), `QLIST.NEXT` is
//! forwarded to the leader ([`crate::forward`]) by a task of its own that holds the
//! request's in-flight permit and sequence number, so its reply takes its place in
//! order like any other, and later requests wait for it at most until its deadline.
//!
//! Inline commands (`PING\r\n` typed into telnet) are refused rather than supported: no
//! Redis client sends them, and the RESP decoder is the only parser here.

mod command;
mod reply;

use crate::batcher::{Outgoing, Pending};
use crate::conn::{self, ConnState, Ctx};
use crate::forward::{Forwarded, Forwarder};
use crate::stats::Stats;
use crate::tls::{self, TlsError};
use crate::BrokerConfig;
use command::{command, Action, Session};
use idclient::broker_tls::{ReadHalf, WriteHalf};
use idproto::wire::ServerMsg;
use idproto::IdError;
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame as Frame2;
use reply::{echo, server_reply, Proto, Reply};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::{sleep_until, Instant};

/// Largest request, in bytes. A qlist command is a few dozen bytes (a `HELLO` with a
/// long token a few hundred); the cap bounds each connection's buffer, and, since the
/// decoder re-reads an incomplete request each time bytes arrive, the work a client
/// sending one byte at a time can cause (quadratic in this cap, once per frame timeout).
pub const MAX_REQUEST_LEN: usize = 16 * 1024;

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 4096;

/// Replies sent without an in-flight permit (the error before a close): room for them
/// in the queues on top of the permits.
const CONTROL_SLOTS: usize = 2;

/// How long, and how many bytes, a connection closed with an error is drained (see
/// [`linger`]): enough for a client to read the error, too little to hold a slot.
const LINGER: Duration = Duration::from_millis(500);
const LINGER_BYTES: usize = 1 << 20;

/// Why a RESP connection was closed by the broker.
#[derive(Debug, thiserror::Error)]
enum RespError {
    #[error("Protocol error: {0}")]
    Protocol(String),
    #[error("Protocol error: request larger than {MAX_REQUEST_LEN} bytes")]
    TooLarge,
    #[error("request not completed within {0:?} of its first byte")]
    FrameTimeout(Duration),
    #[error("idle for {0:?} with no request in flight")]
    IdleTimeout(Duration),
    #[error("evicted: idle for {0:?} while the broker is at its connection cap")]
    Evicted(Duration),
    #[error("connection closed in the middle of a request")]
    Truncated,
    #[error("client did not read its replies within {0:?}")]
    WriteTimeout(Duration),
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("writer stopped")]
    WriterGone,
    #[error("batcher stopped")]
    BatcherGone,
    #[error("{0}")]
    Tls(#[from] TlsError),
}

impl RespError {
    /// Errors the peer should hear about (as `-ERR ...`) before the close.
    fn tell_peer(&self) -> bool {
        matches!(
            self,
            RespError::Protocol(_)
                | RespError::TooLarge
                | RespError::FrameTimeout(_)
                | RespError::IdleTimeout(_)
                | RespError::Evicted(_)
        )
    }
}

impl From<conn::ConnError> for RespError {
    fn from(e: conn::ConnError) -> RespError {
        match e {
            conn::ConnError::BatcherGone => RespError::BatcherGone,
            _ => RespError::WriterGone,
        }
    }
}

/// A reply the reader produced itself, at position `seq` of the connection.
struct Local {
    seq: u64,
    reply: Reply,
    /// For `HELLO`: the version this reply and every later one is encoded in.
    switch: Option<Proto>,
    permit: Option<OwnedSemaphorePermit>,
}

/// Serves one RESP connection until the peer leaves (or says `QUIT`), misbehaves, idles
/// out, is evicted or the broker stops, and every request it sent has been answered.
/// Never fails: problems are logged.
/// `forward`: the broker takes part in an election; `QLIST.NEXT` is forwarded to the
/// leader while it does not lead.
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: Ctx,
    state: Arc<ConnState>,
    forward: Option<Arc<Forwarder>>,
) {
    let stats = ctx.stats.clone();
    let work = async {
        match tls::accept(stream, &ctx, &state, tls::Proto::Resp).await? {
            Some((rd, wr)) => handle(rd, wr, ctx, state, forward).await,
            None => Ok(()),
        }
    };
    conn::counted(&stats, peer, "RESP connection", work).await;
}

async fn handle(
    rd: ReadHalf,
    wr: WriteHalf,
    ctx: Ctx,
    state: Arc<ConnState>,
    forward: Option<Arc<Forwarder>>,
) -> Result<(), RespError> {
    let slots = ctx.config.max_in_flight_per_conn + CONTROL_SLOTS;
    let (out_tx, out_rx) = mpsc::channel(slots);
    let (local_tx, local_rx) = mpsc::channel(slots);
    let write_timeout = ctx.config.write_timeout;
    let writer = tokio::spawn(write_loop(
        wr,
        out_rx,
        local_rx,
        state.clone(),
        write_timeout,
    ));
    let mut reader = Reader {
        rd,
        buf: Vec::with_capacity(READ_CHUNK),
        start: 0,
        retry: false,
        partial_since: None,
        seq: 0,
        out_tx,
        local_tx,
        ctx: &ctx,
        state: &state,
        forward,
        session: Session {
            authenticated: ctx.config.auth_token.is_none(),
            proto: Proto::Resp2,
        },
    };
    let read = reader.run().await;
    let Reader {
        mut rd,
        seq,
        out_tx,
        local_tx,
        ..
    } = reader;
    let told = read.as_ref().err().filter(|e| e.tell_peer()).map(|e| {
        let reply = Reply::err(format!("ERR {e}"));
        let local = Local {
            seq,
            reply,
            switch: None,
            permit: None,
        };
        local_tx.try_send(local).is_ok()
    });
    drop((out_tx, local_tx));
    // The writer ends once every request of this connection has been answered (the
    // batcher holds a sender per pending request) and written, or on a write timeout.
    let write = match writer.await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("RESP writer task failed: {e}");
            Err(RespError::WriterGone)
        }
    };
    if told == Some(true) && write.is_ok() {
        linger(&mut rd).await;
    }
    match (read, write) {
        (_, Err(e)) => Err(e),
        (r, Ok(())) => r,
    }
}

/// After an error reply and our FIN: reads what the client still sends, for a moment,
/// so that closing with unread bytes (which makes the kernel send a reset) does not
/// destroy the error before the client has read it.
async fn linger(rd: &mut ReadHalf) {
    let mut sink = [0u8; READ_CHUNK];
    let mut left = LINGER_BYTES;
    let drain = async {
        while left > 0 {
            match rd.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// The reading half of a connection: its buffer, the bound on the request in progress,
/// and the sequence number the next request takes.
struct Reader<'a> {
    rd: ReadHalf,
    buf: Vec<u8>,
    /// Where the unread part of `buf` starts.
    start: usize,
    /// A line end arrived since the decoder last found the request incomplete.
    retry: bool,
    /// When the first byte of the incomplete request in `buf` arrived.
    partial_since: Option<Instant>,
    seq: u64,
    out_tx: mpsc::Sender<Outgoing>,
    local_tx: mpsc::Sender<Local>,
    ctx: &'a Ctx,
    state: &'a ConnState,
    forward: Option<Arc<Forwarder>>,
    session: Session,
}

/// What the reader does after a request.
enum Next {
    Continue,
    Quit,
}

impl Reader<'_> {
    /// Requests until the peer leaves, quits or the broker stops.
    async fn run(&mut self) -> Result<(), RespError> {
        while let Some(args) = self.next_request().await? {
            if args.is_empty() {
                continue; // an empty array: ignored, as Redis does
            }
            let permit = conn::in_flight_permit(&self.out_tx, self.state).await?;
            if let Next::Quit = self.dispatch(args, permit).await? {
                break;
            }
        }
        Ok(())
    }

    /// The next request's arguments, or `None` when the peer closed between requests or
    /// the broker is stopping. Every wait is bounded: a partial request by the frame
    /// timeout, a connection with nothing in flight by the idle timeout.
    async fn next_request(&mut self) -> Result<Option<Vec<Vec<u8>>>, RespError> {
        let config = self.ctx.config.clone();
        let mut stopping = self.ctx.stopping.clone();
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            if let Some(args) = self.decode_one()? {
                self.state.touch();
                return Ok(Some(args));
            }
            let partial = self.start < self.buf.len();
            self.state.partial.store(partial, Relaxed);
            let wait = self.wait(&config, Instant::now());
            tokio::select! {
                biased;
                _ = stopping.wait_for(|s| *s) => return Ok(None),
                () = self.local_tx.closed() => return Err(RespError::WriterGone),
                () = self.state.evict.notified() => {
                    // Only an idle connection gives up its slot (it may have woken up since).
                    if let Some(idle) = self.state.idle_for(Instant::now()) {
                        return Err(RespError::Evicted(idle));
                    }
                }
                n = self.rd.read(&mut chunk) => {
                    let n = n?;
                    if n == 0 {
                        return if partial { Err(RespError::Truncated) } else { Ok(None) };
                    }
                    self.take(&chunk[..n]);
                }
                () = sleep_until(wait.until()) => match wait {
                    Wait::Frame(_) => return Err(RespError::FrameTimeout(config.frame_timeout)),
                    Wait::Idle(_) => {
                        // A reply may have been written since the deadline was computed.
                        if self.state.idle_for(Instant::now()).is_some_and(|d| d >= config.idle_timeout) {
                            return Err(RespError::IdleTimeout(config.idle_timeout));
                        }
                    }
                    Wait::Busy(_) => {}
                },
            }
        }
    }

    /// Which limit bounds the wait for more bytes.
    fn wait(&self, config: &BrokerConfig, now: Instant) -> Wait {
        if let Some(since) = self.partial_since.filter(|_| self.start < self.buf.len()) {
            Wait::Frame(since + config.frame_timeout)
        } else if self.state.idle_for(now).is_some() {
            Wait::Idle(self.state.last_active() + config.idle_timeout)
        } else {
            Wait::Busy(now + config.idle_timeout)
        }
    }

    /// Takes one complete request off the buffer, if there is one.
    fn decode_one(&mut self) -> Result<Option<Vec<Vec<u8>>>, RespError> {
        self.skip_empty_lines();
        let pending = &self.buf[self.start..];
        let Some(&first) = pending.first() else {
            return Ok(None);
        };
        if pending == b"\r" {
            return Ok(None); // maybe an empty line, see skip_empty_lines
        }
        if first != b'*' {
            return Err(not_an_array(first));
        }
        // An incomplete request can only be completed by a line end: until one arrives,
        // skip the decoder (which would re-read the whole request so far).
        if !self.retry {
            return self.check_len().map(|()| None);
        }
        let (frame, used) = match decode(pending) {
            Ok(Some(decoded)) => decoded,
            Ok(None) => {
                self.retry = false;
                return self.check_len().map(|()| None);
            }
            Err(e) => return Err(RespError::Protocol(format!("malformed request: {e}"))),
        };
        self.start += used;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        // The rest (pipelined requests) arrived no later than now.
        self.partial_since = Some(Instant::now());
        request_args(frame).map(Some)
    }

    /// Skips empty lines between requests, as Redis does (`redis-cli --pipe` sends one).
    fn skip_empty_lines(&mut self) {
        loop {
            let pending = &self.buf[self.start..];
            if pending.starts_with(b"\r\n") {
                self.start += 2;
            } else if pending.starts_with(b"\n") {
                self.start += 1;
            } else {
                return;
            }
        }
    }

    /// The incomplete request in the buffer is within the cap.
    fn check_len(&self) -> Result<(), RespError> {
        if self.buf.len() - self.start > MAX_REQUEST_LEN {
            return Err(RespError::TooLarge);
        }
        Ok(())
    }

    /// Appends bytes just read.
    fn take(&mut self, bytes: &[u8]) {
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            self.partial_since = Some(Instant::now());
        } else if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.retry |= bytes.contains(&b'\n');
        self.buf.extend_from_slice(bytes);
    }

    /// Answers one request (or queues it for the batcher).
    async fn dispatch(
        &mut self,
        args: Vec<Vec<u8>>,
        permit: OwnedSemaphorePermit,
    ) -> Result<Next, RespError> {
        let seq = self.seq;
        self.seq += 1;
        let token = self.ctx.config.auth_token.as_ref();
        match command(&args, &self.session, &self.ctx.stats, token) {
            Action::Next(count) => match self.forwarding(count) {
                Some(forward) => self.forward(forward, seq, count, permit),
                None => {
                    // Deadline 0: the broker's default, as for a binary client sending none.
                    conn::next_ids(&self.out_tx, self.ctx, (seq, count, 0), permit).await?;
                }
            },
            Action::Reply(reply, switch) => {
                self.session.proto = switch.unwrap_or(self.session.proto);
                self.local(seq, reply, switch, permit).await?;
            }
            Action::Unlock(reply, switch) => {
                self.session.authenticated = true;
                self.session.proto = switch.unwrap_or(self.session.proto);
                self.local(seq, reply, switch, permit).await?;
            }
            Action::Quit => {
                self.local(seq, Reply::ok(), None, permit).await?;
                return Ok(Next::Quit);
            }
        }
        Ok(Next::Continue)
    }

    /// The forwarder, when this request goes to the leader: this broker takes part in an
    /// election and does not lead, and `count` is valid (a bad one is answered here).
    fn forwarding(&self, count: u64) -> Option<Arc<Forwarder>> {
        let valid = (1..=self.ctx.config.max_count).contains(&count);
        self.forward
            .as_ref()
            .filter(|f| valid && !f.leading())
            .cloned()
    }

    /// Forwards request `seq` to the leader in a task of its own, which answers it (in
    /// order, by the writer) with the leader's reply, or queues it for this broker's own
    /// batcher if it leads by then. It holds the request's in-flight permit throughout.
    fn forward(&self, forward: Arc<Forwarder>, seq: u64, count: u64, permit: OwnedSemaphorePermit) {
        let ctx = self.ctx;
        let (stats, batch_tx, out_tx) =
            (ctx.stats.clone(), ctx.batch_tx.clone(), self.out_tx.clone());
        let requested = ctx.config.default_deadline;
        let deadline = Instant::now() + requested;
        stats.requests.fetch_add(1, Relaxed);
        tokio::spawn(async move {
            let (msg, permit) = match forward.next_ids(count, deadline, requested).await {
                Forwarded::Local => {
                    let pending = Pending {
                        id: seq,
                        count,
                        deadline,
                        requested,
                        reply: out_tx.clone(),
                        permit: Some(permit),
                    };
                    match batch_tx.send(pending).await {
                        Ok(()) => return, // the batcher answers it
                        Err(refused) => {
                            stats.requests_failed.fetch_add(1, Relaxed);
                            let error = shutting_down();
                            (ServerMsg::Failed { id: seq, error }, refused.0.permit)
                        }
                    }
                }
                Forwarded::Ids(range) => {
                    stats.forwarded.fetch_add(1, Relaxed);
                    stats.requests_ok.fetch_add(1, Relaxed);
                    (ServerMsg::ids(seq, range), Some(permit))
                }
                Forwarded::Failed(error) => {
                    stats.forwarded.fetch_add(1, Relaxed);
                    stats.requests_failed.fetch_add(1, Relaxed);
                    (ServerMsg::Failed { id: seq, error }, Some(permit))
                }
                Forwarded::NoLeader => {
                    stats.requests_failed.fetch_add(1, Relaxed);
                    // Answered as "no leader is known now (an election is under way)".
                    let msg = ServerMsg::Redirect {
                        id: seq,
                        leader: None,
                    };
                    (msg, Some(permit))
                }
            };
            // Only a connection that is gone refuses it: nobody is left to tell.
            let _ = out_tx.send(Outgoing { msg, permit }).await;
        });
    }

    async fn local(
        &self,
        seq: u64,
        reply: Reply,
        switch: Option<Proto>,
        permit: OwnedSemaphorePermit,
    ) -> Result<(), RespError> {
        let local = Local {
            seq,
            reply,
            switch,
            permit: Some(permit),
        };
        self.local_tx
            .send(local)
            .await
            .map_err(|_| RespError::WriterGone)
    }
}

/// The error of a request this broker would serve itself after its batcher stopped.
fn shutting_down() -> IdError {
    let failure = idproto::NodeFailure {
        addr: "idbroker".into(),
        reason: "broker is shutting down; the request was not started, retry on another broker"
            .into(),
    };
    IdError::BrokersUnavailable {
        failures: vec![failure],
    }
}

/// Which limit bounds the current wait for bytes (as in the binary connection).
#[derive(Clone, Copy)]
enum Wait {
    /// A partial request must be complete by then.
    Frame(Instant),
    /// Nothing in flight, nothing partial: close at that time.
    Idle(Instant),
    /// Requests in flight: not idle; look again at that time.
    Busy(Instant),
}

impl Wait {
    fn until(self) -> Instant {
        match self {
            Wait::Frame(t) | Wait::Idle(t) | Wait::Busy(t) => t,
        }
    }
}

fn not_an_array(first: u8) -> RespError {
    if first.is_ascii_alphabetic() {
        RespError::Protocol(
            "inline commands are not supported; send RESP arrays of bulk strings (any Redis client does)"
                .into(),
        )
    } else {
        RespError::Protocol(format!(
            "expected '*' (an array of bulk strings), got '{}'",
            echo(&[first])
        ))
    }
}

/// A request is an array of bulk strings.
fn request_args(frame: Frame2) -> Result<Vec<Vec<u8>>, RespError> {
    let Frame2::Array(items) = frame else {
        return Err(RespError::Protocol(
            "expected an array of bulk strings".into(),
        ));
    };
    items
        .into_iter()
        .map(|item| match item {
            Frame2::BulkString(b) => Ok(b),
            _ => Err(RespError::Protocol(
                "expected an array of bulk strings, got another element type".into(),
            )),
        })
        .collect()
}

/// A reply waiting for its turn in the writer, with the version switch it makes
/// (`HELLO`) and the in-flight permit it releases once written.
type Held = BTreeMap<u64, (Reply, Option<Proto>, Option<OwnedSemaphorePermit>)>;

/// Writes replies in request order, as many per write as are ready, until every sender
/// is gone; then shuts the write side down.
async fn write_loop(
    mut wr: WriteHalf,
    mut out_rx: mpsc::Receiver<Outgoing>,
    mut local_rx: mpsc::Receiver<Local>,
    state: Arc<ConnState>,
    write_timeout: Duration,
) -> Result<(), RespError> {
    // At most one entry per in-flight permit (plus the final error): bounded.
    let mut held = Held::new();
    let mut next = 0u64;
    let mut proto = Proto::Resp2;
    let (mut out_open, mut local_open) = (true, true);
    let mut bytes = Vec::new();
    let mut permits = Vec::new();
    while out_open || local_open {
        tokio::select! {
            m = out_rx.recv(), if out_open => match m {
                Some(o) => hold_server(&mut held, o),
                None => out_open = false,
            },
            m = local_rx.recv(), if local_open => match m {
                Some(l) => { held.insert(l.seq, (l.reply, l.switch, l.permit)); }
                None => local_open = false,
            },
        }
        while let Ok(o) = out_rx.try_recv() {
            hold_server(&mut held, o);
        }
        while let Ok(l) = local_rx.try_recv() {
            held.insert(l.seq, (l.reply, l.switch, l.permit));
        }
        while let Some((reply, switch, permit)) = held.remove(&next) {
            next += 1;
            proto = switch.unwrap_or(proto);
            reply.encode(proto, &mut bytes);
            permits.push(permit);
        }
        if bytes.is_empty() {
            continue;
        }
        // Flushed too: a TLS stream may hold the last record until then.
        let write = async {
            wr.write_all(&bytes).await?;
            wr.flush().await
        };
        match tokio::time::timeout(write_timeout, write).await {
            Ok(r) => r?,
            Err(_) => return Err(RespError::WriteTimeout(write_timeout)),
        }
        bytes.clear();
        // Active before the permits are released, so it is never seen idle in between.
        state.touch();
        permits.clear();
    }
    if !held.is_empty() {
        tracing::warn!(
            missing = next,
            "RESP replies left unwritten: one before them was never answered"
        );
    }
    let _ = tokio::time::timeout(write_timeout, wr.shutdown()).await;
    Ok(())
}

fn hold_server(held: &mut Held, o: Outgoing) {
    match o.msg.request_id() {
        Some(seq) => {
            held.insert(seq, (server_reply(o.msg), None, o.permit));
        }
        None => tracing::error!("batcher reply without a request id on a RESP connection"),
    }
}

/// How long a refused connection may take to receive its error.
const REFUSE_LINGER: Duration = Duration::from_millis(500);

/// Tells a RESP connection over the cap why it is closed, in Redis's own words, then
/// closes it. At most `refusing`'s permits of these run at once; beyond, just closed.
pub(crate) fn refuse_at_cap(
    stream: TcpStream,
    peer: SocketAddr,
    refusing: &Arc<Semaphore>,
    stats: &Stats,
) {
    stats.connections_total.fetch_add(1, Relaxed);
    stats.connections_dropped.fetch_add(1, Relaxed);
    tracing::info!(%peer, "RESP connection refused: connection cap reached");
    let Ok(permit) = refusing.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let mut stream = stream;
        let refuse = async {
            stream
                .write_all(b"-ERR max number of clients reached\r\n")
                .await?;
            stream.shutdown().await
        };
        let _ = tokio::time::timeout(REFUSE_LINGER, refuse).await;
        drop(permit);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_must_be_arrays_of_bulk_strings() {
        let (frame, _) = decode(b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n")
            .expect("valid")
            .expect("complete");
        assert_eq!(
            request_args(frame).expect("args"),
            vec![b"PING".to_vec(), b"hi".to_vec()]
        );
        let (frame, _) = decode(b"*1\r\n:1\r\n").expect("valid").expect("complete");
        assert!(request_args(frame).is_err());
    }

    /// The decoder recurses into nested arrays: the request cap must keep the deepest
    /// nesting it allows within a task's stack (tokio's workers have 2 MiB).
    #[test]
    fn deepest_nesting_within_the_cap_decodes_on_a_small_stack() {
        let nested = b"*1\r\n".repeat(MAX_REQUEST_LEN / 4);
        let worker = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || decode(&nested).map(|d| d.is_none()).unwrap_or(true))
            .expect("spawn");
        assert!(worker.join().expect("no stack overflow"));
    }
}

//! The RESP listener (`idbroker --resp-listen`): any Redis client is an idbroker client.
//!
//! Requests are read by an incremental parser of arrays of bulk strings ([`request`]:
//! clients send those in RESP2 and RESP3 alike), whose work is proportional to the
//! bytes received; replies are encoded by the `redis-protocol` crate's RESP2 or RESP3
//! encoder, whichever the client chose with `HELLO`. `QLIST.NEXT` requests go to
//! the batcher through the same queue, with the same checks, deadline and in-flight
//! permits as binary ones ([`session::next_ids`]), so they share rounds with binary
//! clients. Connection slots, eviction and the counters are the binary listener's.
//!
//! Order: Redis clients match replies to requests by position, while batches may answer
//! out of order (a request that hits its deadline, a local reply next to one waiting
//! for a round). Every request takes the next sequence number of its connection (the
//! batcher sees it as the request id) and the writer puts replies back in that order.
//!
//! Hostile input costs only its connection: a request larger than [`MAX_REQUEST_LEN`]
//! or declaring more than [`request::MAX_ARGS`] arguments (refused as soon as its
//! header says so; nothing is allocated for it), anything but an array of bulk strings
//! (inline commands included: refused, see below), a request not completed within the
//! frame timeout, a connection idle past the idle timeout, and, with a token
//! configured, one not authenticated within the handshake timeout of its connect or
//! after [`crate::MAX_AUTH_FAILURES`] wrong tokens (each answered after
//! [`crate::AUTH_FAILURE_PAUSE`]) are told why (`-ERR ...`) and closed; a client that
//! pipelines without reading stops being read at the in-flight cap.
//!
//! Followers: on a broker that does not lead (leader election), `QLIST.NEXT` is
//! forwarded to the leader ([`crate::net::forward`]) by a task of its own that holds the
//! request's in-flight permit and sequence number, so its reply takes its place in
//! order like any other, and later requests wait for it at most until its deadline.
//!
//! Inline commands (`PING\r\n` typed into telnet) are refused rather than supported: no
//! Redis client sends them, and the RESP decoder is the only parser here.

mod command;
mod reply;
mod request;

pub use request::MAX_REQUEST_LEN;

use crate::config::{BrokerConfig, MAX_AUTH_FAILURES};
use crate::net::forward::{Forwarded, Forwarder};
use crate::net::refuse::Protocol;
use crate::net::session::{
    self, wait_for_bytes, Ctx, SessionEnd, SlotHolder, Wait, Woken, CONTROL_SLOTS,
};
use crate::net::tls::TlsError;
use crate::serve::queue::{IdRequest, Outgoing};
use command::{command, Action, Session};
use futures::FutureExt;
use idproto::tls::{ReadHalf, WriteHalf};
use idproto::wire::ServerMsg;
use idproto::IdError;
use reply::{echo, server_reply, Reply, RespVersion};
use request::{ParseError, RequestParser};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::{sleep_until, Instant};

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 4096;

/// How long, and how many bytes, a connection closed with an error is drained (see
/// [`linger`]): enough for a client to read the error, too little to hold a slot.
const LINGER: Duration = Duration::from_millis(500);
const LINGER_BYTES: usize = 1 << 20;
/// How often a lingering connection is drained.
const LINGER_PACE: Duration = Duration::from_millis(100);

/// Why a RESP connection was closed by the broker.
#[derive(Debug, thiserror::Error)]
enum RespError {
    #[error("Protocol error: {0}")]
    Protocol(String),
    #[error("Protocol error: request larger than {MAX_REQUEST_LEN} bytes")]
    TooLarge,
    #[error("Protocol error: a request of {0} arguments (at most {max})", max = request::MAX_ARGS)]
    TooManyArgs(i64),
    #[error("not authenticated within {0:?} of connecting")]
    AuthTimeout(Duration),
    #[error("too many failed AUTH attempts: closing the connection")]
    AuthFailures,
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
                | RespError::TooManyArgs(_)
                | RespError::AuthTimeout(_)
                | RespError::AuthFailures
                | RespError::FrameTimeout(_)
                | RespError::IdleTimeout(_)
                | RespError::Evicted(_)
        )
    }
}

impl From<ParseError> for RespError {
    fn from(e: ParseError) -> RespError {
        match e {
            ParseError::TooLarge => RespError::TooLarge,
            ParseError::TooManyArgs(n) => RespError::TooManyArgs(n),
            ParseError::NotAnArray(first) => not_an_array(first),
            ParseError::NotBulk => RespError::Protocol(
                "expected an array of bulk strings, got another element type".into(),
            ),
            ParseError::Malformed(what) => {
                RespError::Protocol(format!("malformed request: {what}"))
            }
        }
    }
}

impl From<SessionEnd> for RespError {
    fn from(e: SessionEnd) -> RespError {
        match e {
            SessionEnd::WriterGone => RespError::WriterGone,
            SessionEnd::BatcherGone => RespError::BatcherGone,
            SessionEnd::Evicted(idle) => RespError::Evicted(idle),
            // RESP's handshake is the token: a connection without one must give it.
            SessionEnd::HandshakeTimeout(d) => RespError::AuthTimeout(d),
            SessionEnd::FrameTimeout(d) => RespError::FrameTimeout(d),
            SessionEnd::IdleTimeout(d) => RespError::IdleTimeout(d),
        }
    }
}

/// A reply the reader produced itself, at position `seq` of the connection.
struct Local {
    seq: u64,
    reply: Reply,
    /// For `HELLO`: the version this reply and every later one is encoded in.
    switch: Option<RespVersion>,
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
    state: Arc<SlotHolder>,
    forward: Option<Arc<Forwarder>>,
) {
    let stats = ctx.stats.clone();
    let work = async {
        match session::open(stream, &ctx, &state, Protocol::Resp).await? {
            Some((rd, wr)) => handle(rd, wr, ctx, state, forward).await,
            None => Ok(()),
        }
    };
    session::counted(&stats, peer, "RESP connection", work).await;
}

async fn handle(
    rd: ReadHalf,
    wr: WriteHalf,
    ctx: Ctx,
    state: Arc<SlotHolder>,
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
    let mut reader = Reader::new(rd, out_tx, local_tx, &ctx, &state, forward);
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
        // Nothing is owed any more: the slot goes to the next client now.
        state.release_slot();
        linger(&mut rd).await;
    }
    match (read, write) {
        (_, Err(e)) => Err(e),
        (r, Ok(())) => r,
    }
}

/// After an error reply and our FIN: reads what the client still sends, for a moment,
/// so that closing with unread bytes (which makes the kernel send a reset) does not
/// destroy the error before the client has read it. Drains at a slow pace rather than
/// per arrival: a client trickling bytes at a closing connection wakes the broker a few
/// times, not once per packet.
async fn linger(rd: &mut ReadHalf) {
    let mut sink = [0u8; READ_CHUNK];
    let mut left = LINGER_BYTES;
    let until = Instant::now() + LINGER;
    loop {
        // What has arrived so far, without waiting for more.
        while let Some(read) = rd.read(&mut sink).now_or_never() {
            match read {
                Ok(0) | Err(_) => return,
                Ok(n) => left = left.saturating_sub(n),
            }
            if left == 0 {
                return;
            }
        }
        let now = Instant::now();
        if now >= until {
            return;
        }
        tokio::time::sleep((until - now).min(LINGER_PACE)).await;
    }
}

/// The reading half of a connection: its buffer, the bound on the request in progress,
/// and the sequence number the next request takes.
struct Reader<'a> {
    rd: ReadHalf,
    buf: Vec<u8>,
    /// Where the unread part of `buf` starts.
    start: usize,
    /// The request being read, as far as `buf[..start]` went.
    parser: RequestParser,
    /// Wrong tokens sent so far.
    auth_failures: u32,
    /// When the first byte of the incomplete request in `buf` arrived.
    partial_since: Option<Instant>,
    seq: u64,
    out_tx: mpsc::Sender<Outgoing>,
    local_tx: mpsc::Sender<Local>,
    ctx: &'a Ctx,
    state: &'a SlotHolder,
    forward: Option<Arc<Forwarder>>,
    session: Session,
}

/// What the reader does after a request.
enum Next {
    Continue,
    Quit,
}

impl<'a> Reader<'a> {
    /// The reader of a connection just opened; without a token configured, it is
    /// admitted at once (nothing to authenticate).
    fn new(
        rd: ReadHalf,
        out_tx: mpsc::Sender<Outgoing>,
        local_tx: mpsc::Sender<Local>,
        ctx: &'a Ctx,
        state: &'a SlotHolder,
        forward: Option<Arc<Forwarder>>,
    ) -> Reader<'a> {
        let authenticated = ctx.config.auth_token.is_none();
        if authenticated {
            state.admit();
        }
        Reader {
            rd,
            buf: Vec::with_capacity(READ_CHUNK),
            start: 0,
            parser: RequestParser::default(),
            auth_failures: 0,
            partial_since: None,
            seq: 0,
            out_tx,
            local_tx,
            ctx,
            state,
            forward,
            session: Session {
                authenticated,
                proto: RespVersion::Resp2,
            },
        }
    }

    /// Requests until the peer leaves, quits or the broker stops.
    async fn run(&mut self) -> Result<(), RespError> {
        while let Some(args) = self.next_request().await? {
            if args.is_empty() {
                continue; // an empty array: ignored, as Redis does
            }
            let permit = self.in_flight_permit().await?;
            if let Next::Quit = self.dispatch(args, permit).await? {
                break;
            }
        }
        Ok(())
    }

    /// Backpressure, as for a binary connection ([`session::in_flight_permit`]); before the
    /// token, still bounded by the authentication deadline and open to eviction: a
    /// client that pipelines refused requests without reading the refusals must not
    /// hold its slot until the write timeout.
    async fn in_flight_permit(&self) -> Result<OwnedSemaphorePermit, RespError> {
        let permit = session::in_flight_permit(&self.out_tx, self.state);
        if self.session.authenticated {
            return Ok(permit.await?);
        }
        let auth = self.state.epoch + self.ctx.config.handshake_timeout;
        tokio::select! {
            p = permit => Ok(p?),
            () = self.state.evict.notified() => {
                self.state.release_slot();
                let idle = self.state.idle_for(Instant::now()).unwrap_or_default();
                Err(RespError::Evicted(idle))
            }
            () = sleep_until(auth) => Err(RespError::AuthTimeout(self.ctx.config.handshake_timeout)),
        }
    }

    /// The next request's arguments, or `None` when the peer closed between requests or
    /// the broker is stopping. Every wait is bounded: a partial request by the frame
    /// timeout, a connection with nothing in flight by the idle timeout.
    async fn next_request(&mut self) -> Result<Option<Vec<Vec<u8>>>, RespError> {
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            if let Some(args) = self.decode_one()? {
                self.state.touch();
                return Ok(Some(args));
            }
            let partial = self.parser.in_progress() || self.start < self.buf.len();
            self.state.partial.store(partial, Relaxed);
            let wait = self.wait(&self.ctx.config, Instant::now());
            let read = self.rd.read(&mut chunk);
            match wait_for_bytes(self.ctx, self.state, wait, self.local_tx.closed(), read).await? {
                Woken::Read(n) => {
                    let n = n?;
                    if n == 0 {
                        return if partial {
                            Err(RespError::Truncated)
                        } else {
                            Ok(None)
                        };
                    }
                    self.take(&chunk[..n]);
                }
                Woken::Again => {}
                Woken::Stopping => return Ok(None),
            }
        }
    }

    /// Which limit bounds the wait for more bytes.
    fn wait(&self, config: &BrokerConfig, now: Instant) -> Wait {
        let partial = self.parser.in_progress() || self.start < self.buf.len();
        let frame = self.partial_since.filter(|_| partial);
        let wait = Wait::after(
            frame.map(|since| since + config.frame_timeout),
            self.state,
            config,
            now,
        );
        // Without the token, a connection has the handshake timeout from its connect,
        // whatever it sends meanwhile.
        let auth = self.state.epoch + config.handshake_timeout;
        if !self.session.authenticated && auth <= wait.until() {
            return Wait::Handshake(auth);
        }
        wait
    }

    /// Takes one complete request off the buffer, if there is one. The parser keeps
    /// what it has read, so each byte is parsed once however the request is split.
    fn decode_one(&mut self) -> Result<Option<Vec<Vec<u8>>>, RespError> {
        if !self.parser.in_progress() {
            self.skip_empty_lines();
            if &self.buf[self.start..] == b"\r" {
                return Ok(None); // maybe an empty line, see skip_empty_lines
            }
        }
        let (used, args) = self.parser.parse(&self.buf[self.start..])?;
        self.start += used;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        if args.is_some() {
            // The rest (pipelined requests) arrived no later than now.
            self.partial_since = Some(Instant::now());
        }
        Ok(args)
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

    /// Appends bytes just read.
    fn take(&mut self, bytes: &[u8]) {
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            // A new request begins (not the rest of one whose headers were consumed).
            if !self.parser.in_progress() {
                self.partial_since = Some(Instant::now());
            }
        } else if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
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
                    session::next_ids(&self.out_tx, self.ctx, (seq, count, 0), permit).await?;
                }
            },
            Action::Reply(reply, switch) => {
                self.session.proto = switch.unwrap_or(self.session.proto);
                self.local(seq, reply, switch, permit).await?;
            }
            Action::Unlock(reply, switch) => {
                self.session.authenticated = true;
                self.state.admit();
                self.session.proto = switch.unwrap_or(self.session.proto);
                self.local(seq, reply, switch, permit).await?;
            }
            Action::Denied(reply) => {
                // The reply waits for the pause, so pipelined guesses wait too.
                session::auth_failed(&self.ctx.stats).await;
                self.local(seq, reply, None, permit).await?;
                self.auth_failures += 1;
                if self.auth_failures >= MAX_AUTH_FAILURES {
                    return Err(RespError::AuthFailures);
                }
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
                    let request = IdRequest {
                        id: seq,
                        count,
                        deadline,
                        requested,
                        reply: out_tx.clone(),
                        permit: Some(permit),
                    };
                    match batch_tx.send(request).await {
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
        switch: Option<RespVersion>,
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

/// A reply waiting for its turn in the writer, with the version switch it makes
/// (`HELLO`) and the in-flight permit it releases once written.
type Held = BTreeMap<u64, (Reply, Option<RespVersion>, Option<OwnedSemaphorePermit>)>;

/// Writes replies in request order, as many per write as are ready, until every sender
/// is gone; then shuts the write side down.
async fn write_loop(
    mut wr: WriteHalf,
    mut out_rx: mpsc::Receiver<Outgoing>,
    mut local_rx: mpsc::Receiver<Local>,
    state: Arc<SlotHolder>,
    write_timeout: Duration,
) -> Result<(), RespError> {
    // At most one entry per in-flight permit (plus the final error): bounded.
    let mut held = Held::new();
    let mut next = 0u64;
    let mut proto = RespVersion::Resp2;
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

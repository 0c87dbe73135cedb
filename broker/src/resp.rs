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
//! Inline commands (`PING\r\n` typed into telnet) are refused rather than supported: no
//! Redis client sends them, and the RESP decoder is the only parser here.

use crate::batcher::Outgoing;
use crate::conn::{self, ConnState, Ctx};
use crate::stats::Stats;
use crate::BrokerConfig;
use idproto::wire::{BrokerStats, ServerMsg};
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::{OwnedFrame as Frame2, Resp2Frame};
use redis_protocol::resp3::types::{OwnedFrame as Frame3, Resp3Frame};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
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

/// Longest command name or error text echoed back (names are the client's bytes).
const MAX_ECHO: usize = 64;

/// The server name `HELLO` reports.
const SERVER_NAME: &str = "qlist";

/// The RESP version replies are encoded in, per connection (`HELLO 2|3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Resp2,
    Resp3,
}

impl Proto {
    fn number(self) -> i64 {
        match self {
            Proto::Resp2 => 2,
            Proto::Resp3 => 3,
        }
    }
}

/// A reply, before it is encoded for the connection's RESP version.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<Reply>),
    /// A map in RESP3, a flat key, value, key, value... array in RESP2.
    Map(Vec<(String, Reply)>),
}

impl Reply {
    fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// An error reply: `text` starts with its code (`ERR`, `NOPROTO`, ...). CR and LF
    /// would end the line early (and let a client's bytes inject a reply): replaced.
    fn err(text: impl AsRef<str>) -> Reply {
        Reply::Error(text.as_ref().replace(['\r', '\n'], " "))
    }

    fn to_resp2(&self) -> Frame2 {
        match self {
            Reply::Simple(s) => Frame2::SimpleString(s.clone().into_bytes()),
            Reply::Error(s) => Frame2::Error(s.clone()),
            Reply::Int(i) => Frame2::Integer(*i),
            Reply::Bulk(b) => Frame2::BulkString(b.clone()),
            Reply::Null => Frame2::Null,
            Reply::Array(items) => Frame2::Array(items.iter().map(Reply::to_resp2).collect()),
            Reply::Map(pairs) => Frame2::Array(
                pairs
                    .iter()
                    .flat_map(|(k, v)| [Frame2::BulkString(k.clone().into_bytes()), v.to_resp2()])
                    .collect(),
            ),
        }
    }

    fn to_resp3(&self) -> Frame3 {
        match self {
            Reply::Simple(s) => Frame3::SimpleString {
                data: s.clone().into_bytes(),
                attributes: None,
            },
            Reply::Error(s) => Frame3::SimpleError {
                data: s.clone(),
                attributes: None,
            },
            Reply::Int(i) => Frame3::Number {
                data: *i,
                attributes: None,
            },
            Reply::Bulk(b) => Frame3::BlobString {
                data: b.clone(),
                attributes: None,
            },
            Reply::Null => Frame3::Null,
            Reply::Array(items) => Frame3::Array {
                data: items.iter().map(Reply::to_resp3).collect(),
                attributes: None,
            },
            Reply::Map(pairs) => Frame3::Map {
                data: pairs
                    .iter()
                    .map(|(k, v)| {
                        let key = Frame3::BlobString {
                            data: k.clone().into_bytes(),
                            attributes: None,
                        };
                        (key, v.to_resp3())
                    })
                    .collect(),
                attributes: None,
            },
        }
    }

    /// Appends the encoding of this reply in `proto` to `out`.
    fn encode(&self, proto: Proto, out: &mut Vec<u8>) {
        let start = out.len();
        let written = match proto {
            Proto::Resp2 => {
                let frame = self.to_resp2();
                out.resize(start + frame.encode_len(false), 0);
                redis_protocol::resp2::encode::encode(&mut out[start..], &frame, false)
            }
            Proto::Resp3 => {
                let frame = self.to_resp3();
                out.resize(start + frame.encode_len(false), 0);
                redis_protocol::resp3::encode::complete::encode(&mut out[start..], &frame, false)
            }
        };
        match written {
            Ok(n) => out.truncate(start + n),
            Err(e) => {
                // Only a bug could get here (the buffer is sized by the encoder itself).
                tracing::error!("RESP reply not encodable ({e}): sending an error instead");
                out.truncate(start);
                out.extend_from_slice(b"-ERR reply not encodable\r\n");
            }
        }
    }
}

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

/// Who may use the listener. Only "everyone" exists today; a token check (`AUTH
/// <token>`, `HELLO 3 AUTH default <token>`) becomes a second variant, checked here.
#[derive(Debug, Clone, Copy)]
enum Auth {
    /// No password configured: answered as Redis answers with none set.
    Open,
}

impl Auth {
    /// The answer to `AUTH [user] password` (or HELLO's AUTH option): `None` when the
    /// client may go on, else the error to send. Never echoes the password.
    fn check(self, user: Option<&[u8]>, _password: &[u8]) -> Option<Reply> {
        match (self, user) {
            (Auth::Open, None) => Some(Reply::err(
                "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
            )),
            // Redis's default user without a password accepts any password.
            (Auth::Open, Some(b"default")) => None,
            (Auth::Open, Some(_)) => Some(Reply::err(
                "WRONGPASS invalid username-password pair or user is disabled.",
            )),
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
pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, ctx: Ctx, state: Arc<ConnState>) {
    ctx.stats.connections_open.fetch_add(1, Relaxed);
    ctx.stats.connections_total.fetch_add(1, Relaxed);
    let stats = ctx.stats.clone();
    match handle(stream, ctx, state).await {
        Ok(()) => tracing::debug!(%peer, "RESP connection closed"),
        Err(e) => {
            stats.connections_dropped.fetch_add(1, Relaxed);
            tracing::info!(%peer, "RESP connection dropped: {e}");
        }
    }
    stats.connections_open.fetch_sub(1, Relaxed);
}

async fn handle(stream: TcpStream, ctx: Ctx, state: Arc<ConnState>) -> Result<(), RespError> {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
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
        auth: Auth::Open,
        proto: Proto::Resp2,
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
async fn linger(rd: &mut OwnedReadHalf) {
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
    rd: OwnedReadHalf,
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
    auth: Auth,
    /// The version replies are encoded in from the next request on (requests are
    /// handled in order, so this is what the writer will use for it).
    proto: Proto,
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
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let rest = &args[1..];
        let mut switch = None;
        let reply = match name.as_str() {
            "QLIST.NEXT" => match parse_count(rest) {
                Ok(count) => {
                    // Deadline 0: the broker's default, as for a binary client sending none.
                    conn::next_ids(&self.out_tx, self.ctx, (seq, count, 0), permit).await?;
                    return Ok(Next::Continue);
                }
                Err(reply) => reply,
            },
            "ECHO" => match rest {
                [msg] => Reply::Bulk(msg.clone()),
                _ => wrong_args(&name),
            },
            "PING" => match rest {
                [] => Reply::Simple("PONG".into()),
                [msg] => Reply::Bulk(msg.clone()),
                _ => wrong_args(&name),
            },
            "HELLO" => match self.hello(rest) {
                Ok((reply, proto)) => {
                    self.proto = proto;
                    switch = Some(proto);
                    reply
                }
                Err(reply) => reply,
            },
            "AUTH" => match rest {
                [password] => self.auth.check(None, password).unwrap_or_else(Reply::ok),
                [user, password] => self
                    .auth
                    .check(Some(user), password)
                    .unwrap_or_else(Reply::ok),
                _ => Reply::err("ERR syntax error"),
            },
            "QLIST.STATS" if rest.is_empty() => stats_reply(&self.ctx.stats.snapshot()),
            "QLIST.STATS" => wrong_args(&name),
            "QUIT" => {
                self.local(seq, Reply::ok(), None, permit).await?;
                return Ok(Next::Quit);
            }
            _ => Reply::err(format!(
                "ERR unknown command '{}', with args beginning with: {}",
                echo(&args[0]),
                rest.iter()
                    .take(3)
                    .map(|a| format!("'{}' ", echo(a)))
                    .collect::<String>()
            )),
        };
        self.local(seq, reply, switch, permit).await?;
        Ok(Next::Continue)
    }

    /// `HELLO [protover [AUTH user password] [SETNAME name]]`: the server's description
    /// and the version to speak from this reply on.
    fn hello(&self, args: &[Vec<u8>]) -> Result<(Reply, Proto), Reply> {
        let proto = match args.first().map(|v| v.as_slice()) {
            None => None,
            Some(b"2") => Some(Proto::Resp2),
            Some(b"3") => Some(Proto::Resp3),
            Some(v) if std::str::from_utf8(v).is_ok_and(|s| s.parse::<i64>().is_ok()) => {
                return Err(Reply::err("NOPROTO unsupported protocol version"));
            }
            Some(_) => {
                return Err(Reply::err(
                    "ERR Protocol version is not an integer or out of range",
                ))
            }
        };
        let mut options = args.iter().skip(1);
        while let Some(option) = options.next() {
            match option.to_ascii_uppercase().as_slice() {
                b"AUTH" => {
                    let (Some(user), Some(password)) = (options.next(), options.next()) else {
                        return Err(Reply::err("ERR Syntax error in HELLO option 'AUTH'"));
                    };
                    if let Some(denied) = self.auth.check(Some(user), password) {
                        return Err(denied);
                    }
                }
                b"SETNAME" => {
                    if options.next().is_none() {
                        return Err(Reply::err("ERR Syntax error in HELLO option 'SETNAME'"));
                    }
                }
                _ => {
                    return Err(Reply::err(format!(
                        "ERR Syntax error in HELLO option '{}'",
                        echo(option)
                    )))
                }
            }
        }
        // HELLO without a version keeps the current one.
        let proto = proto.unwrap_or(self.proto);
        let reply = Reply::Map(vec![
            ("server".into(), Reply::Bulk(SERVER_NAME.into())),
            (
                "version".into(),
                Reply::Bulk(env!("CARGO_PKG_VERSION").into()),
            ),
            ("proto".into(), Reply::Int(proto.number())),
            ("mode".into(), Reply::Bulk("standalone".into())),
            ("role".into(), Reply::Bulk("master".into())),
            ("modules".into(), Reply::Array(Vec::new())),
        ]);
        Ok((reply, proto))
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

/// `QLIST.NEXT [count]`'s count (1 when absent); the broker checks its range.
fn parse_count(args: &[Vec<u8>]) -> Result<u64, Reply> {
    match args {
        [] => Ok(1),
        [count] => std::str::from_utf8(count)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| Reply::err("ERR value is not an integer or out of range")),
        _ => Err(wrong_args("QLIST.NEXT")),
    }
}

fn wrong_args(name: &str) -> Reply {
    Reply::err(format!(
        "ERR wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    ))
}

/// The client's bytes, safe to put in a one-line reply: printable ASCII only, short.
fn echo(bytes: &[u8]) -> String {
    let mut s: String = bytes
        .iter()
        .take(MAX_ECHO)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '?'
            }
        })
        .collect();
    if bytes.len() > MAX_ECHO {
        s.push_str("...");
    }
    s
}

/// `QLIST.STATS`: every counter of the snapshot by its field name (the serde names of
/// [`BrokerStats`], so a new counter shows up without a change here).
fn stats_reply(stats: &BrokerStats) -> Reply {
    match serde_json::to_value(stats) {
        Ok(value) => json_reply(value),
        Err(e) => Reply::err(format!("ERR stats not encodable: {e}")),
    }
}

fn json_reply(value: serde_json::Value) -> Reply {
    use serde_json::Value;
    match value {
        Value::Null => Reply::Null,
        Value::Bool(b) => Reply::Int(i64::from(b)),
        // A counter above i64::MAX (not seen in practice) is sent as its decimal text.
        Value::Number(n) => n
            .as_i64()
            .map_or_else(|| Reply::Bulk(n.to_string().into_bytes()), Reply::Int),
        Value::String(s) => Reply::Bulk(s.into_bytes()),
        Value::Array(items) => Reply::Array(items.into_iter().map(json_reply).collect()),
        Value::Object(fields) => Reply::Map(
            fields
                .into_iter()
                .map(|(k, v)| (k, json_reply(v)))
                .collect(),
        ),
    }
}

/// The reply to a request the batcher answered.
fn server_reply(msg: ServerMsg) -> Reply {
    match msg {
        // Two bulk strings: IDs above 2^63 do not fit a RESP integer.
        ServerMsg::Ids { lo, hi, .. } => Reply::Array(vec![
            Reply::Bulk(lo.to_string().into_bytes()),
            Reply::Bulk(hi.to_string().into_bytes()),
        ]),
        ServerMsg::Failed { error, .. } => Reply::err(format!("ERR {error}")),
        // Plain Redis clients follow no redirect. Forwarding the request to the leader
        // instead is the next step (issue 14).
        ServerMsg::Redirect {
            leader: Some(leader),
            ..
        } => Reply::err(format!("ERR not the leader; leader is {leader}")),
        ServerMsg::Redirect { leader: None, .. } => Reply::err(
            "ERR not the leader; no leader is known now (an election is under way): retry shortly",
        ),
        ServerMsg::Stats { stats, .. } => stats_reply(&stats),
        ServerMsg::Welcome { .. } | ServerMsg::Refused { .. } => {
            Reply::err("ERR unexpected reply from the batcher")
        }
    }
}

/// A reply waiting for its turn in the writer, with the version switch it makes
/// (`HELLO`) and the in-flight permit it releases once written.
type Held = BTreeMap<u64, (Reply, Option<Proto>, Option<OwnedSemaphorePermit>)>;

/// Writes replies in request order, as many per write as are ready, until every sender
/// is gone; then shuts the write side down.
async fn write_loop(
    mut wr: OwnedWriteHalf,
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
        match tokio::time::timeout(write_timeout, wr.write_all(&bytes)).await {
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

    fn encoded(reply: &Reply, proto: Proto) -> String {
        let mut out = Vec::new();
        reply.encode(proto, &mut out);
        String::from_utf8(out).expect("ascii")
    }

    #[test]
    fn ids_are_two_bulk_strings_in_both_versions() {
        let reply = server_reply(ServerMsg::Ids {
            id: 0,
            lo: u64::MAX - 1,
            hi: u64::MAX,
        });
        let want = "*2\r\n$20\r\n18446744073709551614\r\n$20\r\n18446744073709551615\r\n";
        assert_eq!(encoded(&reply, Proto::Resp2), want);
        assert_eq!(encoded(&reply, Proto::Resp3), want);
    }

    #[test]
    fn maps_are_flat_arrays_in_resp2_and_maps_in_resp3() {
        let reply = Reply::Map(vec![
            ("proto".into(), Reply::Int(3)),
            ("x".into(), Reply::Null),
        ]);
        assert_eq!(
            encoded(&reply, Proto::Resp2),
            "*4\r\n$5\r\nproto\r\n:3\r\n$1\r\nx\r\n$-1\r\n"
        );
        assert_eq!(
            encoded(&reply, Proto::Resp3),
            "%2\r\n$5\r\nproto\r\n:3\r\n$1\r\nx\r\n_\r\n"
        );
    }

    #[test]
    fn errors_cannot_inject_lines() {
        let reply = Reply::err("ERR a\r\n+OK");
        assert_eq!(encoded(&reply, Proto::Resp2), "-ERR a  +OK\r\n");
        assert_eq!(echo(b"a\r\nb"), "a??b");
        assert_eq!(echo(&[b'x'; 70]).len(), MAX_ECHO + 3);
    }

    #[test]
    fn counts() {
        assert_eq!(parse_count(&[]), Ok(1));
        assert_eq!(parse_count(&[b"42".to_vec()]), Ok(42));
        assert!(parse_count(&[b"-1".to_vec()]).is_err());
        assert!(parse_count(&[b"x".to_vec()]).is_err());
        assert!(parse_count(&[b"1".to_vec(), b"2".to_vec()]).is_err());
    }

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

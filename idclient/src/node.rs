//! One Redis node: a lazily (re)connected multiplexed connection, the durability check,
//! the two commands the protocols need (conditional write and read), and the rendezvous
//! of combined rounds (join, close, finish, and a subscription to the results).

use crate::combine::{Close, Join, Leases, Nonce};
use crate::script::{parse_canonical_u64, BAD_VALUE_CODE, COMBINE, CONDITIONAL_WRITE};
use futures::stream::{BoxStream, StreamExt};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use std::future::Future;
use std::time::{Duration, Instant};

/// After a failed connect, further rounds fail fast on this node for this long instead of
/// paying a connect attempt each: a dead node must not slow every round down.
pub const RECONNECT_INTERVAL: Duration = Duration::from_millis(100);

/// What one node said, or why it said nothing usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeError {
    /// Unreachable, timed out, connection broken, or an unexpected Redis error.
    Unavailable(String),
    /// The node does not persist every write before replying.
    Unsafe(String),
    /// The register is not a canonical decimal u64.
    BadValue(String),
}

/// Reply of the conditional write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteReply {
    /// The register was below LO and now holds HI.
    Accepted,
    /// The register was not below LO; it holds `current`.
    Rejected { current: u64 },
}

/// A conditional write's reply, and whether the node is the rendezvous of a combined
/// batch in flight (see [`crate::combine`]): then the writer is not alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub reply: WriteReply,
    pub combining: bool,
}

/// One register of the quorum, as the quorum client sees it. [`Node`] (Redis) is the
/// production implementation; [`crate::sim`] has an in-memory one for the deterministic
/// simulation. The client's safety rests on exactly these semantics: the register only
/// grows, and survives restarts.
pub trait Register: Send + Sync {
    /// The node's address, for error messages.
    fn addr(&self) -> &str;

    /// "If current < lo then current = hi": [`WriteReply::Accepted`], else
    /// [`WriteReply::Rejected`] with the register's value; and whether a combined batch
    /// other than `batch` (the writer's own, if it leads one) is in flight here.
    ///
    /// # Errors
    /// Unavailable, or a register that is not a canonical u64.
    fn conditional_write(
        &self,
        key: &str,
        lo: u64,
        hi: u64,
        batch: Option<Nonce>,
    ) -> impl Future<Output = Result<Written, NodeError>> + Send;

    /// The register's value (missing = 0).
    ///
    /// # Errors
    /// Unavailable, or a register that is not a canonical u64.
    fn read(&self, key: &str) -> impl Future<Output = Result<u64, NodeError>> + Send;

    /// Rendezvous of combined rounds, `join` (see [`crate::combine`]): add `n` IDs to the
    /// open batch, or open one (as `nonce`), or run alone.
    ///
    /// # Errors
    /// Unavailable, or not supported by this kind of node (the default).
    fn join(
        &self,
        key: &str,
        n: u64,
        nonce: Nonce,
        leases: Leases,
    ) -> impl Future<Output = Result<Join, NodeError>> + Send {
        let _ = (key, n, nonce, leases);
        std::future::ready(Err(NodeError::Unavailable(
            "no rendezvous on this node".to_string(),
        )))
    }

    /// Rendezvous `close`: the leader of batch `nonce` closes it once nothing is in flight.
    ///
    /// # Errors
    /// Unavailable, or not supported by this kind of node (the default).
    fn close(
        &self,
        key: &str,
        nonce: Nonce,
        lease: Duration,
    ) -> impl Future<Output = Result<Close, NodeError>> + Send {
        let _ = (key, nonce, lease);
        std::future::ready(Err(NodeError::Unavailable(
            "no rendezvous on this node".to_string(),
        )))
    }

    /// Rendezvous `finish`: batch `nonce` is done; publish `message` to the waiting clients.
    ///
    /// # Errors
    /// Unavailable, or not supported by this kind of node (the default).
    fn finish(
        &self,
        key: &str,
        nonce: Nonce,
        message: String,
    ) -> impl Future<Output = Result<(), NodeError>> + Send {
        let _ = (key, nonce, message);
        std::future::ready(Err(NodeError::Unavailable(
            "no rendezvous on this node".to_string(),
        )))
    }

    /// The results channel of combined rounds: every message published by `finish` from
    /// the moment this resolves, until the connection ends.
    ///
    /// # Errors
    /// Unavailable, or not supported by this kind of node (the default).
    fn subscribe(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<BoxStream<'static, String>, NodeError>> + Send {
        let _ = key;
        std::future::ready(Err(NodeError::Unavailable(
            "no rendezvous on this node".to_string(),
        )))
    }

    /// Makes sure the node is usable (connected, durable) before the first round.
    ///
    /// # Errors
    /// As the first round would see it.
    fn warm_up(&self) -> impl Future<Output = Result<(), NodeError>> + Send;
}

impl Register for Node {
    fn addr(&self) -> &str {
        Node::addr(self)
    }

    fn conditional_write(
        &self,
        key: &str,
        lo: u64,
        hi: u64,
        batch: Option<Nonce>,
    ) -> impl Future<Output = Result<Written, NodeError>> + Send {
        Node::conditional_write(self, key, lo, hi, batch)
    }

    fn read(&self, key: &str) -> impl Future<Output = Result<u64, NodeError>> + Send {
        Node::read(self, key)
    }

    fn warm_up(&self) -> impl Future<Output = Result<(), NodeError>> + Send {
        Node::warm_up(self)
    }

    async fn join(
        &self,
        key: &str,
        n: u64,
        nonce: Nonce,
        leases: Leases,
    ) -> Result<Join, NodeError> {
        let args = [
            "join".to_string(),
            n.to_string(),
            nonce.to_string(),
            millis(leases.round),
            crate::quorum::MAX_COUNT.to_string(),
            millis(leases.batch),
        ];
        let value = self.rendezvous(key, &args).await?;
        let unexpected =
            || NodeError::Unavailable(format!("unexpected rendezvous reply {value:?}"));
        let Value::Array(items) = &value else {
            return Err(unexpected());
        };
        match items.as_slice() {
            [Value::Int(0)] => Ok(Join::Full),
            [Value::Int(1), batch, offset, Value::Int(pttl)] => {
                match (nonce_of(batch), number(offset)) {
                    (Some(batch), Some(offset)) => Ok(Join::Follow {
                        batch,
                        offset,
                        wait: pttl_duration(*pttl),
                    }),
                    _ => Err(unexpected()),
                }
            }
            [Value::Int(2)] => Ok(Join::Solo),
            [Value::Int(3), busy, Value::Int(pttl)] => nonce_of(busy)
                .map(|busy| Join::Lead {
                    busy,
                    wait: pttl_duration(*pttl),
                })
                .ok_or_else(unexpected),
            _ => Err(unexpected()),
        }
    }

    async fn close(&self, key: &str, nonce: Nonce, lease: Duration) -> Result<Close, NodeError> {
        let value = self
            .rendezvous(
                key,
                &["close".to_string(), nonce.to_string(), millis(lease)],
            )
            .await?;
        let unexpected =
            || NodeError::Unavailable(format!("unexpected rendezvous reply {value:?}"));
        let Value::Array(items) = &value else {
            return Err(unexpected());
        };
        match items.as_slice() {
            [Value::Int(0)] => Ok(Close::Gone),
            [Value::Int(1), ids] => number(ids)
                .map(|ids| Close::Closed { ids })
                .ok_or_else(unexpected),
            [Value::Int(3), busy, Value::Int(pttl)] => nonce_of(busy)
                .map(|busy| Close::Busy {
                    busy,
                    wait: pttl_duration(*pttl),
                })
                .ok_or_else(unexpected),
            _ => Err(unexpected()),
        }
    }

    async fn finish(&self, key: &str, nonce: Nonce, message: String) -> Result<(), NodeError> {
        self.rendezvous(key, &["finish".to_string(), nonce.to_string(), message])
            .await
            .map(|_| ())
    }

    async fn subscribe(&self, key: &str) -> Result<BoxStream<'static, String>, NodeError> {
        let channel = format!("{key}:results");
        let connect = async {
            let mut pubsub = self.client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let pubsub = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(e)) => {
                return Err(NodeError::Unavailable(format!(
                    "subscribe: {}",
                    describe(&e)
                )))
            }
            Err(_) => return Err(NodeError::Unavailable("subscribe: timed out".to_string())),
        };
        // Keep the sink alive with the stream: dropping it ends the connection's driver.
        let (sink, stream) = pubsub.split();
        Ok(stream
            .filter_map(move |msg| {
                let _keep = &sink;
                std::future::ready(msg.get_payload::<String>().ok())
            })
            .boxed())
    }
}

/// A canonical decimal u64 in a bulk string.
fn number(value: &Value) -> Option<u64> {
    match value {
        Value::BulkString(bytes) => parse_canonical_u64(bytes),
        _ => None,
    }
}

/// A batch nonce in a bulk string.
fn nonce_of(value: &Value) -> Option<Nonce> {
    match value {
        Value::BulkString(bytes) => Nonce::parse(bytes),
        _ => None,
    }
}

/// A PTTL reply as a duration (a key without expiry, or a missing one, is no time at all).
fn pttl_duration(pttl: i64) -> Duration {
    Duration::from_millis(u64::try_from(pttl).unwrap_or(0))
}

/// A TTL argument in whole milliseconds, at least 1 (Redis refuses PX 0).
fn millis(ttl: Duration) -> String {
    ttl.as_millis().clamp(1, u128::from(u32::MAX)).to_string()
}

struct ConnState {
    conn: Option<MultiplexedConnection>,
    last_failure: Option<(Instant, NodeError)>,
}

/// A Redis node of the quorum.
pub struct Node {
    addr: String,
    client: redis::Client,
    config: AsyncConnectionConfig,
    check_durability: bool,
    write_sha: String,
    combine_sha: String,
    connect_timeout: Duration,
    state: tokio::sync::Mutex<ConnState>,
}

/// The settings a node must have to be part of a quorum, as `(CONFIG name, required value)`.
pub const DURABLE_SETTINGS: [(&str, &str); 4] = [
    ("appendonly", "yes"),
    ("appendfsync", "always"),
    ("no-appendfsync-on-rewrite", "no"),
    ("maxmemory-policy", "noeviction"),
];

fn describe(e: &redis::RedisError) -> String {
    if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connection_refusal() {
        "connection refused".to_string()
    } else {
        e.to_string()
    }
}

impl Node {
    /// Prepares a node; nothing is sent until first use.
    ///
    /// # Errors
    /// A URL that the redis crate cannot parse (reason in the message).
    pub fn new(
        url: &str,
        connect_timeout: Duration,
        reply_timeout: Duration,
        check_durability: bool,
    ) -> Result<Node, String> {
        if !url.starts_with("redis://") {
            return Err(format!(
                "{url:?} is not a redis:// URL (expected redis://host:port)"
            ));
        }
        let client = redis::Client::open(url).map_err(|e| format!("{url:?}: {e}"))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(reply_timeout));
        Ok(Node {
            addr: url.to_string(),
            client,
            config,
            check_durability,
            write_sha: redis::Script::new(CONDITIONAL_WRITE).get_hash().to_string(),
            combine_sha: redis::Script::new(COMBINE).get_hash().to_string(),
            connect_timeout,
            state: tokio::sync::Mutex::new(ConnState {
                conn: None,
                last_failure: None,
            }),
        })
    }

    /// The node's URL as configured.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// A connection, (re)connecting and re-checking durability when there is none.
    async fn conn(&self) -> Result<MultiplexedConnection, NodeError> {
        let mut state = self.state.lock().await;
        if let Some(conn) = &state.conn {
            return Ok(conn.clone());
        }
        if let Some((at, err)) = &state.last_failure {
            if at.elapsed() < RECONNECT_INTERVAL {
                return Err(err.clone());
            }
        }
        match self.connect().await {
            Ok(conn) => {
                state.conn = Some(conn.clone());
                state.last_failure = None;
                Ok(conn)
            }
            Err(e) => {
                state.last_failure = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    async fn connect(&self) -> Result<MultiplexedConnection, NodeError> {
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| NodeError::Unavailable(format!("connect: {}", describe(&e))))?;
        if self.check_durability {
            self.check(&mut conn).await?;
        }
        Ok(conn)
    }

    /// Reads the durability settings; returns the first unsafe one.
    async fn check(&self, conn: &mut MultiplexedConnection) -> Result<(), NodeError> {
        for (name, want) in DURABLE_SETTINGS {
            let reply: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async(conn)
                .await
                .map_err(|e| match e.kind() {
                    redis::ErrorKind::Io => {
                        NodeError::Unavailable(format!("CONFIG GET {name}: {}", describe(&e)))
                    }
                    _ => NodeError::Unsafe(format!(
                        "cannot verify durability: CONFIG GET {name} failed: {e}"
                    )),
                })?;
            let got = reply.get(1).map(String::as_str).unwrap_or("(not set)");
            if got != want {
                return Err(NodeError::Unsafe(format!(
                    "{name} is {got:?}, must be {want:?}"
                )));
            }
        }
        Ok(())
    }

    /// Checks the node's durability configuration on a fresh connection.
    ///
    /// # Errors
    /// Unreachable, or an unsafe setting (named).
    pub async fn check_durability(&self) -> Result<(), NodeError> {
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| NodeError::Unavailable(format!("connect: {}", describe(&e))))?;
        self.check(&mut conn).await
    }

    /// Makes sure a connection exists (connect and durability check).
    ///
    /// # Errors
    /// As the first round would see it.
    pub async fn warm_up(&self) -> Result<(), NodeError> {
        self.conn().await.map(|_| ())
    }

    /// Forgets the connection after a failure, so the next use reconnects (and re-checks).
    async fn drop_conn(&self, err: &NodeError) {
        let mut state = self.state.lock().await;
        state.conn = None;
        state.last_failure = Some((Instant::now(), err.clone()));
    }

    async fn fail<T>(&self, e: redis::RedisError) -> Result<T, NodeError> {
        let err = NodeError::Unavailable(describe(&e));
        // A timed-out or broken connection may have requests piled up behind a paused
        // server: start afresh rather than queue behind them.
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_unrecoverable_error()
        {
            self.drop_conn(&err).await;
        }
        Err(err)
    }

    /// Runs a script by hash, sending its source once when the node does not have it
    /// cached (after a restart). A bad register value is [`NodeError::BadValue`].
    async fn eval(
        &self,
        source: &str,
        sha: &str,
        keys: &[&str],
        args: &[String],
    ) -> Result<Value, NodeError> {
        let mut conn = self.conn().await?;
        let build = |cmd: &str, script: &str| {
            let mut c = redis::cmd(cmd);
            c.arg(script).arg(keys.len()).arg(keys).arg(args);
            c
        };
        let reply = match build("EVALSHA", sha).query_async::<Value>(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                build("EVAL", source).query_async::<Value>(&mut conn).await
            }
            other => other,
        };
        match reply {
            Ok(value) => Ok(value),
            Err(e) if e.code() == Some(BAD_VALUE_CODE) => {
                Err(NodeError::BadValue(e.detail().unwrap_or("").to_string()))
            }
            Err(e) => self.fail(e).await,
        }
    }

    /// "If current < lo then current = hi" on this node (see [`Register::conditional_write`]).
    ///
    /// # Errors
    /// Unavailable, or a register that is not a canonical u64.
    pub async fn conditional_write(
        &self,
        key: &str,
        lo: u64,
        hi: u64,
        batch: Option<Nonce>,
    ) -> Result<Written, NodeError> {
        let inflight = format!("{key}:inflight");
        let batch = batch.map(|b| b.to_string()).unwrap_or_default();
        let value = self
            .eval(
                CONDITIONAL_WRITE,
                &self.write_sha,
                &[key, &inflight],
                &[lo.to_string(), hi.to_string(), batch],
            )
            .await?;
        self.parse_write_reply(&value)
    }

    /// One rendezvous operation on the keys `<key>:batch`, `<key>:inflight` and the
    /// channel `<key>:results`.
    async fn rendezvous(&self, key: &str, args: &[String]) -> Result<Value, NodeError> {
        let keys = [
            format!("{key}:batch"),
            format!("{key}:inflight"),
            format!("{key}:results"),
        ];
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.eval(COMBINE, &self.combine_sha, &keys, args).await
    }

    fn parse_write_reply(&self, value: &Value) -> Result<Written, NodeError> {
        let unexpected = || NodeError::Unavailable(format!("unexpected script reply {value:?}"));
        let Value::Array(items) = value else {
            return Err(unexpected());
        };
        let (reply, combining) = match items.as_slice() {
            [Value::Int(1), Value::BulkString(_), Value::Int(c)] => (WriteReply::Accepted, *c),
            [Value::Int(0), Value::BulkString(cur), Value::Int(c)] => {
                match parse_canonical_u64(cur) {
                    Some(current) => (WriteReply::Rejected { current }, *c),
                    None => {
                        return Err(NodeError::BadValue(
                            String::from_utf8_lossy(cur).into_owned(),
                        ))
                    }
                }
            }
            _ => return Err(unexpected()),
        };
        Ok(Written {
            reply,
            combining: combining != 0,
        })
    }

    /// GET the register (missing = 0).
    ///
    /// # Errors
    /// Unavailable, or a register that is not a canonical u64.
    pub async fn read(&self, key: &str) -> Result<u64, NodeError> {
        let mut conn = self.conn().await?;
        match redis::cmd("GET")
            .arg(key)
            .query_async::<Value>(&mut conn)
            .await
        {
            Ok(Value::Nil) => Ok(0),
            Ok(Value::BulkString(bytes)) => parse_canonical_u64(&bytes).ok_or_else(|| {
                NodeError::BadValue(String::from_utf8_lossy(&bytes).chars().take(64).collect())
            }),
            Ok(other) => Err(NodeError::Unavailable(format!(
                "unexpected GET reply {other:?}"
            ))),
            Err(e) if e.code() == Some("WRONGTYPE") => {
                Err(NodeError::BadValue("(not a string)".to_string()))
            }
            Err(e) => self.fail(e).await,
        }
    }
}

//! One Redis node: a lazily (re)connected multiplexed connection, the durability check,
//! and the two commands the protocols need (conditional write and read).

use crate::script::{parse_canonical_u64, BAD_VALUE_CODE, CONDITIONAL_WRITE};
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

/// One register of the quorum, as the quorum client sees it. [`Node`] (Redis) is the
/// production implementation; [`crate::sim`] has an in-memory one for the deterministic
/// simulation. The client's safety rests on exactly these semantics: the register only
/// grows, and survives restarts.
pub trait Register: Send + Sync {
    /// The node's address, for error messages.
    fn addr(&self) -> &str;

    /// "If current < lo then current = hi": [`WriteReply::Accepted`], else
    /// [`WriteReply::Rejected`] with the register's value.
    ///
    /// # Errors
    /// Unavailable, or a register that is not a canonical u64.
    fn conditional_write(&self, key: &str, lo: u64, hi: u64) -> impl Future<Output = Result<WriteReply, NodeError>> + Send;

    /// The register's value (missing = 0).
    ///
    /// # Errors
    /// Unavailable, or a register that is not a canonical u64.
    fn read(&self, key: &str) -> impl Future<Output = Result<u64, NodeError>> + Send;

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

    fn conditional_write(&self, key: &str, lo: u64, hi: u64) -> impl Future<Output = Result<WriteReply, NodeError>> + Send {
        Node::conditional_write(self, key, lo, hi)
    }

    fn read(&self, key: &str) -> impl Future<Output = Result<u64, NodeError>> + Send {
        Node::read(self, key)
    }

    fn warm_up(&self) -> impl Future<Output = Result<(), NodeError>> + Send {
        Node::warm_up(self)
    }
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
    script_sha: String,
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
    pub fn new(url: &str, connect_timeout: Duration, reply_timeout: Duration, check_durability: bool) -> Result<Node, String> {
        if !url.starts_with("redis://") {
            return Err(format!("{url:?} is not a redis:// URL (expected redis://host:port)"));
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
            script_sha: redis::Script::new(CONDITIONAL_WRITE).get_hash().to_string(),
            state: tokio::sync::Mutex::new(ConnState { conn: None, last_failure: None }),
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
                    redis::ErrorKind::Io => NodeError::Unavailable(format!("CONFIG GET {name}: {}", describe(&e))),
                    _ => NodeError::Unsafe(format!("cannot verify durability: CONFIG GET {name} failed: {e}")),
                })?;
            let got = reply.get(1).map(String::as_str).unwrap_or("(not set)");
            if got != want {
                return Err(NodeError::Unsafe(format!("{name} is {got:?}, must be {want:?}")));
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
        if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_unrecoverable_error() {
            self.drop_conn(&err).await;
        }
        Err(err)
    }

    /// "If current < lo then current = hi" on this node.
    ///
    /// # Errors
    /// Unavailable, or a register that is not a canonical u64.
    pub async fn conditional_write(&self, key: &str, lo: u64, hi: u64) -> Result<WriteReply, NodeError> {
        let mut conn = self.conn().await?;
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(&self.script_sha).arg(1).arg(key).arg(lo.to_string()).arg(hi.to_string());
        let reply = match evalsha.query_async::<Value>(&mut conn).await {
            // After a restart a node has no scripts cached: send the source once.
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let mut eval = redis::cmd("EVAL");
                eval.arg(CONDITIONAL_WRITE).arg(1).arg(key).arg(lo.to_string()).arg(hi.to_string());
                eval.query_async::<Value>(&mut conn).await
            }
            other => other,
        };
        match reply {
            Ok(value) => self.parse_write_reply(&value),
            Err(e) if e.code() == Some(BAD_VALUE_CODE) => {
                Err(NodeError::BadValue(e.detail().unwrap_or("").to_string()))
            }
            Err(e) => self.fail(e).await,
        }
    }

    fn parse_write_reply(&self, value: &Value) -> Result<WriteReply, NodeError> {
        let unexpected = || NodeError::Unavailable(format!("unexpected script reply {value:?}"));
        let Value::Array(items) = value else { return Err(unexpected()) };
        match items.as_slice() {
            [Value::Int(1), Value::BulkString(_)] => Ok(WriteReply::Accepted),
            [Value::Int(0), Value::BulkString(cur)] => parse_canonical_u64(cur)
                .map(|current| WriteReply::Rejected { current })
                .ok_or_else(|| NodeError::BadValue(String::from_utf8_lossy(cur).into_owned())),
            _ => Err(unexpected()),
        }
    }

    /// GET the register (missing = 0).
    ///
    /// # Errors
    /// Unavailable, or a register that is not a canonical u64.
    pub async fn read(&self, key: &str) -> Result<u64, NodeError> {
        let mut conn = self.conn().await?;
        match redis::cmd("GET").arg(key).query_async::<Value>(&mut conn).await {
            Ok(Value::Nil) => Ok(0),
            Ok(Value::BulkString(bytes)) => parse_canonical_u64(&bytes)
                .ok_or_else(|| NodeError::BadValue(String::from_utf8_lossy(&bytes).chars().take(64).collect())),
            Ok(other) => Err(NodeError::Unavailable(format!("unexpected GET reply {other:?}"))),
            Err(e) if e.code() == Some("WRONGTYPE") => Err(NodeError::BadValue("(not a string)".to_string())),
            Err(e) => self.fail(e).await,
        }
    }
}

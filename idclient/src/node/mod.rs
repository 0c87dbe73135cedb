//! One Redis node ([`Node`], implementing [`Register`] and [`Rendezvous`]): a lazily (re)connected multiplexed connection, the durability check,
//! the two commands the protocols need (conditional write and read), and the rendezvous
//! of combined rounds (join, close, finish, and a subscription to the results).

use crate::register::{NodeError, Register, Rendezvous, WriteOutcome, WriteReply, MAX_COUNT};
use crate::rendezvous::{Close, Join, Leases, Nonce};
use crate::script::{parse_canonical_u64, BAD_VALUE_CODE, COMBINE, CONDITIONAL_WRITE};
use futures::stream::{BoxStream, StreamExt};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use std::future::Future;
use std::time::{Duration, Instant};

pub(crate) mod tls;
pub use tls::{ClientCert, TlsConfig};

/// After a failed connect, further rounds fail fast on this node for this long instead of
/// paying a connect attempt each: a dead node must not slow every round down.
pub const RECONNECT_INTERVAL: Duration = Duration::from_millis(100);

/// Who a server is, from `INFO`: what tells two nodes apart, and whether it is a master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `run_id`: random per server process, so two addresses with the same one are one
    /// server.
    pub run_id: String,
    /// `role`: `master`, or `slave` for a replica.
    pub role: String,
    /// `connected_slaves` of a master.
    pub replicas: u64,
}

impl Identity {
    /// Parses the `INFO` reply (`key:value` lines).
    pub fn parse(info: &str) -> Option<Identity> {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
                .map(str::to_string)
        };
        Some(Identity {
            run_id: field("run_id").filter(|r| !r.is_empty())?,
            role: field("role")?,
            replicas: field("connected_slaves")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
        })
    }

    /// Why this server cannot be a node of the quorum, if it cannot.
    pub fn refusal(&self) -> Option<String> {
        (self.role != "master").then(|| {
            format!(
                "is a replica (role:{}): writes to it fail, and a replica is not an independent node; list independent masters only",
                self.role
            )
        })
    }
}

/// The identities of a quorum's nodes, shared by its [`Node`]s: a node whose server is
/// already another node of the quorum (the same address twice, or two names for one
/// server) is refused when it connects, at start and on every reconnect.
#[derive(Default)]
pub(crate) struct Identities {
    seen: std::sync::Mutex<Vec<(usize, NodeAddr, String)>>,
}

impl Identities {
    /// Records that node `index` (shown as `addr`) is server `run_id`; the address of
    /// another node that is the same server, if any.
    fn claim(&self, index: usize, addr: &NodeAddr, run_id: &str) -> Option<NodeAddr> {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|(i, _, _)| *i != index);
        let other = seen
            .iter()
            .find(|(_, _, r)| r == run_id)
            .map(|(_, a, _)| a.clone());
        if other.is_none() {
            seen.push((index, addr.clone(), run_id.to_string()));
        }
        other
    }
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
    ) -> impl Future<Output = Result<WriteOutcome, NodeError>> + Send {
        Node::conditional_write(self, key, lo, hi, batch)
    }

    fn read(&self, key: &str) -> impl Future<Output = Result<u64, NodeError>> + Send {
        Node::read(self, key)
    }

    fn warm_up(&self) -> impl Future<Output = Result<(), NodeError>> + Send {
        Node::warm_up(self)
    }
}

impl Rendezvous for Node {
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
            MAX_COUNT.to_string(),
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
                let reason = self.describe_tls(&e);
                if acl_denial(&e).is_some() {
                    self.warn_denied(&reason);
                }
                return Err(NodeError::Unavailable(format!("subscribe: {reason}")));
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

/// A node's address as it may be shown: in errors, logs, `idctl check`'s output and the
/// broker's replies to its clients. It is the configured URL with any password replaced
/// by `***` (and a query string, which may carry credentials too, by `?***`): the URL
/// itself stays inside the node's `redis::Client`, so nothing printed can leak it.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeAddr(String);

impl NodeAddr {
    /// The shown form of `url` (see [`NodeAddr`]).
    pub fn from_url(url: &str) -> NodeAddr {
        let (scheme, rest) = match url.find("://") {
            Some(i) => url.split_at(i + 3),
            None => ("", url),
        };
        // The last '@' ends the user info, even when an unencoded password holds a '/'.
        let (userinfo, rest) = match rest.rfind('@') {
            Some(at) => {
                let (user, _) = rest[..at].split_once(':').unwrap_or(("", ""));
                (format!("{user}:***@"), &rest[at + 1..])
            }
            None => (String::new(), rest),
        };
        let rest = match rest.find(['?', '#']) {
            Some(q) => format!("{}?***", &rest[..q]),
            None => rest.to_string(),
        };
        NodeAddr(format!("{scheme}{userinfo}{rest}"))
    }

    /// The shown form, as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Debug for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// The one connection every call to a node shares (multiplexed), and the last failure
/// to open it: a node that just failed is not reconnected before `RECONNECT_INTERVAL`.
struct SharedConn {
    conn: Option<MultiplexedConnection>,
    last_failure: Option<(Instant, NodeError)>,
}

/// A Redis node of the quorum. Deliberately not `Debug`: its client holds the URL.
pub struct Node {
    addr: NodeAddr,
    /// A `rediss://` node.
    secure: bool,
    client: redis::Client,
    config: AsyncConnectionConfig,
    check_durability: bool,
    write_sha: String,
    combine_sha: String,
    connect_timeout: Duration,
    state: tokio::sync::Mutex<SharedConn>,
    /// An ACL denial was logged: once per node, since a denied rendezvous only makes
    /// clients fall back to their own rounds, silently but for this warning.
    warned_denied: std::sync::atomic::AtomicBool,
    /// This node's place among its quorum's identities (none for a node on its own).
    peers: Option<(usize, std::sync::Arc<Identities>)>,
}

/// The settings a node must have to be part of a quorum, as `(CONFIG name, required value)`.
pub const DURABLE_SETTINGS: [(&str, &str); 4] = [
    ("appendonly", "yes"),
    ("appendfsync", "always"),
    ("no-appendfsync-on-rewrite", "no"),
    ("maxmemory-policy", "noeviction"),
];

/// What went wrong, in words: a refused connection, a timeout, a command the node's ACL
/// denies (see [`acl_denial`]), or the redis crate's own text (which never holds the URL).
fn describe(e: &redis::RedisError) -> String {
    if let Some(denied) = acl_denial(e) {
        denied
    } else if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connection_refusal() {
        "connection refused".to_string()
    } else {
        e.to_string()
    }
}

/// A `NOPERM` reply, to a command or to a command inside a script, as a sentence that
/// says it is the node's ACL, quotes what Redis named (the command, key or channel), and
/// says where the needed permissions are listed.
fn acl_denial(e: &redis::RedisError) -> Option<String> {
    let text = e.to_string();
    let denied = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
        || text.contains("NOPERM");
    denied.then(|| {
        format!("the Redis ACL of this user denies it ({text}); a qlist user needs the commands, keys and channels docs/operations-redis.md lists")
    })
}

/// A script stopped by the node's ACL: Redis 7 says only "The user executing the script
/// can't run this command or subcommand" (or can't access a key or channel) and the
/// script line, so the command is named from that line of `source`: what to grant.
fn script_acl_denial(e: &redis::RedisError, source: &str) -> Option<String> {
    let text = e.to_string();
    if !text.contains("The user executing the script can't") {
        return None;
    }
    let line: Option<usize> = text
        .split("@user_script:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok());
    let commands = line.map_or_else(Vec::new, |n| script_line_commands(source, n));
    let what = if commands.is_empty() {
        "a command inside qlist's script".to_string()
    } else {
        format!(
            "{} (run by qlist's script, line {})",
            commands.join(" or "),
            line.unwrap_or(0)
        )
    };
    Some(format!("the Redis ACL of this user denies {what}: {text}; a qlist user needs the commands, keys and channels docs/operations-redis.md lists"))
}

/// The Redis commands line `line` (from 1) of a script's `source` runs
/// (`redis.call('CMD', ...)` or `redis.pcall('CMD', ...)`), in order.
fn script_line_commands(source: &str, line: usize) -> Vec<&str> {
    let Some(code) = line.checked_sub(1).and_then(|i| source.lines().nth(i)) else {
        return Vec::new();
    };
    code.split("redis.")
        .skip(1)
        .filter_map(|call| {
            let call = call
                .strip_prefix("call('")
                .or_else(|| call.strip_prefix("pcall('"))?;
            call.split('\'').next()
        })
        .collect()
}

impl Node {
    /// Prepares a node; nothing is sent until first use. A `rediss://` node trusts the
    /// system's CAs (see [`Node::with_tls`]).
    ///
    /// # Errors
    /// A URL that the redis crate cannot parse (reason in the message).
    pub fn new(
        url: &str,
        connect_timeout: Duration,
        reply_timeout: Duration,
        check_durability: bool,
    ) -> Result<Node, String> {
        Node::with_tls(
            url,
            connect_timeout,
            reply_timeout,
            check_durability,
            &TlsConfig::default(),
        )
    }

    /// Prepares a node reached as `tls` says when its URL is `rediss://`; nothing is sent
    /// until first use.
    ///
    /// # Errors
    /// A URL that the redis crate cannot parse, a `redis://` URL while `tls` is set (TLS
    /// settings apply to every node), or an unreadable CA or client certificate file
    /// (named).
    pub fn with_tls(
        url: &str,
        connect_timeout: Duration,
        reply_timeout: Duration,
        check_durability: bool,
        tls: &TlsConfig,
    ) -> Result<Node, String> {
        use redis::IntoConnectionInfo;
        let addr = NodeAddr::from_url(url);
        let secure = url.starts_with("rediss://");
        if !secure && !url.starts_with("redis://") {
            return Err(format!(
                "{addr:?} is not a redis:// URL (expected redis://host:port, or rediss://host:port for TLS)"
            ));
        }
        if !secure && tls.is_set() {
            return Err(format!(
                "{addr:?} is a plain redis:// node, but TLS settings (--tls-ca, --tls-cert) are given: they apply to every node, so list each node as rediss://host:port (a plain node would get the same credentials in clear text)"
            ));
        }
        let info = url
            .into_connection_info()
            .map_err(|e| format!("{addr:?}: {e}"))?;
        // No CLIENT SETINFO on connect: a qlist user's ACL then needs only the commands
        // docs/operations-redis.md lists, and nothing is denied in the node's ACL LOG.
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        let info = info.set_redis_settings(settings);
        let client = if secure {
            tls::install_crypto_provider();
            redis::Client::build_with_tls(info, tls.load()?)
        } else {
            redis::Client::open(info)
        }
        .map_err(|e| format!("{addr:?}: {e}"))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(reply_timeout));
        Ok(Node {
            addr,
            secure,
            client,
            config,
            check_durability,
            write_sha: redis::Script::new(CONDITIONAL_WRITE).get_hash().to_string(),
            combine_sha: redis::Script::new(COMBINE).get_hash().to_string(),
            connect_timeout,
            state: tokio::sync::Mutex::new(SharedConn {
                conn: None,
                last_failure: None,
            }),
            peers: None,
            warned_denied: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Makes this node number `index` of a quorum whose nodes share `peers`: it then
    /// refuses to connect to a server that another node of the quorum already is.
    pub(crate) fn with_peers(mut self, index: usize, peers: std::sync::Arc<Identities>) -> Node {
        self.peers = Some((index, peers));
        self
    }

    /// The node's address as it may be shown: the URL without its password.
    pub fn addr(&self) -> &str {
        self.addr.as_str()
    }

    /// The node's address as a [`NodeAddr`].
    pub fn node_addr(&self) -> &NodeAddr {
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

    /// A new connection for the rounds: the node identified (a replica, or a server that
    /// another node of the quorum already is, is refused) and, unless the check is off,
    /// its durability checked.
    async fn connect(&self) -> Result<MultiplexedConnection, NodeError> {
        let (mut conn, identity) = self.open_identified().await?;
        if let Some((index, peers)) = &self.peers {
            if let Some(other) = peers.claim(*index, &self.addr, &identity.run_id) {
                return Err(NodeError::NotIndependent(format!(
                    "is the same Redis server as node {other} (run_id {}): each server must be listed once, or the quorum tolerates fewer failures than its node count says",
                    identity.run_id
                )));
            }
        }
        if identity.replicas > 0 {
            tracing::warn!(node = %self.addr, replicas = identity.replicas, "node has replicas: a failover to an asynchronous replica can lose acknowledged writes");
        }
        if self.check_durability {
            self.check(&mut conn).await?;
        }
        Ok(conn)
    }

    /// A fresh connection and the identity of the server behind it, a replica refused:
    /// where [`Node::connect`] (the rounds' connection) and [`Node::inspect`] (`idctl
    /// check`) start alike.
    async fn open_identified(&self) -> Result<(MultiplexedConnection, Identity), NodeError> {
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| NodeError::Unavailable(format!("connect: {}", self.describe_tls(&e))))?;
        let identity = self.identify(&mut conn).await?;
        if let Some(reason) = identity.refusal() {
            return Err(NodeError::NotIndependent(reason));
        }
        Ok((conn, identity))
    }

    /// The server's identity (`INFO`).
    async fn identify(&self, conn: &mut MultiplexedConnection) -> Result<Identity, NodeError> {
        let info: String =
            redis::cmd("INFO")
                .query_async(conn)
                .await
                .map_err(|e| match e.kind() {
                    redis::ErrorKind::Io => {
                        NodeError::Unavailable(format!("INFO: {}", self.describe_tls(&e)))
                    }
                    _ => NodeError::NotIndependent(format!(
                        "cannot tell which server this is: INFO failed: {}",
                        describe(&e)
                    )),
                })?;
        Identity::parse(&info).ok_or_else(|| {
            NodeError::NotIndependent(
                "cannot tell which server this is: INFO has no run_id or role".to_string(),
            )
        })
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
                        "cannot verify durability: CONFIG GET {name} failed: {}",
                        describe(&e)
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

    /// [`describe`], saying so when a `rediss://` node's TLS failed: the handshake itself
    /// (a certificate from another CA, a name that does not match), or the node's alert
    /// on the first reply (TLS 1.3 reports a missing client certificate only then).
    fn describe_tls(&self, e: &redis::RedisError) -> String {
        const TLS_FAILURES: [&str; 5] = [
            "invalid peer certificate",
            "received fatal alert",
            "peer is incompatible",
            "peer misbehaved",
            "corrupt message",
        ];
        let what = describe(e);
        if self.secure && TLS_FAILURES.iter().any(|f| what.contains(f)) {
            format!("TLS handshake failed: {what}")
        } else {
            what
        }
    }

    /// Checks the node's durability configuration on a fresh connection.
    ///
    /// # Errors
    /// Unreachable, or an unsafe setting (named).
    pub async fn check_durability(&self) -> Result<(), NodeError> {
        self.inspect().await.map(|_| ())
    }

    /// What `idctl check` asks of a node, on a fresh connection: who it is, and its
    /// durability configuration.
    ///
    /// # Errors
    /// Unreachable, a replica ([`NodeError::NotIndependent`]) or an unsafe setting.
    pub async fn inspect(&self) -> Result<Identity, NodeError> {
        let (mut conn, identity) = self.open_identified().await?;
        self.check(&mut conn).await?;
        Ok(identity)
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
        let reason = describe(&e);
        if acl_denial(&e).is_some() {
            self.warn_denied(&reason);
        }
        self.fail_with(e, reason).await
    }

    /// Logs the first ACL denial on this node as a warning: the errors of rounds name it,
    /// but a denied rendezvous (SUBSCRIBE, PUBLISH) is otherwise only slower IDs.
    fn warn_denied(&self, reason: &str) {
        if !self
            .warned_denied
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(node = %self.addr, "{reason}");
        }
    }

    /// As [`Node::fail`], with the reason already put in words.
    async fn fail_with<T>(&self, e: redis::RedisError, reason: String) -> Result<T, NodeError> {
        let err = NodeError::Unavailable(reason);
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
            Err(e) => match script_acl_denial(&e, source) {
                Some(reason) => {
                    self.warn_denied(&reason);
                    self.fail_with(e, reason).await
                }
                None => self.fail(e).await,
            },
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
    ) -> Result<WriteOutcome, NodeError> {
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

    fn parse_write_reply(&self, value: &Value) -> Result<WriteOutcome, NodeError> {
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
        Ok(WriteOutcome {
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

pub(crate) mod heartbeat;

#[cfg(test)]
mod tests;

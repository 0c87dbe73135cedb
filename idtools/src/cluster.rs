//! Start and stop a local quorum of `redis-server` processes configured for durability.
//!
//! [`LocalQuorum`] is used three ways: `idctl cluster up/down` (processes outlive the
//! command, their pids are recorded in `DIR/cluster.json`), and tests and benchmarks
//! ([`LocalQuorum::temp`]: free loopback ports in a temp dir, stopped on drop;
//! [`LocalQuorum::temp_tls`]: the same with nodes that speak TLS only; [`test_quorum`]
//! and [`test_quorum_tls`]: either, panicking with the reason, for tests).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::child::ChildGuard;

/// How long a node may take to answer PING after it was started. A node replaying a
/// large AOF can be slow; a node that takes longer is reported as failed to start.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How long `down` waits for a node to exit after SIGTERM before it sends SIGKILL.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The oldest Redis major version the nodes may run: the rendezvous script uses
/// `redis.set_repl`, and the scripts rely on Redis 7's script semantics.
pub const MIN_REDIS_MAJOR: u32 = 7;

/// The file under the cluster dir that records what `cluster up` started.
pub const STATE_FILE: &str = "cluster.json";

/// What can go wrong starting or stopping a local quorum.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("redis-server not found in PATH: install it (Debian/Ubuntu: `sudo apt-get install redis-server`) or put it on PATH")]
    RedisMissing,
    #[error("redis-server {found} is too old: qlist needs Redis {MIN_REDIS_MAJOR} or newer (its scripts use redis.set_repl); install a newer redis-server (Debian 12+/Ubuntu 24.04+: `apt-get install redis-server`)")]
    RedisTooOld { found: String },
    #[error("`redis-server --version` did not say its version ({0}): is it really redis-server?")]
    RedisVersionUnknown(String),
    #[error("port {port} on 127.0.0.1 is already in use: pick another --base-port, or stop what holds it")]
    PortInUse { port: u16 },
    #[error("node count must be odd and at least 3, got {0}")]
    BadNodeCount(usize),
    #[error("ports {base}..{base}+{nodes} do not fit below 65536")]
    BadPorts { base: u16, nodes: usize },
    #[error("redis-server on port {port} failed to start: {reason}")]
    StartFailed { port: u16, reason: String },
    #[error("{path}: a cluster is already running there (pids {pids:?}); run `idctl cluster down --dir {dir}` first", path = .state.display(), dir = .dir.display())]
    AlreadyRunning {
        state: PathBuf,
        dir: PathBuf,
        pids: Vec<u32>,
    },
    #[error("{}: no cluster state found (was `idctl cluster up --dir` run with this dir?)", .0.display())]
    NoState(PathBuf),
    #[error("{path}: {source}", path = .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: unreadable cluster state: {source}", path = .path.display())]
    State {
        path: PathBuf,
        source: serde_json::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ClusterError + '_ {
    move |source| ClusterError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// One node as recorded in `cluster.json`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NodeRecord {
    pub port: u16,
    pub pid: u32,
    pub url: String,
    pub data_dir: PathBuf,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StateFile {
    nodes: Vec<NodeRecord>,
}

/// TLS for the nodes of a [`LocalQuorum::temp_tls`] quorum: each node listens on a TLS
/// port only (`--port 0 --tls-port P`), so its URL is `rediss://127.0.0.1:P`.
#[derive(Debug, Clone)]
pub struct TlsNodes {
    /// The server certificate (PEM) every node presents: it must name 127.0.0.1 (an IP
    /// subject alternative name).
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
    /// The CA (PEM) that client certificates must chain to.
    pub ca_file: PathBuf,
    /// `tls-auth-clients yes`: a client must present a certificate signed by `ca_file`.
    /// `false`: `tls-auth-clients no`, a client certificate is optional.
    pub require_client_cert: bool,
}

impl TlsNodes {
    /// The `redis-server` arguments, after the durable ones: no plain port, TLS on `port`.
    fn args(&self, port: u16) -> Vec<String> {
        let file = |p: &Path| p.display().to_string();
        vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            file(&self.cert_file),
            "--tls-key-file".into(),
            file(&self.key_file),
            "--tls-ca-cert-file".into(),
            file(&self.ca_file),
            "--tls-auth-clients".into(),
            if self.require_client_cert {
                "yes"
            } else {
                "no"
            }
            .into(),
        ]
    }
}

/// The URL of a node on `port`: `rediss://` when it speaks TLS.
fn node_url(port: u16, tls: bool) -> String {
    let scheme = if tls { "rediss" } else { "redis" };
    format!("{scheme}://127.0.0.1:{port}")
}

struct LocalNode {
    port: u16,
    data_dir: PathBuf,
    child: Option<ChildGuard>,
}

/// A running local quorum. Dropping it stops every node it started (SIGKILL by its pid,
/// then reap: [`ChildGuard::kill`]), unless it was [`detach`](LocalQuorum::detach)ed.
pub struct LocalQuorum {
    dir: PathBuf,
    nodes: Vec<LocalNode>,
    /// The nodes speak TLS only (see [`LocalQuorum::temp_tls`]).
    tls: Option<TlsNodes>,
    _temp: Option<tempfile_guard::TempDir>,
}

mod tempfile_guard {
    //! A minimal temp-dir guard (removed on drop), so the library needs no extra crate.
    use std::path::{Path, PathBuf};

    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new(prefix: &str) -> std::io::Result<TempDir> {
            let base = std::env::temp_dir();
            for attempt in 0..100u32 {
                let name = format!(
                    "{prefix}-{}-{}-{attempt}",
                    std::process::id(),
                    rand::random::<u32>()
                );
                let path = base.join(name);
                match std::fs::create_dir(&path) {
                    Ok(()) => return Ok(TempDir(path)),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(e),
                }
            }
            Err(std::io::Error::other("could not create a unique temp dir"))
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Finds a port that is free on 127.0.0.1 right now (the OS picks it).
pub fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

fn port_is_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// The `redis-server` arguments that make a node safe for the quorum (DESIGN.md).
pub fn durable_args(port: u16, data_dir: &Path) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--port".into(),
        port.to_string(),
        "--bind".into(),
        "127.0.0.1".into(),
        "--dir".into(),
        data_dir.display().to_string(),
        "--logfile".into(),
        data_dir.join("redis.log").display().to_string(),
        "--daemonize".into(),
        "no".into(),
        "--appendonly".into(),
        "yes".into(),
        "--appendfsync".into(),
        "always".into(),
        "--no-appendfsync-on-rewrite".into(),
        "no".into(),
        "--maxmemory-policy".into(),
        "noeviction".into(),
        // No RDB snapshots: the AOF is the durable copy.
        "--save".into(),
        "".into(),
    ];
    args.shrink_to_fit();
    args
}

/// The version in `redis-server --version`'s output ("Redis server v=7.0.15 sha=..."),
/// as (major, the whole version string).
fn parse_redis_version(output: &str) -> Option<(u32, String)> {
    let version = output
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))?;
    let major = version.split('.').next()?.parse().ok()?;
    Some((major, version.to_string()))
}

/// What `redis-server --version` told, kept for the life of the process.
#[derive(Clone)]
enum RedisVersion {
    Usable,
    Missing,
    TooOld(String),
    Unknown(String),
}

/// Refuses a redis-server on PATH older than [`MIN_REDIS_MAJOR`]. Asked once per process.
///
/// # Errors
/// redis-server missing, too old, or not saying its version.
pub fn check_redis_version() -> Result<(), ClusterError> {
    static VERDICT: std::sync::OnceLock<RedisVersion> = std::sync::OnceLock::new();
    let verdict =
        VERDICT.get_or_init(
            || match Command::new("redis-server").arg("--version").output() {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => RedisVersion::Missing,
                Err(e) => RedisVersion::Unknown(format!("cannot run it: {e}")),
                Ok(out) => {
                    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
                    match parse_redis_version(&text) {
                        Some((major, _)) if major >= MIN_REDIS_MAJOR => RedisVersion::Usable,
                        Some((_, version)) => RedisVersion::TooOld(version),
                        None => RedisVersion::Unknown(text),
                    }
                }
            },
        );
    match verdict.clone() {
        RedisVersion::Usable => Ok(()),
        RedisVersion::Missing => Err(ClusterError::RedisMissing),
        RedisVersion::TooOld(found) => Err(ClusterError::RedisTooOld { found }),
        RedisVersion::Unknown(text) => Err(ClusterError::RedisVersionUnknown(text)),
    }
}

/// Starts one redis-server in its own process group (so a terminal's Ctrl-C does not reach
/// a detached cluster) and waits until it answers PING (a plain node), or until its own
/// log says it is ready (a TLS node, which the plain-text probe cannot ask). The node is
/// guarded from its spawn on: stopped by its pid if the caller drops it.
fn spawn_node(
    port: u16,
    data_dir: &Path,
    extra_args: &[String],
    tls: Option<&TlsNodes>,
) -> Result<ChildGuard, ClusterError> {
    std::fs::create_dir_all(data_dir).map_err(io_err(data_dir))?;
    // A restarted node appends to its old log: only what this process writes counts.
    let log_start = std::fs::metadata(data_dir.join("redis.log")).map_or(0, |m| m.len());
    let mut cmd = Command::new("redis-server");
    cmd.args(durable_args(port, data_dir))
        .args(extra_args)
        .args(tls.map(|t| t.args(port)).unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    let child = cmd.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ClusterError::RedisMissing,
        _ => ClusterError::StartFailed {
            port,
            reason: e.to_string(),
        },
    })?;
    let pid = child.id();
    let mut child = ChildGuard::new(format!("redis-server on port {port}"), child);
    let started = Instant::now();
    let mut stranger = None;
    loop {
        // Our child first: a server answering on the port proves nothing while another
        // process (another test's node, restarted onto a port it freed) may hold it.
        if let Some(status) = child.try_wait() {
            let holder = stranger.map_or(String::new(), |other| {
                format!(" (port held by another redis-server, pid {other})")
            });
            return Err(ClusterError::StartFailed {
                port,
                reason: format!("exited with {status}{holder}; log: {}", log_tail(data_dir)),
            });
        }
        if tls.is_some() {
            // Written after the listeners are bound: by this very process, since the log
            // is its own, so a stranger on the port cannot pass for it.
            if log_says_ready(data_dir, log_start) {
                return Ok(child);
            }
        } else {
            match server_pid(port) {
                Some(found) if found == pid => return Ok(child),
                Some(found) => stranger = Some(found),
                None => {}
            }
        }
        if started.elapsed() > START_TIMEOUT {
            child.kill();
            let holder = stranger.map_or(String::new(), |other| {
                format!("; another redis-server (pid {other}) answers on the port")
            });
            return Err(ClusterError::StartFailed {
                port,
                reason: format!(
                    "no answer from its own process (pid {pid}) within {START_TIMEOUT:?}{holder}; log: {}",
                    log_tail(data_dir)
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a [`ClusterError::StartFailed`] reason of [`spawn_node`] says another process
/// held the port: redis' own bind error in its log, or another redis-server answering.
fn lost_the_port(reason: &str) -> bool {
    reason.contains("Address already in use")
        || reason.contains("port held by another")
        || reason.contains("answers on the port")
}

/// Longest `INFO server` reply read: it is about 1.5 KB.
const MAX_INFO_REPLY: usize = 64 * 1024;

/// The `process_id` a Redis server on 127.0.0.1:`port` reports in `INFO server`, if one
/// answers: which process is really behind the port.
pub fn server_pid(port: u16) -> Option<u32> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    stream.write_all(b"INFO server\r\n").ok()?;
    // A bulk string: "$<len>\r\n<len bytes>\r\n".
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        reply.extend_from_slice(&buf[..n]);
        if reply.first() != Some(&b'$') {
            return None; // an error reply, or not Redis at all
        }
        let text = String::from_utf8_lossy(&reply);
        if let Some((head, body)) = text[1..].split_once("\r\n") {
            let len: usize = head.parse().ok()?;
            if body.len() >= len {
                return body[..len]
                    .lines()
                    .find_map(|l| l.strip_prefix("process_id:"))
                    .and_then(|pid| pid.trim().parse().ok());
            }
        }
        if reply.len() > MAX_INFO_REPLY {
            return None;
        }
    }
}

/// True when the node's log, from byte `from` on, says it accepts connections.
fn log_says_ready(data_dir: &Path, from: u64) -> bool {
    let text = std::fs::read(data_dir.join("redis.log")).unwrap_or_default();
    let start = usize::try_from(from).unwrap_or(usize::MAX).min(text.len());
    String::from_utf8_lossy(&text[start..]).contains("Ready to accept connections")
}

fn log_tail(data_dir: &Path) -> String {
    let text = std::fs::read_to_string(data_dir.join("redis.log")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    let tail: Vec<&str> = lines.into_iter().rev().collect();
    if tail.is_empty() {
        "(empty)".to_string()
    } else {
        tail.join(" | ")
    }
}

/// True when a Redis server on 127.0.0.1:`port` answers PING.
pub fn ping(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// A throwaway quorum of `nodes` for a test ([`LocalQuorum::temp`]): the one way the
/// tests start their Redis nodes.
///
/// # Panics
/// If the quorum cannot start, with the reason (a missing or too old redis-server says
/// how to install one): a test that needs Redis fails clearly, it never skips.
#[track_caller]
pub fn test_quorum(nodes: usize) -> LocalQuorum {
    LocalQuorum::temp(nodes)
        .unwrap_or_else(|e| panic!("cannot start a {nodes}-node redis-server quorum: {e}"))
}

/// [`test_quorum`] with nodes that speak TLS only ([`LocalQuorum::temp_tls`]).
///
/// # Panics
/// As [`test_quorum`]; also if redis-server was built without TLS or refuses the files.
#[track_caller]
pub fn test_quorum_tls(nodes: usize, tls: TlsNodes) -> LocalQuorum {
    LocalQuorum::temp_tls(nodes, tls).unwrap_or_else(|e| {
        panic!("cannot start a {nodes}-node TLS redis-server quorum (redis-server built with TLS?): {e}")
    })
}

/// Runs one command (`args[0]` and its arguments) on the Redis node at `url`, over a
/// connection of its own, as the URL's user: how tests set up, break or inspect a node
/// behind the client's back. Its reply.
///
/// # Panics
/// If `args` is empty, the node cannot be reached, or it answers with an error (the
/// message has the command).
pub async fn node_command<A: AsRef<str>>(url: &str, args: &[A]) -> redis::Value {
    let (name, rest) = args.split_first().expect("a command");
    let mut conn = redis::Client::open(url)
        .expect("node URL")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("connect to a node for {:?}: {e}", name.as_ref()));
    let mut cmd = redis::cmd(name.as_ref());
    for a in rest {
        cmd.arg(a.as_ref());
    }
    cmd.query_async(&mut conn).await.unwrap_or_else(|e| {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        panic!("{args:?}: {e}")
    })
}

impl LocalQuorum {
    /// Starts `nodes` durable redis-servers on ports `base_port..` with data dirs under
    /// `dir`, and records them in `dir/cluster.json`. Nodes stop when the value drops,
    /// unless [`detach`](Self::detach) is called.
    ///
    /// # Errors
    /// An even or too small node count, a port in use, redis-server missing or failing
    /// to start (the nodes already started are stopped again), a cluster already running
    /// in `dir`, or the state file not writable.
    pub fn start(dir: &Path, nodes: usize, base_port: u16) -> Result<LocalQuorum, ClusterError> {
        check_node_count(nodes)?;
        check_redis_version()?;
        if usize::from(base_port) + nodes > 65536 || base_port == 0 {
            return Err(ClusterError::BadPorts {
                base: base_port,
                nodes,
            });
        }
        let state = dir.join(STATE_FILE);
        if let Ok(old) = read_state(dir) {
            let alive: Vec<u32> = old
                .iter()
                .filter(|n| is_our_redis(n.pid, n.port))
                .map(|n| n.pid)
                .collect();
            if !alive.is_empty() {
                return Err(ClusterError::AlreadyRunning {
                    state,
                    dir: dir.to_path_buf(),
                    pids: alive,
                });
            }
        }
        let ports: Vec<u16> = (0..nodes).map(|i| base_port + i as u16).collect();
        if let Some(&port) = ports.iter().find(|&&p| !port_is_free(p)) {
            return Err(ClusterError::PortInUse { port });
        }
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let mut quorum = LocalQuorum {
            dir: dir.to_path_buf(),
            nodes: Vec::new(),
            tls: None,
            _temp: None,
        };
        for port in ports {
            let data_dir = dir.join(format!("node-{port}"));
            // Free a moment ago, the port can be taken before redis binds it: that is a
            // port in use too (callers pick other ports), not a broken redis.
            let child = spawn_node(port, &data_dir, &[], None).map_err(|e| match e {
                ClusterError::StartFailed { port, reason } if lost_the_port(&reason) => {
                    ClusterError::PortInUse { port }
                }
                e => e,
            })?;
            quorum.nodes.push(LocalNode {
                port,
                data_dir,
                child: Some(child),
            });
        }
        quorum.write_state()?;
        Ok(quorum)
    }

    /// Starts a throwaway quorum on free loopback ports in a fresh temp dir; everything
    /// is stopped and removed on drop. This is what tests and benchmarks use.
    ///
    /// # Errors
    /// As [`LocalQuorum::start`].
    pub fn temp(nodes: usize) -> Result<LocalQuorum, ClusterError> {
        LocalQuorum::temp_with_args(nodes, &[])
    }

    /// Like [`LocalQuorum::temp`], with extra `redis-server` arguments appended to the
    /// durable ones (tests use this to start a deliberately unsafe node).
    ///
    /// # Errors
    /// As [`LocalQuorum::start`].
    pub fn temp_with_args(
        nodes: usize,
        extra_args: &[String],
    ) -> Result<LocalQuorum, ClusterError> {
        LocalQuorum::temp_inner(nodes, extra_args, None)
    }

    /// Like [`LocalQuorum::temp`], with nodes that speak TLS only: their URLs are
    /// `rediss://127.0.0.1:PORT`, and a client must trust the CA that signed
    /// `tls.cert_file`.
    ///
    /// # Errors
    /// As [`LocalQuorum::start`]; a node that rejects the certificate files fails to start
    /// (its log tail in the error).
    pub fn temp_tls(nodes: usize, tls: TlsNodes) -> Result<LocalQuorum, ClusterError> {
        LocalQuorum::temp_inner(nodes, &[], Some(tls))
    }

    fn temp_inner(
        nodes: usize,
        extra_args: &[String],
        tls: Option<TlsNodes>,
    ) -> Result<LocalQuorum, ClusterError> {
        if nodes == 0 {
            return Err(ClusterError::BadNodeCount(nodes));
        }
        check_redis_version()?;
        let temp =
            tempfile_guard::TempDir::new("qlist-quorum").map_err(io_err(&std::env::temp_dir()))?;
        let dir = temp.path().to_path_buf();
        let mut quorum = LocalQuorum {
            dir: dir.clone(),
            nodes: Vec::new(),
            tls,
            _temp: None,
        };
        for i in 0..nodes {
            let data_dir = dir.join(format!("node-{i}"));
            // A free port can be taken between our probe and redis' bind: try a few.
            let mut last = None;
            for _ in 0..5 {
                let port = free_port().map_err(io_err(&dir))?;
                match spawn_node(port, &data_dir, extra_args, quorum.tls.as_ref()) {
                    Ok(child) => {
                        quorum.nodes.push(LocalNode {
                            port,
                            data_dir: data_dir.clone(),
                            child: Some(child),
                        });
                        last = None;
                        break;
                    }
                    Err(e @ ClusterError::RedisMissing) => return Err(e),
                    Err(e) => last = Some(e),
                }
            }
            if let Some(e) = last {
                return Err(e);
            }
        }
        quorum._temp = Some(temp);
        Ok(quorum)
    }

    /// The directory holding the nodes' data dirs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// A quorum always has nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The nodes' ports, in order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The nodes' URLs (`redis://127.0.0.1:PORT`, or `rediss://` for TLS nodes), in order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| node_url(n.port, self.tls.is_some()))
            .collect()
    }

    /// The URLs joined by commas, as `--nodes` takes them.
    pub fn urls_arg(&self) -> String {
        self.urls().join(",")
    }

    /// The pid of node `i`, if it is running.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().and_then(ChildGuard::pid)
    }

    /// kill -9 node `i` and reap it. Its data dir stays, so [`restart`](Self::restart)
    /// brings it back with everything it had fsynced.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            child.kill();
        }
    }

    /// Starts node `i` again on its old port and data dir.
    ///
    /// # Errors
    /// The node fails to start (e.g. its port was taken meanwhile).
    pub fn restart(&mut self, i: usize) -> Result<(), ClusterError> {
        self.kill(i);
        let node = &mut self.nodes[i];
        node.child = Some(spawn_node(
            node.port,
            &node.data_dir,
            &[],
            self.tls.as_ref(),
        )?);
        if self._temp.is_none() {
            self.write_state()?;
        }
        Ok(())
    }

    /// SIGSTOP node `i`: it keeps its connections but answers nothing until resumed.
    pub fn pause(&self, i: usize) {
        self.signal(i, libc::SIGSTOP);
    }

    /// SIGCONT node `i`.
    pub fn resume(&self, i: usize) {
        self.signal(i, libc::SIGCONT);
    }

    fn signal(&self, i: usize, sig: libc::c_int) {
        if let Some(child) = &self.nodes[i].child {
            child.signal(sig);
        }
    }

    /// Leaves the nodes running after this value is dropped (for `idctl cluster up`);
    /// `cluster down` stops them by the pids in the state file.
    pub fn detach(mut self) -> Vec<NodeRecord> {
        let records = self.records();
        for node in &mut self.nodes {
            if let Some(child) = node.child.take() {
                // Released unstopped: dropping a `Child` neither kills nor waits.
                let _ = child.release();
            }
        }
        records
    }

    fn records(&self) -> Vec<NodeRecord> {
        self.nodes
            .iter()
            .filter_map(|n| {
                n.child
                    .as_ref()
                    .and_then(ChildGuard::pid)
                    .map(|pid| NodeRecord {
                        port: n.port,
                        pid,
                        url: node_url(n.port, self.tls.is_some()),
                        data_dir: n.data_dir.clone(),
                    })
            })
            .collect()
    }

    fn write_state(&self) -> Result<(), ClusterError> {
        let path = self.dir.join(STATE_FILE);
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        let json = serde_json::to_vec_pretty(&StateFile {
            nodes: self.records(),
        })
        .map_err(|source| ClusterError::State {
            path: path.clone(),
            source,
        })?;
        std::fs::write(&tmp, json).map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io_err(&path))
    }
}

impl Drop for LocalQuorum {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            // A paused node must be resumed or SIGKILL still works; SIGKILL works on
            // stopped processes, so just kill.
            self.kill(i);
        }
    }
}

fn check_node_count(nodes: usize) -> Result<(), ClusterError> {
    if nodes < 3 || nodes.is_multiple_of(2) {
        return Err(ClusterError::BadNodeCount(nodes));
    }
    Ok(())
}

/// Reads the nodes recorded by `cluster up` in `dir`.
///
/// # Errors
/// No state file, or one that does not parse.
pub fn read_state(dir: &Path) -> Result<Vec<NodeRecord>, ClusterError> {
    let path = dir.join(STATE_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ClusterError::NoState(dir.to_path_buf()))
        }
        Err(e) => return Err(ClusterError::Io { path, source: e }),
    };
    let state: StateFile =
        serde_json::from_slice(&bytes).map_err(|source| ClusterError::State { path, source })?;
    Ok(state.nodes)
}

/// True if `pid` is alive, not a zombie, and is a redis-server on `port` (so a recycled
/// pid is never signalled).
fn is_our_redis(pid: u32, port: u16) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let cmdline = String::from_utf8_lossy(&cmdline);
    if !cmdline.contains("redis-server") {
        return false;
    }
    // redis-server rewrites its title to "redis-server 127.0.0.1:PORT".
    if !(cmdline.contains(&format!(":{port}")) || cmdline.contains(&format!("\0{port}\0"))) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Stops the nodes `cluster up` started in `dir`: SIGTERM by recorded pid (only if that
/// pid is still our redis-server), SIGKILL after [`STOP_TIMEOUT`]. Returns how many were
/// running. Data dirs are kept.
///
/// # Errors
/// No state file in `dir`.
pub fn down(dir: &Path) -> Result<usize, ClusterError> {
    let nodes = read_state(dir)?;
    let mut stopped = 0;
    for node in &nodes {
        if !is_our_redis(node.pid, node.port) {
            continue;
        }
        stopped += 1;
        // SAFETY: kill(2) on a pid we verified to be our redis-server just above.
        unsafe {
            libc::kill(node.pid as libc::pid_t, libc::SIGCONT);
            libc::kill(node.pid as libc::pid_t, libc::SIGTERM);
        }
        let started = Instant::now();
        while is_our_redis(node.pid, node.port) {
            if started.elapsed() > STOP_TIMEOUT {
                // SAFETY: as above.
                unsafe {
                    libc::kill(node.pid as libc::pid_t, libc::SIGKILL);
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let path = dir.join(STATE_FILE);
    std::fs::remove_file(&path).map_err(io_err(&path))?;
    Ok(stopped)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A redis-server of someone else (no AOF, throwaway dir) on `port`, stopped by its
    /// pid on drop (its guard drops before its dir).
    struct Stranger {
        child: ChildGuard,
        _dir: tempfile_guard::TempDir,
    }

    impl Stranger {
        fn start(port: u16) -> Stranger {
            let dir = tempfile_guard::TempDir::new("qlist-stranger").expect("temp dir");
            let child = ChildGuard::spawn(
                format!("a stranger redis-server on port {port} (is redis-server installed?)"),
                Command::new("redis-server")
                    .args([
                        "--port",
                        &port.to_string(),
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                    ])
                    .arg("--dir")
                    .arg(dir.path())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
            );
            let pid = child.pid().expect("just spawned");
            // The tests' one wait (testkit, a dev-dependency, builds on this crate).
            testkit::wait_for(
                &format!("the stranger redis-server (pid {pid}) answers on port {port}"),
                START_TIMEOUT,
                || server_pid(port) == Some(pid),
            );
            Stranger { child, _dir: dir }
        }

        fn pid(&self) -> u32 {
            self.child.pid().expect("the stranger runs")
        }
    }

    #[test]
    fn a_restart_onto_a_port_another_redis_took_fails() {
        let mut q = LocalQuorum::temp(3).expect("cannot start redis-server quorum");
        let port = q.ports()[0];
        assert_eq!(server_pid(port), q.pid(0));
        q.kill(0);
        let stranger = Stranger::start(port);
        let err = q
            .restart(0)
            .expect_err("restarted against someone else's redis");
        let msg = err.to_string();
        assert!(
            matches!(err, ClusterError::StartFailed { port: p, .. } if p == port),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("pid {}", stranger.pid())),
            "{msg} does not name the stranger"
        );
        assert_eq!(q.pid(0), None, "a failed restart left a child behind");
        drop(stranger);
        q.restart(0).expect("restart once the port is free");
        assert_eq!(server_pid(port), q.pid(0));
    }

    /// `LocalQuorum::start` checks its ports are free, then starts redis on them; a port
    /// taken in between must come back as `PortInUse` (callers retry elsewhere), which
    /// rests on recognizing spawn_node's failure on a held port.
    #[test]
    fn a_port_taken_before_redis_binds_it_is_recognized() {
        let port = free_port().expect("free port");
        let stranger = Stranger::start(port);
        let dir = tempfile_guard::TempDir::new("qlist-race").expect("temp dir");
        let err = spawn_node(port, &dir.path().join("node"), &[], None)
            .expect_err("started on a port another redis holds");
        match err {
            ClusterError::StartFailed { reason, .. } => assert!(lost_the_port(&reason), "{reason}"),
            other => panic!("expected StartFailed, got {other}"),
        }
        drop(stranger);
    }

    #[test]
    fn parses_redis_server_version_lines() {
        let seven = "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=1";
        assert_eq!(parse_redis_version(seven), Some((7, "7.0.15".to_string())));
        let six = "Redis server v=6.0.16 sha=00000000:0 malloc=jemalloc-5.2.1 bits=64";
        assert_eq!(parse_redis_version(six), Some((6, "6.0.16".to_string())));
        assert_eq!(parse_redis_version("KeyDB server"), None);
        assert_eq!(parse_redis_version("Redis server v=x.1"), None);
        assert_eq!(parse_redis_version(""), None);
    }
}

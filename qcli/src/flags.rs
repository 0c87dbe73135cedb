//! The ID-source flags every binary that gets IDs shares: same names, same units, same
//! help text. They are plain clap structs and need no ID client, so every binary knows
//! them (the environment-variable rule of [`mod@crate::env`] names them `QLIST_*` and
//! keeps other flags off their names); the crate `idflags` turns them into the client's
//! configurations.

use crate::exit::usage;
use clap::{ArgGroup, Args, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;

// The defaults the client has too (idclient's `ClientConfig::new`, `BACKOFF_CAP`,
// `broker_client::DEFAULT_*`), written here so that showing them in `--help` does not
// link the client; idflags' tests check that they agree.

/// `--deadline-ms`: the client's default deadline, 5 s.
pub(crate) const DEFAULT_DEADLINE_MS: u64 = 5_000;
/// `--backoff-cap-ms`: the client's `BACKOFF_CAP`, 50 ms.
pub(crate) const DEFAULT_BACKOFF_CAP_MS: u64 = 50;
/// `--connections`: the broker client's `DEFAULT_CONNECTIONS`.
pub(crate) const DEFAULT_CONNECTIONS: usize = 2;
/// `--in-flight`: the broker client's `DEFAULT_IN_FLIGHT`.
pub(crate) const DEFAULT_IN_FLIGHT: usize = 1;

/// A comma-separated list, trimmed, without empty entries.
fn clean(list: &[String]) -> Vec<String> {
    list.iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn millis(flag: &str, ms: u64) -> anyhow::Result<Duration> {
    if ms == 0 {
        return Err(usage(format!("--{flag} must be at least 1 millisecond")));
    }
    Ok(Duration::from_millis(ms))
}

/// `--nodes URLS`: the quorum's Redis nodes.
#[derive(Debug, Clone, Args)]
pub struct NodeList {
    /// Redis quorum nodes, comma-separated redis://host:port URLs (redis://:PASSWORD@host:port
    /// with a password; an odd number, 3 or more in production).
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    pub nodes: Vec<String>,
}

impl NodeList {
    /// The node URLs, trimmed; a usage error if there is none.
    ///
    /// # Errors
    /// a usage error ([`crate::usage`]) when `--nodes` names no URL.
    pub fn urls(&self) -> anyhow::Result<Vec<String>> {
        let urls = clean(&self.nodes);
        if urls.is_empty() {
            return Err(usage("--nodes: no node URL given"));
        }
        Ok(urls)
    }
}

/// Per-node timeouts (`--connect-timeout-ms`, `--reply-timeout-ms`).
#[derive(Debug, Clone, Args)]
pub struct NodeTimeouts {
    /// Time to connect to one node (or broker) and complete its checks, milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub connect_timeout_ms: u64,
    /// Time one node may take to answer one command, milliseconds; a node slower than
    /// this counts as failed for that round.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub reply_timeout_ms: u64,
    /// Old spelling (idctl): both timeouts at once, milliseconds.
    #[arg(
        long,
        value_name = "MS",
        hide = true,
        conflicts_with_all = ["connect_timeout_ms", "reply_timeout_ms"]
    )]
    pub timeout_ms: Option<u64>,
}

impl NodeTimeouts {
    /// The connect timeout.
    ///
    /// # Errors
    /// a usage error ([`crate::usage`]) for 0.
    pub fn connect(&self) -> anyhow::Result<Duration> {
        match self.timeout_ms {
            Some(ms) => millis("timeout-ms", ms),
            None => millis("connect-timeout-ms", self.connect_timeout_ms),
        }
    }

    /// The reply timeout.
    ///
    /// # Errors
    /// a usage error ([`crate::usage`]) for 0.
    pub fn reply(&self) -> anyhow::Result<Duration> {
        match self.timeout_ms {
            Some(ms) => millis("timeout-ms", ms),
            None => millis("reply-timeout-ms", self.reply_timeout_ms),
        }
    }
}

/// TLS to `rediss://` nodes (`--tls-ca`, `--tls-cert`, `--tls-key`).
#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// rediss:// nodes: PEM file of the CA that signed the nodes' certificates (default:
    /// the system's trust store). With any --tls-* flag every node must be rediss://.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// rediss:// nodes: PEM client certificate, for nodes that require one
    /// (tls-auth-clients yes). Needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// rediss:// nodes: PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// `--combine`: when a fast-protocol client shares rounds with contending clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CombineArg {
    /// After losing a round to another writer.
    Auto,
    /// From the first request (clients that know they contend).
    Always,
    /// Never: every request runs its own rounds, with backoff.
    Never,
}

/// The quorum flags: everything of the quorum client's configuration a user sets.
#[derive(Debug, Clone, Args)]
pub struct QuorumArgs {
    /// `--nodes`: the quorum's Redis nodes.
    #[command(flatten)]
    pub nodes: NodeList,
    /// The register key on every node.
    #[arg(long, default_value = "current")]
    pub key: String,
    /// `--connect-timeout-ms`, `--reply-timeout-ms`: per-node timeouts.
    #[command(flatten)]
    pub timeouts: NodeTimeouts,
    /// `--tls-ca`, `--tls-cert`, `--tls-key`: TLS to `rediss://` nodes.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Use the classic protocol (read a majority, then write max+1) instead of the fast one.
    #[arg(long)]
    pub classic: bool,
    /// Fast protocol: when to share rounds with contending clients through the
    /// rendezvous node (docs/idclient.md).
    #[arg(long, value_enum, default_value_t = CombineArg::Auto)]
    pub combine: CombineArg,
    /// Longest backoff sleep after a lost round, milliseconds. Lower is fairer between
    /// contending clients, higher leaves more of the nodes' time to winners.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_BACKOFF_CAP_MS)]
    pub backoff_cap_ms: u64,
    /// Accept nodes that do not fsync every write. DANGEROUS: a node crash can then
    /// repeat IDs.
    #[arg(long)]
    pub unsafe_skip_durability_check: bool,
}

/// `--deadline-ms`: how long one ID request may take, retries included.
#[derive(Debug, Clone, Args)]
pub struct DeadlineArgs {
    /// Give up on one ID request after this many milliseconds, all retries (and broker
    /// failovers) included.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_DEADLINE_MS)]
    pub deadline_ms: u64,
}

impl DeadlineArgs {
    /// The deadline.
    ///
    /// # Errors
    /// a usage error ([`crate::usage`]) for 0.
    pub fn deadline(&self) -> anyhow::Result<Duration> {
        millis("deadline-ms", self.deadline_ms)
    }
}

/// The broker-client flags (`--broker`, `--connections`).
#[derive(Debug, Clone, Args)]
pub struct BrokerArgs {
    /// ID brokers (idbroker), comma-separated host:port addresses, tried in order: the
    /// next one is used when the current one fails. One is enough: a follower redirects
    /// the client to the leader, which it follows even when not listed (see
    /// --broker-closed-list).
    #[arg(
        long,
        value_name = "ADDRS",
        value_delimiter = ',',
        env = "QLIST_BROKERS"
    )]
    pub broker: Vec<String>,
    /// Connections to the broker, shared by all requests (broker mode).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_CONNECTIONS)]
    pub connections: usize,
    /// Requests kept out at once (broker mode): callers arriving while that many are
    /// out go together as one request for their total count (coalescing); 0 sends every
    /// call on its own.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_IN_FLIGHT)]
    pub in_flight: usize,
    /// File holding the brokers' shared secret (their `--auth-token-file`), sent in
    /// every handshake; needed when the brokers require one.
    #[arg(long, value_name = "FILE")]
    pub broker_token_file: Option<std::path::PathBuf>,
    /// Never connect to a broker outside --broker: a redirect to a leader not in the
    /// list fails the request instead of being followed (by default it is followed,
    /// with the same token and TLS settings).
    #[arg(long)]
    pub broker_closed_list: bool,
    /// `--broker-tls-*`: TLS to brokers that listen with it.
    #[command(flatten)]
    pub tls: BrokerTlsArgs,
}

/// TLS to brokers that listen with it (their `--listen-tls-cert`): `--broker-tls-ca`,
/// `--broker-tls-server-name`, and a client certificate for brokers that require one.
#[derive(Debug, Clone, Args)]
pub struct BrokerTlsArgs {
    /// Connect to the brokers over TLS, trusting the CA(s) in this PEM file (the one that
    /// signed their --listen-tls-cert). Needed whenever the brokers listen with TLS.
    #[arg(long, value_name = "FILE")]
    pub broker_tls_ca: Option<PathBuf>,
    /// The name the brokers' certificates must be issued to (default: the host of each
    /// broker address, a DNS name or an IP address). Needs --broker-tls-ca.
    #[arg(long, value_name = "NAME", requires = "broker_tls_ca")]
    pub broker_tls_server_name: Option<String>,
    /// PEM client certificate, for brokers started with --listen-tls-client-ca. Needs
    /// --broker-tls-ca and --broker-tls-key.
    #[arg(long, value_name = "FILE", requires_all = ["broker_tls_key", "broker_tls_ca"])]
    pub broker_tls_cert: Option<PathBuf>,
    /// PEM private key of --broker-tls-cert.
    #[arg(long, value_name = "FILE", requires = "broker_tls_cert")]
    pub broker_tls_key: Option<PathBuf>,
}

impl BrokerArgs {
    /// The broker addresses, trimmed (empty if `--broker` was not given).
    pub fn addrs(&self) -> Vec<String> {
        clean(&self.broker)
    }
}

/// Exactly one of `--nodes` and `--broker`, the quorum flags, the broker flags and
/// `--deadline-ms`: the ID source of `idctl next`/`bench` and `producer`.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("ids").required(true).multiple(false).args(["nodes", "broker"])))]
pub struct SourceArgs {
    /// The quorum flags; `nodes` is set when IDs come straight from the quorum.
    #[command(flatten)]
    pub quorum: QuorumArgs,
    /// The broker flags; `broker` is set when IDs come through brokers.
    #[command(flatten)]
    pub brokers: BrokerArgs,
    /// `--deadline-ms`, for either source.
    #[command(flatten)]
    pub deadline: DeadlineArgs,
}

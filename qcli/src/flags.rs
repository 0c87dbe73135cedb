//! The ID-source flags every binary shares: same names, same units, same help text.

use crate::exit::{usage, EXIT_CODES_HELP};
use clap::{ArgGroup, Args, CommandFactory, FromArgMatches, ValueEnum};
use idclient::broker_client::{self, BrokerClientConfig};
use idclient::{BrokerTls, ClientCert, ClientConfig, Combine, IdError, Protocol, TlsConfig};
use std::path::PathBuf;
use std::time::Duration;

/// Parses the command line into `T`, after `tweak` adjusted the clap command (a binary's
/// own defaults, e.g. `producer`'s 10 s deadline, or old spellings as hidden aliases),
/// and appends the exit-code table to `--help`. Every flag can also come from an
/// environment variable (`QLIST_NODES`, `IDBROKER_LISTEN`, ...: [`mod@crate::env`]), and
/// every binary gets `--log-format text|json` ([`crate::init_logging`]).
///
/// On a usage error clap prints it with the usage line and exits 2; `--help` and
/// `--version` print and exit 0.
pub fn parse<T: CommandFactory + FromArgMatches>(
    tweak: impl FnOnce(clap::Command) -> clap::Command,
) -> T {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut command = crate::env::with_env(
        tweak(with_exit_codes(T::command())).arg(crate::logging::log_format_arg()),
        &argv,
    );
    let parsed = command
        .try_get_matches_from_mut(argv.iter())
        .and_then(|mut matches| {
            if let Some(format) = matches.get_one(crate::logging::LOG_FORMAT_ID) {
                crate::logging::set_format(*format);
            }
            T::from_arg_matches_mut(&mut matches)
        });
    match parsed {
        Ok(t) => t,
        Err(e) => match crate::env::env_error(&mut command, &e, &argv) {
            Some(named) => named.exit(),
            None => e.format(&mut command).exit(),
        },
    }
}

/// `cmd` and each of its subcommands, with the exit-code table after their help.
fn with_exit_codes(cmd: clap::Command) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    names
        .iter()
        .fold(cmd.after_help(EXIT_CODES_HELP), |cmd, name| {
            cmd.mut_subcommand(name, with_exit_codes)
        })
}

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

impl TlsArgs {
    /// The TLS settings these flags describe (files are read when the client connects).
    pub fn config(&self) -> TlsConfig {
        TlsConfig {
            ca_file: self.tls_ca.clone(),
            client_cert: match (&self.tls_cert, &self.tls_key) {
                (Some(cert_file), Some(key_file)) => Some(ClientCert {
                    cert_file: cert_file.clone(),
                    key_file: key_file.clone(),
                }),
                _ => None,
            },
        }
    }
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

impl From<CombineArg> for Combine {
    fn from(c: CombineArg) -> Combine {
        match c {
            CombineArg::Auto => Combine::Auto,
            CombineArg::Always => Combine::Always,
            CombineArg::Never => Combine::Never,
        }
    }
}

/// The quorum flags: everything of [`ClientConfig`] a user sets.
#[derive(Debug, Clone, Args)]
pub struct QuorumArgs {
    #[command(flatten)]
    pub nodes: NodeList,
    /// The register key on every node.
    #[arg(long, default_value = "current")]
    pub key: String,
    #[command(flatten)]
    pub timeouts: NodeTimeouts,
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
    #[arg(long, value_name = "MS", default_value_t = idclient::BACKOFF_CAP.as_millis() as u64)]
    pub backoff_cap_ms: u64,
    /// Accept nodes that do not fsync every write. DANGEROUS: a node crash can then
    /// repeat IDs.
    #[arg(long)]
    pub unsafe_skip_durability_check: bool,
}

impl QuorumArgs {
    /// The client configuration these flags describe, with `deadline` per request.
    ///
    /// # Errors
    /// a usage error ([`crate::usage`]) for no node or a zero timeout.
    pub fn client_config(&self, deadline: Duration) -> anyhow::Result<ClientConfig> {
        let mut config = ClientConfig::new(self.nodes.urls()?);
        config.key = self.key.clone();
        config.protocol = if self.classic {
            Protocol::Classic
        } else {
            Protocol::Fast
        };
        config.deadline = deadline;
        config.connect_timeout = self.timeouts.connect()?;
        config.reply_timeout = self.timeouts.reply()?;
        config.unsafe_skip_durability_check = self.unsafe_skip_durability_check;
        config.backoff_cap = Duration::from_millis(self.backoff_cap_ms);
        config.combine = self.combine.into();
        config.tls = self.tls.config();
        Ok(config)
    }
}

/// `--deadline-ms`: how long one ID request may take, retries included.
#[derive(Debug, Clone, Args)]
pub struct DeadlineArgs {
    /// Give up on one ID request after this many milliseconds, all retries (and broker
    /// failovers) included.
    #[arg(long, value_name = "MS", default_value_t = ClientConfig::new(Vec::new()).deadline.as_millis() as u64)]
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
    #[arg(long, value_name = "N", default_value_t = broker_client::DEFAULT_CONNECTIONS)]
    pub connections: usize,
    /// Requests kept out at once (broker mode): callers arriving while that many are
    /// out go together as one request for their total count (coalescing); 0 sends every
    /// call on its own.
    #[arg(long, value_name = "N", default_value_t = broker_client::DEFAULT_IN_FLIGHT)]
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

impl BrokerTlsArgs {
    /// The TLS settings these flags describe, files read and checked now (`None`: plain
    /// TCP).
    ///
    /// # Errors
    /// a usage error ([`crate::usage`]) naming a file that cannot be read or holds no
    /// usable certificate or key (never a key's content), or a bad server name.
    pub fn tls(&self) -> anyhow::Result<Option<BrokerTls>> {
        let Some(ca) = &self.broker_tls_ca else {
            return Ok(None);
        };
        let client_cert = match (&self.broker_tls_cert, &self.broker_tls_key) {
            (Some(cert_file), Some(key_file)) => Some(ClientCert {
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
            }),
            _ => None,
        };
        BrokerTls::new(ca, self.broker_tls_server_name.clone(), client_cert)
            .map(Some)
            .map_err(|e| match e {
                IdError::Config(m) => usage(format!("broker TLS: {m}")),
                e => usage(format!("broker TLS: {e}")),
            })
    }
}

impl BrokerArgs {
    /// The broker addresses, trimmed (empty if `--broker` was not given).
    pub fn addrs(&self) -> Vec<String> {
        clean(&self.broker)
    }

    /// The broker client's configuration.
    ///
    /// # Errors
    /// a usage error ([`crate::usage`]) for `--connections 0` or an unreadable or empty
    /// `--broker-token-file` (naming the file, never its content).
    pub fn client_config(
        &self,
        deadline: Duration,
        connect_timeout: Duration,
    ) -> anyhow::Result<BrokerClientConfig> {
        if self.connections == 0 {
            return Err(usage("--connections must be at least 1"));
        }
        let token = match &self.broker_token_file {
            Some(path) => Some(
                idclient::Token::from_file(path)
                    .map_err(|e| usage(format!("--broker-token-file: {e}")))?,
            ),
            None => None,
        };
        Ok(BrokerClientConfig {
            deadline,
            connect_timeout,
            connections: self.connections,
            in_flight: self.in_flight,
            token,
            tls: self.tls.tls()?,
            closed_list: self.broker_closed_list,
            ..BrokerClientConfig::default()
        })
    }
}

/// Where IDs come from: straight from the quorum, or through brokers.
#[derive(Debug, Clone)]
pub enum Source {
    /// Direct mode (`--nodes`).
    Nodes(ClientConfig),
    /// Broker mode (`--broker`).
    Brokers {
        addrs: Vec<String>,
        config: BrokerClientConfig,
    },
}

/// Exactly one of `--nodes` and `--broker`, the quorum flags, the broker flags and
/// `--deadline-ms`: the ID source of `idctl next`/`bench` and `producer`.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("ids").required(true).multiple(false).args(["nodes", "broker"])))]
pub struct SourceArgs {
    #[command(flatten)]
    pub quorum: QuorumArgs,
    #[command(flatten)]
    pub brokers: BrokerArgs,
    #[command(flatten)]
    pub deadline: DeadlineArgs,
}

impl SourceArgs {
    /// The ID source these flags describe.
    ///
    /// # Errors
    /// a usage error ([`crate::usage`]) for an empty list, a zero timeout or deadline,
    /// or `--connections 0`.
    pub fn source(&self) -> anyhow::Result<Source> {
        let deadline = self.deadline.deadline()?;
        let addrs = self.brokers.addrs();
        if self.brokers.broker.is_empty() {
            return Ok(Source::Nodes(self.quorum.client_config(deadline)?));
        }
        if addrs.is_empty() {
            return Err(usage("--broker: no broker address given"));
        }
        let config = self
            .brokers
            .client_config(deadline, self.quorum.timeouts.connect()?)?;
        Ok(Source::Brokers { addrs, config })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        source: SourceArgs,
    }

    fn flags(args: &[&str]) -> Result<Flags, clap::Error> {
        Flags::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
    }

    #[test]
    fn nodes_become_a_client_config() {
        let f = flags(&[
            "--nodes",
            "redis://a:1, redis://b:2,,redis://c:3",
            "--key",
            "k",
            "--deadline-ms",
            "1500",
            "--connect-timeout-ms",
            "70",
            "--reply-timeout-ms",
            "80",
            "--classic",
            "--combine",
            "never",
            "--backoff-cap-ms",
            "9",
        ])
        .expect("parses");
        let Source::Nodes(c) = f.source.source().expect("valid") else {
            panic!("direct mode expected")
        };
        assert_eq!(c.nodes, ["redis://a:1", "redis://b:2", "redis://c:3"]);
        assert_eq!(c.key, "k");
        assert_eq!(c.deadline, Duration::from_millis(1500));
        assert_eq!(c.connect_timeout, Duration::from_millis(70));
        assert_eq!(c.reply_timeout, Duration::from_millis(80));
        assert_eq!(c.protocol, Protocol::Classic);
        assert_eq!(c.combine, Combine::Never);
        assert_eq!(c.backoff_cap, Duration::from_millis(9));
        assert!(!c.unsafe_skip_durability_check);
        assert_eq!(c.tls, TlsConfig::default());
    }

    #[test]
    fn tls_flags_become_the_tls_config() {
        let f = flags(&[
            "--nodes",
            "rediss://a:1",
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "me.pem",
            "--tls-key",
            "me.key",
        ])
        .expect("parses");
        let Source::Nodes(c) = f.source.source().expect("valid") else {
            panic!("direct mode expected")
        };
        assert_eq!(
            c.tls,
            TlsConfig {
                ca_file: Some("ca.pem".into()),
                client_cert: Some(ClientCert {
                    cert_file: "me.pem".into(),
                    key_file: "me.key".into(),
                }),
            }
        );
        for half in [&["--tls-cert", "me.pem"], &["--tls-key", "me.key"]] {
            let mut args = vec!["--nodes", "rediss://a:1"];
            args.extend_from_slice(half);
            let e = flags(&args).expect_err("a certificate without its key, or the reverse");
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn broker_tls_flags_are_checked_and_name_the_file() {
        let f = flags(&["--broker", "b:1"]).expect("parses");
        let Source::Brokers { config, .. } = f.source.source().expect("valid") else {
            panic!("broker mode expected")
        };
        assert!(config.tls.is_none(), "plain TCP by default");
        let f = flags(&["--broker", "b:1", "--broker-tls-ca", "/no/such/ca.pem"]).expect("parses");
        let e = f.source.source().expect_err("an unreadable CA file");
        assert!(e.to_string().contains("/no/such/ca.pem"), "{e}");
        for lone in [
            &["--broker-tls-server-name", "b"][..],
            &["--broker-tls-cert", "c.pem", "--broker-tls-key", "c.key"][..],
            &["--broker-tls-ca", "ca.pem", "--broker-tls-cert", "c.pem"][..],
        ] {
            let mut args = vec!["--broker", "b:1"];
            args.extend_from_slice(lone);
            let e = flags(&args).expect_err("a TLS flag without the ones it needs");
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn defaults_are_the_client_defaults() {
        let f = flags(&["--nodes", "redis://a:1"]).expect("parses");
        let Source::Nodes(c) = f.source.source().expect("valid") else {
            panic!("direct mode expected")
        };
        let d = ClientConfig::new(vec!["redis://a:1".into()]);
        assert_eq!(
            (
                &c.key,
                c.protocol,
                c.deadline,
                c.connect_timeout,
                c.reply_timeout,
                c.backoff_cap,
                c.combine,
                c.unsafe_skip_durability_check,
                &c.tls
            ),
            (
                &d.key,
                d.protocol,
                d.deadline,
                d.connect_timeout,
                d.reply_timeout,
                d.backoff_cap,
                d.combine,
                d.unsafe_skip_durability_check,
                &d.tls
            )
        );
    }

    #[test]
    fn the_old_timeout_flag_sets_both_and_conflicts_with_the_new_ones() {
        let f = flags(&["--nodes", "redis://a:1", "--timeout-ms", "300"]).expect("parses");
        let Source::Nodes(c) = f.source.source().expect("valid") else {
            panic!("direct mode expected")
        };
        assert_eq!(c.connect_timeout, Duration::from_millis(300));
        assert_eq!(c.reply_timeout, Duration::from_millis(300));
        let e = flags(&[
            "--nodes",
            "redis://a:1",
            "--timeout-ms",
            "300",
            "--reply-timeout-ms",
            "5",
        ])
        .expect_err("conflict");
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn brokers_become_a_broker_config() {
        let f = flags(&[
            "--broker",
            "h:1,h:2",
            "--connections",
            "3",
            "--deadline-ms",
            "700",
            "--connect-timeout-ms",
            "40",
        ])
        .expect("parses");
        let Source::Brokers { addrs, config } = f.source.source().expect("valid") else {
            panic!("broker mode expected")
        };
        assert_eq!(addrs, ["h:1", "h:2"]);
        assert_eq!(config.connections, 3);
        assert_eq!(config.deadline, Duration::from_millis(700));
        assert_eq!(config.connect_timeout, Duration::from_millis(40));
    }

    #[test]
    fn exactly_one_of_nodes_and_broker() {
        for args in [
            &[][..],
            &["--nodes", "redis://a:1", "--broker", "h:1"][..],
            &["--deadline-ms", "x", "--nodes", "redis://a:1"][..],
        ] {
            let e = flags(args).expect_err("usage error");
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for args in [
            &["--nodes", ","][..],
            &["--broker", " "][..],
            &["--nodes", "redis://a:1", "--deadline-ms", "0"][..],
            &["--nodes", "redis://a:1", "--reply-timeout-ms", "0"][..],
            &["--broker", "h:1", "--connections", "0"][..],
        ] {
            let e = flags(args)
                .expect("parses")
                .source
                .source()
                .expect_err("refused");
            assert_eq!(
                crate::exit::cause_of(&e, |_| None),
                crate::Cause::Usage,
                "{args:?}: {e:#}"
            );
        }
    }
}

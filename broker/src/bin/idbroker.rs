//! idbroker: serves IDs from a Redis quorum to many clients, in group-commit batches
//! confirmed by majority reads from a reserved window (`--serve window`, the default) or
//! one write round per batch (`--serve rounds`). Usage: `idbroker --listen ADDR --nodes URLS`. Prints `listening on ADDR` on
//! stdout once bound and, with `--serve window`, once it leads or knows the leader (so
//! scripts and tests can use port 0 and be served at once), then `resp listening on ADDR`
//! with `--resp-listen` and `metrics listening on ADDR` with `--metrics-listen`; logs go
//! to stderr (RUST_LOG).

use anyhow::Context;
use broker::metrics::{Timed, Timings};
use broker::{
    BrokerConfig, ElectionConfig, LeaderSource, ListenTls, QuorumElection, Stats, WindowQuorum,
    WindowSource, WindowStats,
};
use clap::Parser;
use idclient::{ClientConfig, QuorumClient};
use qcli::{DeadlineArgs, QuorumArgs};
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// The idbroker ID server.
#[derive(Debug, Parser)]
#[command(
    name = "idbroker",
    version = broker::VERSION,
    about = "Serve quorum IDs to many clients with group commit"
)]
struct Flags {
    /// Address to listen on (host:port; port 0 picks a free one).
    #[arg(long)]
    listen: String,
    /// Also serve the RESP protocol (any Redis client: `QLIST.NEXT [count]`) on this
    /// address; off by default. Prints `resp listening on ADDR` once bound.
    #[arg(long, value_name = "ADDR")]
    resp_listen: Option<String>,
    /// The quorum (`--nodes` required).
    #[command(flatten)]
    quorum: QuorumArgs,
    /// The deadline of requests that do not send one.
    #[command(flatten)]
    deadline: DeadlineArgs,
    /// Longest deadline a client may ask for, milliseconds.
    #[arg(long, default_value_t = broker::MAX_DEADLINE.as_millis() as u64)]
    max_deadline_ms: u64,
    /// Drop a client whose replies cannot be written for this long, milliseconds.
    #[arg(long, default_value_t = broker::WRITE_TIMEOUT.as_millis() as u64)]
    write_timeout_ms: u64,
    /// Time allowed from connect to a complete Hello (TLS handshake included), and with
    /// --auth-token-file to a RESP client's AUTH, milliseconds.
    #[arg(long, default_value_t = broker::HANDSHAKE_TIMEOUT.as_millis() as u64)]
    handshake_timeout_ms: u64,
    /// Time allowed for any frame from its first byte (header included) to its last, ms.
    #[arg(long, default_value_t = broker::FRAME_TIMEOUT.as_millis() as u64)]
    frame_timeout_ms: u64,
    /// Close a connection with nothing in flight and no partial frame after this long, ms.
    #[arg(long, default_value_t = broker::IDLE_TIMEOUT.as_millis() as u64)]
    idle_timeout_ms: u64,
    /// Most open client connections. At the cap a new one evicts the longest-idle
    /// connection (see --evict-min-idle-ms), or is refused with a reason if there is none.
    #[arg(long, default_value_t = broker::MAX_CONNECTIONS)]
    max_connections: usize,
    /// At the connection cap, only a connection idle at least this long may be evicted, ms.
    #[arg(long, default_value_t = broker::EVICT_MIN_IDLE.as_millis() as u64)]
    evict_min_idle_ms: u64,
    /// Most unanswered requests per connection before the broker stops reading it.
    #[arg(long, default_value_t = broker::MAX_IN_FLIGHT_PER_CONN)]
    max_in_flight: usize,
    /// Most IDs one request may ask for.
    #[arg(long, default_value_t = broker::DEFAULT_MAX_COUNT)]
    max_count: u64,
    /// How batches get their IDs: `window` confirms each batch with a majority read and
    /// serves it from a window reserved by an earlier write round (no fsync per batch);
    /// `rounds` runs one write round per batch. Both keep every guarantee (DESIGN.md).
    #[arg(long, value_enum, default_value_t = Serve::Window)]
    serve: Serve,
    /// `--serve window`: batches confirmed at once. A batch closes as soon as fewer
    /// are out and starts its own majority read (after it closed, as the guarantee
    /// needs); more lowers latency, fewer makes larger batches (fewer reads per ID).
    /// `--serve rounds` always runs one write round at a time.
    #[arg(long, value_name = "N", default_value_t = broker::DEFAULT_PIPELINE)]
    pipeline: usize,
    /// `--serve window`: a follower stands for election after no change of the leader's
    /// heartbeat for a random time in [T, 2T) of this T; a leader steps down after T
    /// without refreshing a majority, milliseconds.
    #[arg(long, default_value_t = broker::serve::election::ELECTION_TIMEOUT.as_millis() as u64)]
    election_timeout_ms: u64,
    /// `--serve window`: the leader refreshes its heartbeat (and followers read it) this
    /// often, milliseconds.
    #[arg(long, default_value_t = broker::serve::election::HEARTBEAT.as_millis() as u64)]
    heartbeat_ms: u64,
    /// `--serve window`: the address clients reach this broker at, sent to them in
    /// redirects by the other brokers (default: the bound listen address).
    #[arg(long)]
    advertise: Option<String>,
    /// Seconds between two counter log lines.
    #[arg(long, default_value_t = broker::STATS_INTERVAL.as_secs())]
    stats_interval_secs: u64,
    /// Serve Prometheus metrics (/metrics), /healthz and /readyz over HTTP on this
    /// address (host:port; port 0 picks a free one); see docs/operations.md. Off by default.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Require clients to present the secret in this file (its content, trimmed): in the
    /// binary Hello (`--broker-token-file` of idctl and producer) and with `AUTH` on
    /// RESP. Keep the file readable by this user only. Off by default.
    #[arg(long, value_name = "FILE")]
    auth_token_file: Option<std::path::PathBuf>,
    /// Serve both listeners (--listen and --resp-listen) over TLS with this certificate
    /// (PEM, leaf first, then intermediates); needs --listen-tls-key. Clients then need
    /// the CA that signed it (--broker-tls-ca of idctl and producer). Off by default.
    #[arg(long, value_name = "FILE", requires = "listen_tls_key")]
    listen_tls_cert: Option<std::path::PathBuf>,
    /// The private key of --listen-tls-cert (PEM). Keep it readable by this user only.
    #[arg(long, value_name = "FILE", requires = "listen_tls_cert")]
    listen_tls_key: Option<std::path::PathBuf>,
    /// With TLS: require every client to present a certificate signed by a CA in this
    /// PEM file (--broker-tls-cert/--broker-tls-key of idctl and producer).
    #[arg(long, value_name = "FILE", requires = "listen_tls_cert")]
    listen_tls_client_ca: Option<std::path::PathBuf>,
    /// With TLS and --resp-listen: the CA (PEM) that signed the OTHER brokers'
    /// --listen-tls-cert. A follower forwards RESP requests to the leader over TLS,
    /// trusting it, and presents its own --listen-tls-cert (for leaders with
    /// --listen-tls-client-ca). Without it a TLS follower cannot forward.
    #[arg(long, value_name = "FILE", requires = "listen_tls_cert")]
    peer_tls_ca: Option<std::path::PathBuf>,
}

/// How the broker serves batches (`--serve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Serve {
    /// From a confirmed window (DESIGN.md, "Serving from a confirmed window").
    Window,
    /// One quorum write round per batch.
    Rounds,
}

struct Config {
    listen: String,
    resp_listen: Option<String>,
    metrics_listen: Option<String>,
    serve: Serve,
    /// The election's timing; its address is `advertise`, or the bound address.
    election: ElectionConfig,
    advertise: Option<String>,
    quorum: ClientConfig,
    broker: BrokerConfig,
}

impl Config {
    /// The configuration the flags describe.
    ///
    /// # Errors
    /// A usage error (exit code 2) for flags that make no sense.
    fn from_flags(f: Flags) -> anyhow::Result<Config> {
        let default_deadline = f.deadline.deadline()?;
        let quorum = idflags::quorum_config(&f.quorum, default_deadline)?;
        let broker = BrokerConfig {
            default_deadline,
            max_deadline: Duration::from_millis(f.max_deadline_ms),
            write_timeout: Duration::from_millis(f.write_timeout_ms),
            handshake_timeout: Duration::from_millis(f.handshake_timeout_ms),
            frame_timeout: Duration::from_millis(f.frame_timeout_ms),
            idle_timeout: Duration::from_millis(f.idle_timeout_ms),
            evict_min_idle: Duration::from_millis(f.evict_min_idle_ms),
            max_connections: f.max_connections,
            max_in_flight_per_conn: f.max_in_flight,
            max_count: f.max_count,
            pipeline: match f.serve {
                Serve::Window => f.pipeline,
                Serve::Rounds => 1,
            },
            stats_interval: Duration::from_secs(f.stats_interval_secs),
            auth_token: f.auth_token_file.as_deref().map(read_token).transpose()?,
            tls: listen_tls(&f)?,
            peer_tls: peer_tls(&f)?,
            ..BrokerConfig::default()
        };
        broker.validate().map_err(|e| qcli::usage(e.to_string()))?;
        let election = ElectionConfig {
            election_timeout: Duration::from_millis(f.election_timeout_ms),
            heartbeat: Duration::from_millis(f.heartbeat_ms),
            ..ElectionConfig::new(f.advertise.clone().unwrap_or_else(|| f.listen.clone()))
        };
        election.validate().map_err(qcli::usage)?;
        Ok(Config {
            listen: f.listen,
            resp_listen: f.resp_listen,
            metrics_listen: f.metrics_listen,
            serve: f.serve,
            election,
            advertise: f.advertise,
            quorum,
            broker,
        })
    }
}

/// The token in `path` (`--auth-token-file`); warns, as ssh does, when others may read it.
///
/// # Errors
/// A usage error naming the file (never its content) if it is unreadable or empty.
fn read_token(path: &std::path::Path) -> anyhow::Result<idproto::auth::Token> {
    let token = idproto::auth::Token::from_file(path)
        .map_err(|e| qcli::usage(format!("--auth-token-file: {e}")))?;
    if idproto::auth::Token::file_is_shared(path) {
        tracing::warn!(file = %path.display(), "--auth-token-file is readable by group or others: chmod 600 it");
    }
    Ok(token)
}

/// The listeners' TLS (`--listen-tls-cert`, `--listen-tls-key`, `--listen-tls-client-ca`;
/// clap makes sure the first two come together).
///
/// # Errors
/// A usage error naming the file that cannot be read or holds no usable certificate or
/// key (never the key's content).
fn listen_tls(f: &Flags) -> anyhow::Result<Option<ListenTls>> {
    let (Some(cert), Some(key)) = (&f.listen_tls_cert, &f.listen_tls_key) else {
        return Ok(None);
    };
    let tls = ListenTls::load(cert, key, f.listen_tls_client_ca.as_deref())
        .map_err(|e| qcli::usage(format!("--listen-tls-cert/--listen-tls-key: {e}")))?;
    if idproto::auth::Token::file_is_shared(key) {
        tracing::warn!(file = %key.display(), "--listen-tls-key is readable by group or others: chmod 600 it");
    }
    Ok(Some(tls))
}

/// How a follower reaches a TLS leader to forward RESP requests (`--peer-tls-ca`): its
/// CA, and this broker's own listener certificate as client certificate. Warns when
/// brokers listen with TLS and serve RESP but cannot forward.
///
/// # Errors
/// A usage error naming the CA file that cannot be read or holds no usable certificate.
fn peer_tls(f: &Flags) -> anyhow::Result<Option<idclient::BrokerTls>> {
    let (Some(ca), Some(cert), Some(key)) = (&f.peer_tls_ca, &f.listen_tls_cert, &f.listen_tls_key)
    else {
        if f.listen_tls_cert.is_some() && f.resp_listen.is_some() && f.serve == Serve::Window {
            tracing::warn!(
                "TLS listeners without --peer-tls-ca: as a follower this broker cannot \
                 forward RESP requests to the leader (they fail; binary clients are redirected)"
            );
        }
        return Ok(None);
    };
    let own = idclient::ClientCert {
        cert_file: cert.clone(),
        key_file: key.clone(),
    };
    idclient::BrokerTls::new(ca, None, Some(own))
        .map(Some)
        .map_err(|e| qcli::usage(format!("--peer-tls-ca: {e}")))
}

/// Warns when `addr` (a listener named by `flag`) is reachable from other hosts while
/// no token is required, or while the token is sent in clear text (no TLS).
fn warn_if_open(flag: &str, addr: std::net::SocketAddr, config: &BrokerConfig) {
    if addr.ip().is_loopback() {
        return;
    }
    if config.auth_token.is_none() {
        tracing::warn!(%addr, "{flag} is not a loopback address and no --auth-token-file is set: anyone who can reach it can take IDs");
    } else if config.tls.is_none() {
        tracing::warn!(%addr, "{flag} is not a loopback address and has no TLS (--listen-tls-cert): the --auth-token-file token travels in clear text");
    }
}

fn main() -> ExitCode {
    qcli::init_logging("info");
    // clap keeps defaults as &'static str; leaking this one short string once is the
    // price of deriving it from broker::DEFAULT_DEADLINE rather than repeating it.
    let default_deadline: &'static str =
        Box::leak(DEFAULT_DEADLINE_MS.to_string().into_boxed_str());
    let flags: Flags = qcli::parse(|cmd| {
        // Before the flags were shared: idbroker's own names, same units.
        cmd.mut_arg("nodes", |a| a.required(true))
            .mut_arg("deadline_ms", |a| {
                a.alias("default-deadline-ms")
                    .help("Deadline of requests that do not send one, milliseconds (a client may ask for up to --max-deadline-ms)")
                    .default_value(default_deadline)
            })
            .mut_arg("connect_timeout_ms", |a| a.alias("node-connect-timeout-ms"))
            .mut_arg("reply_timeout_ms", |a| a.alias("node-reply-timeout-ms"))
    });
    qcli::exit("idbroker", start(flags), |_| None)
}

/// [`broker::DEFAULT_DEADLINE`], the `--deadline-ms` default.
const DEFAULT_DEADLINE_MS: u64 = broker::DEFAULT_DEADLINE.as_millis() as u64;

fn start(flags: Flags) -> anyhow::Result<()> {
    let config = Config::from_flags(flags)?;
    tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")?
        .block_on(run(config))
}

/// The broker's sockets, bound before anything else so a taken port fails at once.
struct Sockets {
    listener: tokio::net::TcpListener,
    addr: std::net::SocketAddr,
    resp: Option<tokio::net::TcpListener>,
    /// Taken by the metrics endpoint.
    metrics: Option<tokio::net::TcpListener>,
}

impl Sockets {
    async fn bind(config: &Config) -> anyhow::Result<Sockets> {
        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("--listen {}: cannot bind", config.listen))?;
        let addr = listener.local_addr().context("listener address")?;
        warn_if_open("--listen", addr, &config.broker);
        let resp = match &config.resp_listen {
            Some(a) => Some(
                tokio::net::TcpListener::bind(a)
                    .await
                    .with_context(|| format!("--resp-listen {a}: cannot bind"))?,
            ),
            None => None,
        };
        let metrics = match &config.metrics_listen {
            Some(a) => Some(qmetrics::bind(a).await?),
            None => None,
        };
        Ok(Sockets {
            listener,
            addr,
            resp,
            metrics,
        })
    }
}

/// Prints the lines tests and scripts wait for: the broker serves from now on.
fn say_listening(lines: &[String]) -> anyhow::Result<()> {
    let mut out = std::io::stdout();
    for line in lines {
        writeln!(out, "{line}").context("stdout")?;
    }
    out.flush().context("stdout")
}

async fn run(config: Config) -> anyhow::Result<()> {
    if config.quorum.unsafe_skip_durability_check {
        tracing::warn!("--unsafe-skip-durability-check: nodes that lose acknowledged writes can make this broker REPEAT IDs");
    }
    let mut sockets = Sockets::bind(&config).await?;
    let election = match config.serve {
        // With a token, heartbeats are signed and only signed ones trusted.
        Serve::Window => Some(
            QuorumElection::connect(&config.quorum)
                .await
                .context("connecting to the quorum (election)")?
                .with_token(config.broker.auth_token.as_ref()),
        ),
        Serve::Rounds => None,
    };
    let quorum = Arc::new(
        QuorumClient::connect(config.quorum)
            .await
            .context("connecting to the quorum")?,
    );
    let mut lines = vec![format!("listening on {}", sockets.addr)];
    if let Some(resp) = &sockets.resp {
        let a = resp.local_addr().context("RESP listener address")?;
        warn_if_open("--resp-listen", a, &config.broker);
        lines.push(format!("resp listening on {a}"));
    }
    let (stats, timings) = (Arc::new(Stats::default()), Arc::new(Timings::default()));
    let metrics = match sockets.metrics.take() {
        Some(l) => {
            let a = l.local_addr().context("metrics listener address")?;
            lines.push(format!("metrics listening on {a}"));
            let (s, t, q) = (stats.clone(), timings.clone(), quorum.clone());
            Some(tokio::spawn(broker::metrics::serve(l, s, t, q)))
        }
        None => None,
    };
    let timed = Arc::new(Timed::new(quorum, timings));
    let served = match (config.serve, election) {
        (Serve::Window, Some(election)) => {
            let window = Window {
                election,
                config: config.election,
                advertise: config.advertise,
            };
            window
                .serve(sockets, stats, timed, config.broker, &lines)
                .await
        }
        (Serve::Window, None) => Err(anyhow::anyhow!("election quorum")),
        (Serve::Rounds, _) => {
            say_listening(&lines)?;
            let shutdown = shutdown_signal();
            let (listener, resp) = (sockets.listener, sockets.resp);
            broker::run_with(listener, resp, stats, timed, config.broker, shutdown)
                .await
                .map_err(anyhow::Error::from)
        }
    };
    if let Some(m) = metrics {
        m.abort();
    }
    let stats = served?;
    tracing::info!(
        rounds = stats.rounds,
        requests = stats.requests,
        "broker stopped"
    );
    Ok(())
}

/// What serving from windows needs beyond the rounds mode: the election.
struct Window {
    election: QuorumElection,
    config: ElectionConfig,
    advertise: Option<String>,
}

impl Window {
    /// Serves from windows while elected, redirects or forwards otherwise; on
    /// SIGTERM/SIGINT hands the lead over first, so the followers stand at once.
    async fn serve(
        mut self,
        sockets: Sockets,
        stats: Arc<Stats>,
        timed: Arc<Timed<QuorumClient>>,
        broker_config: BrokerConfig,
        lines: &[String],
    ) -> anyhow::Result<broker::BrokerStats> {
        let Sockets {
            listener,
            addr,
            resp,
            ..
        } = sockets;
        let window = Arc::new(WindowSource::new(timed));
        self.config.advertise = self.advertise.unwrap_or_else(|| {
            if addr.ip().is_unspecified() {
                tracing::warn!(%addr, "listening on a wildcard address without --advertise: followers will redirect clients to {addr}, which they cannot reach");
            }
            addr.to_string()
        });
        let limit = self.config.election_timeout * 4;
        let source = LeaderSource::start(window.clone(), Arc::new(self.election), self.config)
            .map_err(|e| anyhow::anyhow!("election: {e}"))?;
        // Clients that connect as soon as we say so find a leader (or are one).
        if !source.election().wait_settled(limit).await {
            tracing::warn!(?limit, "no leader known yet; serving redirects meanwhile");
        }
        say_listening(lines)?;
        let every = broker_config.stats_interval;
        let logger = tokio::spawn(log_window_stats(window.clone(), every));
        let source = Arc::new(source);
        let shutdown = {
            let source = source.clone();
            async move {
                shutdown_signal().await;
                source.resign().await;
            }
        };
        let served = broker::run_with(listener, resp, stats, source, broker_config, shutdown).await;
        logger.abort();
        log_window(&window.stats(), "window serving stopped");
        Ok(served?)
    }
}

/// Logs the window counters every `every` (never, for zero).
async fn log_window_stats<Q: WindowQuorum>(source: Arc<WindowSource<Q>>, every: Duration) {
    if every.is_zero() {
        return;
    }
    loop {
        tokio::time::sleep(every).await;
        log_window(&source.stats(), "window serving");
    }
}

fn log_window(s: &WindowStats, what: &str) {
    tracing::info!(
        confirmations = s.confirmations,
        confirmations_failed = s.confirmations_failed,
        reservations = s.reservations,
        reservations_lost = s.reservations_lost,
        fresh_windows = s.fresh_windows,
        holes = s.holes,
        window_size = s.window_size,
        "{what}"
    );
}

/// Completes on SIGINT or SIGTERM. If the handlers cannot be installed, logs it and
/// waits for ctrl-c only.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot install SIGTERM handler: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        _ = term.recv() => tracing::info!("SIGTERM received"),
    }
}

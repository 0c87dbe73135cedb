//! idctl: start a local quorum, check nodes, get IDs, benchmark, chart benchmarks.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use idclient::{IdSource, QuorumClient};
use idproto::wire::BrokerStats;
use idtools::bench::{self, BenchConfig};
use idtools::chart;
use idtools::cluster::{self, ClusterError, LocalQuorum};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "idctl",
    version,
    about = "Globally ordered IDs from a majority of Redis nodes: run a local quorum, check nodes, get IDs, benchmark."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start or stop a local redis-server quorum configured for durability.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Check every node's durability configuration; exits non-zero if any node is unsafe
    /// or unreachable.
    Check {
        #[command(flatten)]
        nodes: qcli::NodeList,
        #[command(flatten)]
        timeouts: qcli::NodeTimeouts,
        #[command(flatten)]
        tls: qcli::TlsArgs,
    },
    /// Reserve IDs and print "LO HI" (HI = LO + COUNT - 1).
    Next {
        #[command(flatten)]
        source: qcli::SourceArgs,
        /// How many consecutive IDs to reserve in one round.
        #[arg(long, default_value_t = 1)]
        count: u64,
    },
    /// Run concurrent clients for a while and report throughput and latency. The last line
    /// is one JSON object: ids_per_sec, requests_per_sec, p50_us, p99_us, holes_pct, errors.
    Bench {
        #[command(flatten)]
        source: qcli::SourceArgs,
        /// Concurrent clients. Direct mode: each its own client (own connections), like
        /// separate processes. Broker mode: concurrent callers of one broker client.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// How long to run.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// IDs per request.
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Record every request (invoke/return time, range) to this file, for the history checker.
        #[arg(long)]
        history: Option<PathBuf>,
    },
    /// Draw benchmark runs as an SVG chart of IDs/s against concurrent callers, one line
    /// per series (scripts/bench-ids.sh writes the runs and calls this).
    Chart {
        /// The runs, one JSON object per line: series, callers, count, ids_per_sec.
        #[arg(long = "in", value_name = "FILE")]
        input: PathBuf,
        /// The SVG file to write.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Chart the runs with this many IDs per request.
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// The chart's title.
        #[arg(long, default_value = "IDs per second by concurrent callers")]
        title: String,
    },
    /// Print an idbroker's counters (role, term, rounds, batch sizes, round latency,
    /// window counters, errors).
    BrokerStats {
        /// The broker's host:port.
        addr: String,
        /// File holding the broker's shared secret (its `--auth-token-file`).
        #[arg(long, value_name = "FILE")]
        broker_token_file: Option<std::path::PathBuf>,
        /// The broker's TLS, if it listens with TLS.
        #[command(flatten)]
        tls: qcli::BrokerTlsArgs,
    },
    /// Measure leader failover under load: start --brokers idbroker processes, run
    /// --clients callers over all of them, kill -9 the leader --kills times (restarting
    /// it each time) and report the time from each kill to the first ID of a request made
    /// after it. Checks the whole history. The last line is one JSON object:
    /// failover_p50_ms, failover_max_ms, failovers_ms, failed_failovers, requests, errors.
    Failover {
        /// The quorum; without it a throwaway 5-node local quorum is started.
        #[arg(long, value_name = "URLS", value_delimiter = ',')]
        nodes: Vec<String>,
        /// idbroker processes (at least 2).
        #[arg(long, default_value_t = 3)]
        brokers: usize,
        /// Leaders killed, one after another.
        #[arg(long, default_value_t = 20)]
        kills: usize,
        /// Concurrent callers of one broker client.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// Deadline of each request, milliseconds: a request still waiting then fails
        /// (and counts in errors).
        #[arg(long, value_name = "MS", default_value_t = 5000)]
        deadline_ms: u64,
        /// Longest wait for a single leader before each kill, milliseconds.
        #[arg(long, value_name = "MS", default_value_t = 10_000)]
        settle_ms: u64,
        /// The idbroker binary (default: the one next to idctl).
        #[arg(long)]
        idbroker: Option<PathBuf>,
        /// An extra idbroker argument, repeatable (e.g. --broker-arg=--election-timeout-ms=300).
        #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
        broker_arg: Vec<String>,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Start N redis-server processes on 127.0.0.1 (appendonly yes, appendfsync always,
    /// noeviction), each with its data under DIR; their pids go to DIR/cluster.json.
    Up {
        #[arg(long)]
        dir: PathBuf,
        /// Number of nodes (odd, >= 3).
        #[arg(long, default_value_t = 5)]
        nodes: usize,
        /// Port of the first node; the others follow.
        #[arg(long, default_value_t = 7001)]
        base_port: u16,
    },
    /// Stop exactly the processes `cluster up --dir DIR` started (by pid). Data is kept.
    Down {
        #[arg(long)]
        dir: PathBuf,
    },
}

/// `idctl check` gives slow nodes more time than a request does: it reports, it does not serve.
const CHECK_TIMEOUT_MS: &str = "1000";

fn main() -> ExitCode {
    qcli::init_logging("warn");
    let cli: Cli = qcli::parse(|cmd| {
        cmd.mut_subcommand("check", |check| {
            check
                .mut_arg("nodes", |a| a.required(true))
                .mut_arg("connect_timeout_ms", |a| a.default_value(CHECK_TIMEOUT_MS))
                .mut_arg("reply_timeout_ms", |a| a.default_value(CHECK_TIMEOUT_MS))
        })
    });
    qcli::exit("idctl", run(cli), |e| {
        // qcli's table: a bad node count or base port is a usage error (exit 2); the
        // other cluster errors (redis-server missing, a port taken, ...) are exit 1.
        match e.downcast_ref::<ClusterError>()? {
            ClusterError::BadNodeCount(_) | ClusterError::BadPorts { .. } => {
                Some(qcli::Cause::Usage)
            }
            _ => None,
        }
    })
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Cluster(ClusterCmd::Up {
            dir,
            nodes,
            base_port,
        }) => cluster_up(&dir, nodes, base_port),
        Command::Cluster(ClusterCmd::Down { dir }) => cluster_down(&dir),
        Command::Check {
            nodes,
            timeouts,
            tls,
        } => runtime()?.block_on(check(
            nodes.urls()?,
            timeouts.connect()?,
            timeouts.reply()?,
            idflags::tls_config(&tls),
        )),
        Command::Chart {
            input,
            out,
            count,
            title,
        } => chart(&input, &out, count, &title),
        Command::BrokerStats {
            addr,
            broker_token_file,
            tls,
        } => {
            let token = broker_token(broker_token_file)?;
            let tls = idflags::broker_tls(&tls)?;
            runtime()?.block_on(broker_stats(addr, token, tls))
        }
        Command::Failover {
            nodes,
            brokers,
            kills,
            clients,
            deadline_ms,
            settle_ms,
            idbroker,
            broker_arg,
        } => failover(idtools::failover::FailoverConfig {
            idbroker: idbroker_path(idbroker)?,
            nodes,
            brokers,
            kills,
            callers: clients,
            deadline: Duration::from_millis(deadline_ms),
            settle_timeout: Duration::from_millis(settle_ms),
            broker_args: broker_arg,
        }),
        Command::Next { source, count } => {
            let source = idflags::source(&source)?;
            runtime()?.block_on(next(source, count))
        }
        Command::Bench {
            source,
            clients,
            seconds,
            count,
            history,
        } => {
            let config = bench_config(clients, seconds, count)?;
            bench_ids(idflags::source(&source)?, &config, history)
        }
    }
}

/// `idctl cluster down`: stops the quorum `cluster up --dir DIR` started.
fn cluster_down(dir: &Path) -> Result<()> {
    let stopped = cluster::down(dir)?;
    eprintln!("stopped {stopped} node(s) of {}", dir.display());
    Ok(())
}

/// The broker's token, from `--broker-token-file` if given.
fn broker_token(file: Option<PathBuf>) -> Result<Option<idclient::Token>> {
    file.map(|path| {
        idclient::Token::from_file(&path)
            .map_err(|e| qcli::usage(format!("--broker-token-file: {e}")))
    })
    .transpose()
}

/// `idctl bench`'s flags checked: at least one client, a positive duration.
fn bench_config(clients: usize, seconds: f64, count: u64) -> Result<BenchConfig> {
    if clients == 0 {
        return Err(qcli::usage("--clients must be at least 1"));
    }
    if !(seconds > 0.0 && seconds.is_finite()) {
        return Err(qcli::usage(format!(
            "--seconds must be a positive number, got {seconds}"
        )));
    }
    Ok(BenchConfig {
        clients,
        duration: Duration::from_secs_f64(seconds),
        count,
        progress: true,
    })
}

/// `idctl cluster up`: starts the quorum and leaves it running (detached).
fn cluster_up(dir: &Path, nodes: usize, base_port: u16) -> Result<()> {
    let quorum = LocalQuorum::start(dir, nodes, base_port)?;
    let urls = quorum.urls_arg();
    let records = quorum.detach();
    for r in &records {
        eprintln!(
            "started redis-server pid {} on {} (data {})",
            r.pid,
            r.url,
            r.data_dir.display()
        );
    }
    eprintln!(
        "quorum of {} nodes up; stop it with: idctl cluster down --dir {}",
        records.len(),
        dir.display()
    );
    println!("{urls}");
    Ok(())
}

/// Where `--idbroker` points, or the idbroker beside idctl.
fn idbroker_path(given: Option<PathBuf>) -> Result<PathBuf> {
    match given {
        Some(p) => Ok(p),
        None => Ok(std::env::current_exe()
            .context("cannot find idctl's own path (give --idbroker)")?
            .with_file_name("idbroker")),
    }
}

/// `idctl failover`: kills leaders under load and reports how long each failover took.
/// Without `--nodes`, on a throwaway 5-node quorum.
fn failover(mut config: idtools::failover::FailoverConfig) -> Result<()> {
    // Kept alive for the run: a throwaway quorum stops when it drops.
    let local = if config.nodes.is_empty() {
        Some(LocalQuorum::temp(5)?)
    } else {
        None
    };
    if let Some(q) = &local {
        config.nodes = q.urls();
    }
    let kills = config.kills;
    let report =
        runtime()?.block_on(idtools::failover::run(&config, |line| eprintln!("{line}")))?;
    eprintln!(
        "{} kills: failover p50 {:?}, max {:?}; {} failovers without an ID; {} requests, {} failed{}",
        kills,
        report.quantile(0.5),
        report.quantile(1.0),
        report.failed_failovers,
        report.events.len(),
        report.errors,
        report
            .first_error
            .as_ref()
            .map_or(String::new(), |e| format!(" (first: {e})"))
    );
    println!("{}", report.json());
    report
        .check()
        .map_err(|v| anyhow::anyhow!("history check failed: {v}"))
}

/// `idctl bench`: `config.clients` callers for a fixed time, direct clients (one each)
/// or one shared broker client; the history to `history` if given.
fn bench_ids(
    source: idflags::IdsFrom,
    config: &BenchConfig,
    history: Option<PathBuf>,
) -> Result<()> {
    let clients = config.clients;
    let (report, counters) = runtime()?.block_on(async {
        match source {
            idflags::IdsFrom::Nodes(client_config) => {
                let mut sources = Vec::with_capacity(clients);
                for _ in 0..clients {
                    sources.push(std::sync::Arc::new(
                        QuorumClient::connect(client_config.clone()).await?,
                    ));
                }
                let report = bench::run(config, &sources).await;
                Ok::<_, anyhow::Error>((report, Some(sum_counters(&sources))))
            }
            idflags::IdsFrom::Brokers {
                addrs,
                config: broker_config,
            } => {
                let shared = std::sync::Arc::new(broker_client(addrs, broker_config).await?);
                let sources = vec![shared; clients];
                Ok((bench::run(config, &sources).await, None))
            }
        }
    })?;
    if let Some(path) = history {
        let file = std::fs::File::create(&path)
            .with_context(|| format!("cannot create history file {}", path.display()))?;
        idtools::history::write_events(std::io::BufWriter::new(file), &report.events)
            .with_context(|| format!("cannot write history file {}", path.display()))?;
    }
    let mut json: serde_json::Value =
        serde_json::from_str(&report.json()).context("the bench summary is not JSON")?;
    if let Some(c) = counters {
        eprintln!(
            "direct clients in all: {} requests, {} write rounds ({} retries), {} node rejects, {} IDs burned by lost rounds; {} batches led, {} requests served by another client's batch",
            c.requests, c.rounds, c.retries, c.rejects, c.burned, c.batches, c.combined
        );
        eprintln!(
            "rendezvous: {} calls too slow ({} while it published), {} failed, {} waits without progress, {} left for it; {} moves to the fallback, {} to own rounds; {} requests on own rounds while contended",
            c.rendezvous_slow, c.rendezvous_slow_alive, c.rendezvous_errors, c.rendezvous_stalls, c.rendezvous_left, c.to_fallback, c.to_own_rounds, c.uncombined
        );
        json["counters"] = serde_json::to_value(c).context("counters as JSON")?;
    }
    eprintln!("{}", report.summary_line());
    println!("{json}");
    Ok(())
}

/// `idctl chart`: the runs in `input` as an SVG chart in `out`.
fn chart(input: &Path, out: &Path, count: u64, title: &str) -> Result<()> {
    let bad_input = |e: &dyn std::fmt::Display| {
        qcli::fail(qcli::Cause::Input, format!("{}: {e}", input.display()))
    };
    let file = std::fs::File::open(input).map_err(|e| bad_input(&e))?;
    let runs = chart::read_results(std::io::BufReader::new(file)).map_err(|e| bad_input(&e))?;
    let doc = chart::svg(&runs, count, title).map_err(|e| bad_input(&e))?;
    std::fs::write(out, doc).map_err(|e| {
        qcli::fail(
            qcli::Cause::Output,
            format!("cannot write {}: {e}", out.display()),
        )
    })?;
    eprintln!("wrote {} ({} runs)", out.display(), runs.len());
    Ok(())
}

/// The direct clients' counters, added up.
fn sum_counters(clients: &[std::sync::Arc<QuorumClient>]) -> idclient::Counters {
    let mut sum = idclient::Counters::default();
    for c in clients {
        sum += c.counters();
    }
    sum
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

/// `idctl next`: one request, printed as "LO HI".
async fn next(source: idflags::IdsFrom, count: u64) -> Result<()> {
    let range = match source {
        idflags::IdsFrom::Nodes(config) => {
            QuorumClient::connect(config).await?.next_ids(count).await?
        }
        idflags::IdsFrom::Brokers { addrs, config } => {
            broker_client(addrs, config).await?.next_ids(count).await?
        }
    };
    println!("{} {}", range.lo, range.hi);
    Ok(())
}

/// `idctl check`: every node's verdict on stdout; an unusable node is exit code 5.
async fn check(
    nodes: Vec<String>,
    connect_timeout: Duration,
    reply_timeout: Duration,
    tls: idclient::TlsConfig,
) -> Result<()> {
    let results = idclient::check_nodes(&nodes, connect_timeout, reply_timeout, &tls).await?;
    let mut bad = 0;
    for idclient::NodeCheck { addr, verdict } in &results {
        match verdict {
            Ok(warnings) => {
                println!("{addr}: ok (master, appendonly yes, appendfsync always, no-appendfsync-on-rewrite no, noeviction)");
                for warning in warnings {
                    println!("{addr}: {warning}");
                }
            }
            Err(reason) => {
                bad += 1;
                println!("{addr}: {reason}");
            }
        }
    }
    if bad > 0 {
        return Err(qcli::fail(
            qcli::Cause::Ids,
            format!("{bad} of {} node(s) unusable", results.len()),
        ));
    }
    Ok(())
}

/// The broker client for `--broker`: one client (a few pipelined connections) shared by
/// every caller, failing over along the list of brokers.
async fn broker_client(
    addrs: Vec<String>,
    config: idclient::broker_client::BrokerClientConfig,
) -> Result<idclient::broker_client::BrokerClient> {
    idclient::broker_client::BrokerClient::connect(addrs.clone(), config)
        .await
        .with_context(|| format!("--broker {}", addrs.join(",")))
}

/// `idctl broker-stats ADDR`: the broker's counters, human-readable, then one JSON line.
async fn broker_stats(
    addr: String,
    token: Option<idclient::Token>,
    tls: Option<idclient::BrokerTls>,
) -> Result<()> {
    let s = idclient::broker_client::fetch_stats_with(&addr, token.as_ref(), tls.as_ref())
        .await
        .with_context(|| format!("broker {addr}"))?;
    print_broker_stats(&s);
    println!("{}", broker_stats_json(&s));
    Ok(())
}

/// A broker's counters, human-readable: role, connections, requests, rounds and their
/// latency, batch sizes, and (unless it serves one round per batch) its windows.
fn print_broker_stats(s: &BrokerStats) {
    println!(
        "role {}  term {}  leader {}  redirects {}  forwarded {}",
        s.role,
        s.term,
        s.leader.as_deref().unwrap_or("-"),
        s.redirects,
        s.forwarded
    );
    println!(
        "uptime_ms {}  connections {} open / {} total / {} dropped",
        s.uptime_ms, s.connections_open, s.connections_total, s.connections_dropped
    );
    println!(
        "requests {} (ok {}, failed {})  ids {}",
        s.requests, s.requests_ok, s.requests_failed, s.ids
    );
    println!(
        "rounds {} (failed {})  mean batch {:.1}  max batch {}",
        s.rounds,
        s.rounds_failed,
        s.mean_batch(),
        s.batch_max
    );
    println!(
        "round latency mean {:.0} us  max {} us",
        s.mean_round_us(),
        s.round_us_max
    );
    let buckets: Vec<String> = s
        .batch_histogram
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(i, n)| format!("{}..{}: {n}", 1u64 << i, (1u64 << (i + 1)) - 1))
        .collect();
    println!("batch sizes (rounds per bucket) {}", buckets.join(", "));
    if s.role != "rounds" {
        println!(
            "window size {}  confirmations {} (failed {})  reservations {} (lost {})  holes {}",
            s.window_size,
            s.confirmations,
            s.confirmations_failed,
            s.reservations,
            s.reservations_lost,
            s.holes
        );
    }
}

/// A broker's counters as `idctl broker-stats`'s last line: one JSON object, every field
/// of [`BrokerStats`] as it serializes, plus the figures derived from them (`mean_batch`,
/// `mean_round_us`) and the two maxima under their historical names (`max_batch`,
/// `max_round_us`).
fn broker_stats_json(s: &BrokerStats) -> serde_json::Value {
    let mut v = serde_json::to_value(s).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "mean_batch".into(),
            ((s.mean_batch() * 100.0).round() / 100.0).into(),
        );
        o.insert("max_batch".into(), s.batch_max.into());
        o.insert("mean_round_us".into(), s.mean_round_us().round().into());
        o.insert("max_round_us".into(), s.round_us_max.into());
    }
    v
}

//! idctl: start a local quorum, check nodes, get IDs, benchmark.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use idclient::{ClientConfig, Combine, IdSource, Protocol, QuorumClient};
use idtools::bench::{self, BenchConfig};
use idtools::cluster::{self, LocalQuorum};
use std::path::PathBuf;
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
        /// Comma-separated redis://host:port URLs.
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<String>,
        /// Connect and reply timeout per node, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        timeout_ms: u64,
    },
    /// Reserve IDs and print "LO HI" (HI = LO + COUNT - 1).
    Next {
        #[command(flatten)]
        source: SourceArgs,
        /// How many consecutive IDs to reserve in one round.
        #[arg(long, default_value_t = 1)]
        count: u64,
    },
    /// Run concurrent clients for a while and report throughput and latency. The last line
    /// is one JSON object: ids_per_sec, requests_per_sec, p50_us, p99_us, holes_pct, errors.
    Bench {
        #[command(flatten)]
        source: SourceArgs,
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
    /// Print an idbroker's counters (rounds, batch sizes, round latency, errors).
    BrokerStats {
        /// The broker's host:port.
        addr: String,
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

#[derive(Args)]
#[group(required = true, multiple = false, id = "where")]
struct Where {
    /// Comma-separated redis://host:port URLs of the quorum (direct mode).
    #[arg(long, value_delimiter = ',')]
    nodes: Vec<String>,
    /// Comma-separated host:port addresses of idbrokers (broker mode, with failover).
    #[arg(long, value_delimiter = ',')]
    broker: Vec<String>,
}

#[derive(Args)]
struct SourceArgs {
    #[command(flatten)]
    r#where: Where,
    /// Use the classic protocol (read a majority, then write max+1) instead of the fast one.
    #[arg(long)]
    classic: bool,
    /// Give up on a request after this many milliseconds (all retries included).
    #[arg(long, default_value_t = 5000)]
    deadline_ms: u64,
    /// Connect and reply timeout per node, in milliseconds.
    #[arg(long, default_value_t = 500)]
    timeout_ms: u64,
    /// The register key on every node.
    #[arg(long, default_value = "current")]
    key: String,
    /// Longest backoff sleep after a lost round, in milliseconds (direct mode). Lower is
    /// fairer between contending clients, higher leaves more of the nodes' time to winners.
    #[arg(long, default_value_t = idclient::BACKOFF_CAP.as_millis() as u64)]
    backoff_cap_ms: u64,
    /// Direct mode, fast protocol: share rounds with contending clients through the
    /// rendezvous node. auto: after losing a round to another writer; always: from the
    /// first request; never: each request runs its own rounds with backoff.
    #[arg(long, value_enum, default_value_t = CombineArg::Auto)]
    combine: CombineArg,
    /// Use nodes that do not fsync every write. DANGEROUS: a node crash can then repeat IDs.
    #[arg(long)]
    unsafe_skip_durability_check: bool,
}

impl SourceArgs {
    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new(self.r#where.nodes.clone());
        config.key = self.key.clone();
        config.protocol = if self.classic {
            Protocol::Classic
        } else {
            Protocol::Fast
        };
        config.deadline = Duration::from_millis(self.deadline_ms);
        config.connect_timeout = Duration::from_millis(self.timeout_ms);
        config.reply_timeout = Duration::from_millis(self.timeout_ms);
        config.unsafe_skip_durability_check = self.unsafe_skip_durability_check;
        config.backoff_cap = Duration::from_millis(self.backoff_cap_ms);
        config.combine = match self.combine {
            CombineArg::Auto => Combine::Auto,
            CombineArg::Always => Combine::Always,
            CombineArg::Never => Combine::Never,
        };
        config
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum CombineArg {
    Auto,
    Always,
    Never,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("idctl: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Cluster(ClusterCmd::Up {
            dir,
            nodes,
            base_port,
        }) => {
            let quorum = LocalQuorum::start(&dir, nodes, base_port)?;
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
            Ok(ExitCode::SUCCESS)
        }
        Command::Cluster(ClusterCmd::Down { dir }) => {
            let stopped = cluster::down(&dir)?;
            eprintln!("stopped {stopped} node(s) of {}", dir.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { nodes, timeout_ms } => runtime()?.block_on(check(nodes, timeout_ms)),
        Command::BrokerStats { addr } => runtime()?.block_on(broker_stats(addr)),
        Command::Next { source, count } => runtime()?.block_on(async {
            let range = if source.r#where.broker.is_empty() {
                QuorumClient::connect(source.client_config())
                    .await?
                    .next_ids(count)
                    .await?
            } else {
                broker_source(&source).await?.next_ids(count).await?
            };
            println!("{} {}", range.lo, range.hi);
            Ok(ExitCode::SUCCESS)
        }),
        Command::Bench {
            source,
            clients,
            seconds,
            count,
            history,
        } => {
            if clients == 0 {
                bail!("--clients must be at least 1");
            }
            if !(seconds > 0.0 && seconds.is_finite()) {
                bail!("--seconds must be a positive number, got {seconds}");
            }
            let config = BenchConfig {
                clients,
                duration: Duration::from_secs_f64(seconds),
                count,
                progress: true,
            };
            let (report, counters) = runtime()?.block_on(async {
                if source.r#where.broker.is_empty() {
                    let client_config = source.client_config();
                    let mut sources = Vec::with_capacity(clients);
                    for _ in 0..clients {
                        sources.push(std::sync::Arc::new(
                            QuorumClient::connect(client_config.clone()).await?,
                        ));
                    }
                    let report = bench::run(&config, &sources).await;
                    Ok::<_, anyhow::Error>((report, Some(sum_counters(&sources))))
                } else {
                    let shared = std::sync::Arc::new(broker_source(&source).await?);
                    let sources = vec![shared; clients];
                    Ok((bench::run(&config, &sources).await, None))
                }
            })?;
            if let Some(path) = history {
                let file = std::fs::File::create(&path)
                    .with_context(|| format!("cannot create history file {}", path.display()))?;
                idtools::history::write_events(std::io::BufWriter::new(file), &report.events)
                    .with_context(|| format!("cannot write history file {}", path.display()))?;
            }
            if let Some(c) = counters {
                eprintln!(
                    "direct clients in all: {} requests, {} write rounds ({} retries), {} node rejects, {} IDs burned by lost rounds; {} batches led, {} requests served by another client's batch",
                    c.requests, c.rounds, c.retries, c.rejects, c.burned, c.batches, c.combined
                );
            }
            eprintln!("{}", report.summary_line());
            println!("{}", report.json());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The direct clients' counters, added up.
fn sum_counters(clients: &[std::sync::Arc<QuorumClient>]) -> idclient::Counters {
    clients
        .iter()
        .map(|c| c.counters())
        .fold(idclient::Counters::default(), |a, c| idclient::Counters {
            requests: a.requests + c.requests,
            rounds: a.rounds + c.rounds,
            rejects: a.rejects + c.rejects,
            retries: a.retries + c.retries,
            burned: a.burned + c.burned,
            errors: a.errors + c.errors,
            combined: a.combined + c.combined,
            batches: a.batches + c.batches,
        })
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

async fn check(nodes: Vec<String>, timeout_ms: u64) -> Result<ExitCode> {
    let timeout = Duration::from_millis(timeout_ms);
    let results = idclient::check_nodes(&nodes, timeout, timeout).await?;
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
        eprintln!("idctl: {bad} of {} node(s) unusable", results.len());
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The broker client for `--broker`: one client (a few pipelined connections) shared by
/// every caller, failing over along the list of brokers.
async fn broker_source(source: &SourceArgs) -> Result<idclient::broker_client::BrokerClient> {
    let config = idclient::broker_client::BrokerClientConfig {
        deadline: Duration::from_millis(source.deadline_ms),
        connect_timeout: Duration::from_millis(source.timeout_ms),
        ..Default::default()
    };
    let addrs = source.r#where.broker.clone();
    idclient::broker_client::BrokerClient::connect(addrs.clone(), config)
        .await
        .with_context(|| format!("--broker {}", addrs.join(",")))
}

/// `idctl broker-stats ADDR`: the broker's counters, human-readable, then one JSON line.
async fn broker_stats(addr: String) -> Result<ExitCode> {
    let s = idclient::broker_client::fetch_stats(&addr)
        .await
        .with_context(|| format!("broker {addr}"))?;
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
    let json = serde_json::json!({
        "requests": s.requests,
        "ids": s.ids,
        "rounds": s.rounds,
        "rounds_failed": s.rounds_failed,
        "requests_failed": s.requests_failed,
        "mean_batch": (s.mean_batch() * 100.0).round() / 100.0,
        "max_batch": s.batch_max,
        "mean_round_us": s.mean_round_us().round(),
        "max_round_us": s.round_us_max,
    });
    println!("{json}");
    Ok(ExitCode::SUCCESS)
}

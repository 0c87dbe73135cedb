//! `producer`: stamps items with quorum IDs and writes shard N's sublist (see `docs/producer.md`).

use clap::{ArgGroup, Parser};
use idclient::broker_client::{BrokerClient, BrokerClientConfig};
use idclient::{ClientConfig, IdError, QuorumClient};
use producer::{
    Config, Display, InputSpec, Producer, ProducerError, DEFAULT_BATCH, DEFAULT_PAYLOAD_SIZE,
};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Stamp items with globally ordered IDs and write them to the sublist DIR/shard-<N>.
///
/// Killed at any moment and started again with the same arguments, it resumes after the
/// last durable batch: every item ends up in the sublist exactly once. Started on a
/// finished sublist it does nothing. Exit codes: 0 done, 2 bad arguments, 3 bad,
/// unreadable or changed input, 4 sublist refused or failing (in use by another producer,
/// another shard's, written from different input, not a sublist, disk full), 5 ID
/// generator unavailable or unsafe (no quorum before the deadline, unsafe node, IDs gone
/// backwards; every batch before the failure is durable), 1 other.
#[derive(Parser, Debug)]
#[command(name = "producer", version)]
#[command(group(ArgGroup::new("ids").required(true).args(["nodes", "broker"])))]
#[command(group(ArgGroup::new("source").required(true).args(["input", "generate"])))]
struct Flags {
    /// Shard number N (u32): the sublist is DIR/shard-<N>.
    #[arg(long)]
    shard: u32,
    /// Directory holding the sublists (created if missing).
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Redis quorum nodes, comma-separated redis://host:port URLs (direct mode).
    #[arg(long, value_name = "URLS")]
    nodes: Option<String>,
    /// ID brokers, comma-separated host:port addresses.
    #[arg(long, value_name = "ADDRS")]
    broker: Option<String>,
    /// Input file, one item per line (any bytes; the newline is stripped). `-` reads
    /// stdin, which is NOT resumable: a killed run cannot be continued from stdin. A pipe
    /// or FIFO (e.g. `<(zcat f.gz)`) is read once the same way, also not resumable.
    #[arg(long, value_name = "FILE")]
    input: Option<String>,
    /// Generate COUNT synthetic items instead of reading input (deterministic per shard
    /// and sequence number).
    #[arg(long, value_name = "COUNT")]
    generate: Option<u64>,
    /// Payload bytes of each generated item.
    #[arg(long, value_name = "B", default_value_t = DEFAULT_PAYLOAD_SIZE, requires = "generate")]
    payload_size: usize,
    /// Items per batch: one ID range and one synced write per batch.
    #[arg(long, value_name = "B", default_value_t = DEFAULT_BATCH)]
    batch: u64,
    /// Seconds one ID request may take, retries included, before the producer gives up
    /// with "no quorum" (everything written before stays durable).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    deadline: f64,
    /// Accept Redis nodes that do not fsync every write. Can repeat IDs after a crash.
    #[arg(long)]
    unsafe_skip_durability_check: bool,
    /// Never draw a progress bar; log a line every --log-every seconds instead.
    #[arg(long)]
    no_progress_bar: bool,
    /// Seconds between progress log lines when there is no progress bar.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    log_every: f64,
}

/// Test hook for crash and edit tests, see [`Config::test_stall_after`].
const STALL_ENV: &str = "QLIST_PRODUCER_TEST_STALL_AFTER";

/// Where IDs come from.
enum Ids {
    Nodes(ClientConfig),
    Broker(Vec<String>, Duration),
}

fn seconds(name: &str, v: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            ProducerError::Config(format!(
                "--{name} must be a positive number of seconds, got {v}"
            ))
            .into()
        })
}

fn split(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn config(flags: &Flags) -> anyhow::Result<(Config, Ids)> {
    let input = match (&flags.input, flags.generate) {
        (Some(f), None) if f == "-" => InputSpec::Stdin,
        (Some(f), None) => InputSpec::File(PathBuf::from(f)),
        (None, Some(count)) => InputSpec::Generate {
            count,
            payload_size: flags.payload_size,
        },
        _ => {
            return Err(
                ProducerError::Config("give exactly one of --input and --generate".into()).into(),
            )
        }
    };
    let display = if !flags.no_progress_bar && std::io::stderr().is_terminal() {
        Display::Bar
    } else {
        Display::Log(seconds("log-every", flags.log_every)?)
    };
    let deadline = seconds("deadline", flags.deadline)?;
    let ids = match (&flags.nodes, &flags.broker) {
        (Some(n), None) => {
            let mut c = ClientConfig::new(split(n));
            c.deadline = deadline;
            c.unsafe_skip_durability_check = flags.unsafe_skip_durability_check;
            Ids::Nodes(c)
        }
        (None, Some(b)) => Ids::Broker(split(b), deadline),
        _ => {
            return Err(
                ProducerError::Config("give exactly one of --nodes and --broker".into()).into(),
            )
        }
    };
    let test_stall_after = match std::env::var(STALL_ENV) {
        Ok(v) => Some(
            v.parse()
                .map_err(|_| ProducerError::Config(format!("{STALL_ENV}={v:?} is not a number")))?,
        ),
        Err(_) => None,
    };
    let cfg = Config {
        shard: flags.shard,
        data_dir: flags.data_dir.clone(),
        input,
        batch: flags.batch,
        display,
        test_stall_after,
    };
    Ok((cfg, ids))
}

async fn run_with_broker(
    p: Producer,
    addrs: Vec<String>,
    deadline: Duration,
) -> Result<producer::Summary, ProducerError> {
    let config = BrokerClientConfig {
        deadline,
        ..BrokerClientConfig::default()
    };
    let client = BrokerClient::connect(addrs, config)
        .await
        .map_err(ProducerError::Connect)?;
    p.run(&client).await
}

async fn run(flags: Flags) -> anyhow::Result<()> {
    let (cfg, ids) = config(&flags)?;
    if flags.unsafe_skip_durability_check {
        tracing::warn!("--unsafe-skip-durability-check: nodes that lose acknowledged writes can make IDs repeat");
    }
    let p = Producer::open(cfg)?;
    let summary = if p.is_finished() {
        // No ID generator needed to do nothing.
        p.run(&NoIds).await?
    } else {
        match ids {
            Ids::Nodes(c) => {
                let client = QuorumClient::connect(c)
                    .await
                    .map_err(ProducerError::Connect)?;
                p.run(&client).await?
            }
            Ids::Broker(addrs, deadline) => run_with_broker(p, addrs, deadline).await?,
        }
    };
    println!("{summary}");
    Ok(())
}

/// Used only on a finished sublist, where no ID is ever requested.
struct NoIds;

impl idclient::IdSource for NoIds {
    async fn next_ids(&self, _n: u64) -> Result<idclient::IdRange, IdError> {
        Err(IdError::BadRequest("no ID source connected".into()))
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let flags = Flags::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("producer: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("producer: error: {e:#}");
            let code = e
                .downcast_ref::<ProducerError>()
                .map_or(1, ProducerError::exit_code);
            ExitCode::from(code)
        }
    }
}

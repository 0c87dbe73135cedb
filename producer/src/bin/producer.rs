//! `producer`: stamps items with quorum IDs and writes shard N's sublist (see `docs/producer.md`).

use anyhow::Context;
use clap::{ArgGroup, Parser};
use idclient::broker_client::{BrokerClient, BrokerClientConfig};
use idclient::{IdError, QuorumClient};
use producer::{
    Config, Display, InputSpec, Producer, ProducerError, DEFAULT_BATCH, DEFAULT_PAYLOAD_SIZE,
};
use qcli::{Cause, Source, SourceArgs};
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
#[command(group(ArgGroup::new("source").required(true).args(["input", "generate"])))]
struct Flags {
    /// Shard number N (u32): the sublist is DIR/shard-<N>.
    #[arg(long)]
    shard: u32,
    /// Directory holding the sublists (created if missing).
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Where IDs come from: exactly one of --nodes (direct) and --broker.
    #[command(flatten)]
    ids: SourceArgs,
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
    /// Old spelling of --deadline-ms, in seconds (fractions allowed); kept, hidden, with
    /// its old unit so that existing scripts keep their meaning.
    #[arg(long, value_name = "SECS", hide = true, conflicts_with = "deadline_ms")]
    deadline: Option<f64>,
    /// Never draw a progress bar; log a line every --log-every seconds instead.
    #[arg(long)]
    no_progress_bar: bool,
    /// Seconds between progress log lines when there is no progress bar.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    log_every: f64,
    /// Serve Prometheus metrics (/metrics), /healthz and /readyz over HTTP on this
    /// address (host:port; port 0 picks a free one); see docs/operations.md. Off by default.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
}

/// Test hook for crash and edit tests, see [`Config::test_stall_after`].
const STALL_ENV: &str = "QLIST_PRODUCER_TEST_STALL_AFTER";

/// The producer's `--deadline-ms` default: a producer is a batch job that would rather
/// wait out a short outage than exit and be restarted.
const DEFAULT_DEADLINE_MS: &str = "10000";

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

fn config(flags: &Flags) -> anyhow::Result<(Config, Source)> {
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
    let mut ids = flags.ids.source()?;
    if let Some(secs) = flags.deadline {
        let deadline = seconds("deadline", secs)?;
        match &mut ids {
            Source::Nodes(c) => c.deadline = deadline,
            Source::Brokers { config, .. } => config.deadline = deadline,
        }
    }
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
    config: BrokerClientConfig,
) -> Result<producer::Summary, ProducerError> {
    let client = BrokerClient::connect(addrs, config)
        .await
        .map_err(ProducerError::Connect)?;
    p.run(&client).await
}

async fn run(flags: Flags) -> anyhow::Result<()> {
    let (cfg, ids) = config(&flags)?;
    if flags.ids.quorum.unsafe_skip_durability_check {
        tracing::warn!("--unsafe-skip-durability-check: nodes that lose acknowledged writes can make IDs repeat");
    }
    let shard = cfg.shard;
    let mut p = Producer::open(cfg)?;
    let _metrics = match &flags.metrics_listen {
        Some(addr) => {
            let metrics = std::sync::Arc::new(producer::ProducerMetrics::new(shard));
            p = p.with_metrics(metrics.clone());
            Some(serve_metrics(addr, metrics).await?)
        }
        None => None,
    };
    let summary = if p.is_finished() {
        // No ID generator needed to do nothing.
        p.run(&NoIds).await?
    } else {
        match ids {
            Source::Nodes(c) => {
                let client = QuorumClient::connect(c)
                    .await
                    .map_err(ProducerError::Connect)?;
                p.run(&client).await?
            }
            Source::Brokers { addrs, config } => run_with_broker(p, addrs, config).await?,
        }
    };
    println!("{summary}");
    Ok(())
}

/// Aborts the metrics endpoint when dropped (the run is over).
struct MetricsTask(tokio::task::JoinHandle<()>);

impl Drop for MetricsTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts `producer --metrics-listen` on `addr`; logs the bound address.
async fn serve_metrics(
    addr: &str,
    metrics: std::sync::Arc<producer::ProducerMetrics>,
) -> anyhow::Result<MetricsTask> {
    let listener = qmetrics::bind(addr).await?;
    let bound = listener.local_addr().context("metrics listener address")?;
    tracing::info!("metrics listening on {bound}");
    let endpoints = std::sync::Arc::new(producer::metrics::endpoints(metrics));
    Ok(MetricsTask(tokio::spawn(qmetrics::serve(
        listener,
        endpoints,
        qmetrics::Limits::default(),
    ))))
}

/// Used only on a finished sublist, where no ID is ever requested.
struct NoIds;

impl idclient::IdSource for NoIds {
    async fn next_ids(&self, _n: u64) -> Result<idclient::IdRange, IdError> {
        Err(IdError::BadRequest("no ID source connected".into()))
    }
}

fn main() -> ExitCode {
    qcli::init_logging("info");
    let flags: Flags =
        qcli::parse(|cmd| cmd.mut_arg("deadline_ms", |a| a.default_value(DEFAULT_DEADLINE_MS)));
    qcli::exit("producer", start(flags), |e| {
        e.downcast_ref::<ProducerError>()
            .map(|p| Cause::from_code(p.exit_code()))
    })
}

fn start(flags: Flags) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(run(flags))
}

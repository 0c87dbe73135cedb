//! `producer`: stamps items with quorum IDs and writes shard N's sublist; `producer seal`
//! (and `--seal-to`) turns a finished sublist into a run (see `docs/producer.md`).

use anyhow::Context;
use clap::{ArgGroup, Args, Parser, Subcommand};
use idclient::broker_client::{BrokerClient, BrokerClientConfig};
use idclient::{IdError, QuorumClient};
use idflags::IdsFrom;
use producer::{
    Config, InputFormat, ItemInput, Producer, ProducerError, ProgressDisplay, Publish,
    PublishError, SealError, DEFAULT_BATCH, DEFAULT_PAYLOAD_SIZE,
};
use qcli::{Cause, SourceArgs};
use qstore::{Location, Store, StoreError, StoreOptions};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Stamp items with globally ordered IDs and write them to the sublist DIR/shard-<N>;
/// `producer seal` turns a finished sublist into a run (DIR/shard-<N> -> DEST/shard-<N>.bin).
///
/// Killed at any moment and started again with the same arguments, it resumes after the
/// last durable batch: every item ends up in the sublist exactly once. Started on a
/// finished sublist it does nothing (but seal, with --seal-to). Exit codes: 0 done, 2 bad
/// arguments, 3 bad, unreadable or changed input, 4 sublist refused or failing (in use by
/// another producer, another shard's, written from different input, not a sublist, disk
/// full) or the run's destination not writable, 5 ID generator unavailable or unsafe (no
/// quorum before the deadline, unsafe node, IDs gone backwards; every batch before the
/// failure is durable), 1 other.
#[derive(Parser, Debug)]
#[command(
    name = "producer",
    version = producer::VERSION,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    produce: Flags,
}

/// How DEST is written and where S3 credentials come from (`--seal-to`, `seal --to`).
const DEST_HELP: &str = "DEST is a local directory (it must exist; the run is written to a \
hidden temporary file there, fsynced and renamed into place) or s3://bucket/prefix (a \
multipart upload, completed only once every byte is sent). For S3, the endpoint, region and \
credentials come from the usual environment variables, whose values are never shown: \
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), AWS_REGION, \
AWS_ENDPOINT_URL (another S3-compatible store: MinIO, Ceph, SeaweedFS, GCS's \
interoperability endpoint) and AWS_ALLOW_HTTP=true (an http:// endpoint).";

#[derive(Subcommand, Debug)]
enum Command {
    /// Seal a finished sublist: write DIR/shard-<N> as the run DEST/shard-<N>.bin.
    ///
    /// A run is one immutable file (list.bin version 2): the sublist's items in ID order,
    /// in checksummed blocks, with an index and a shard table; the merger reads it from a
    /// directory or S3. The run appears atomically (a reader never sees part of it) and
    /// sealing is deterministic: sealing again writes the same bytes, so a seal that was
    /// killed is simply run again. An unfinished sublist is refused (exit 3): run its
    /// producer again to finish it first.
    #[command(after_long_help = DEST_HELP)]
    Seal(SealArgs),
}

#[derive(Args, Debug)]
struct SealArgs {
    /// Shard number N (u32): the sublist is DIR/shard-<N>.
    #[arg(long)]
    shard: u32,
    /// Directory holding the sublists.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// Where the run goes: a local directory or s3://bucket/prefix (the run is
    /// DEST/shard-<N>.bin; see below for S3 settings).
    #[arg(long, value_name = "DEST")]
    to: String,
}

/// Producing (the default command, without a subcommand).
#[derive(Args, Debug)]
#[command(group(ArgGroup::new("source").required(true).args(["input", "generate"])))]
struct Flags {
    /// Shard number N (u32): the sublist is DIR/shard-<N>.
    #[arg(long, required = true)]
    shard: Option<u32>,
    /// Directory holding the sublists (created if missing).
    #[arg(long, value_name = "DIR", required = true)]
    data_dir: Option<PathBuf>,
    /// Where IDs come from: exactly one of --nodes (direct) and --broker.
    #[command(flatten)]
    ids: SourceArgs,
    /// Input file, its items cut as --input-format says (by default one item per line,
    /// any bytes, the newline stripped). `-` reads stdin, which is NOT resumable: a killed
    /// run cannot be continued from stdin. A pipe or FIFO (e.g. `<(zcat f.gz)`) is read
    /// once the same way, also not resumable.
    #[arg(long, value_name = "FILE")]
    input: Option<String>,
    /// How --input is cut into items (default: lines). `lines`: one item per line, the
    /// `\n` stripped, so an item cannot hold a newline. `frames`: each item is a
    /// little-endian u32 byte length followed by that many bytes, so an item may hold any
    /// bytes (newlines, NUL) or none. A frame whose length is above 16 MiB (the item limit)
    /// is refused from its length alone; a frame cut short by the end of the input is
    /// refused too; both errors name the byte offset where the frame starts (exit 3). A
    /// file is checked in full before anything is written, so a bad file writes nothing;
    /// from stdin or a pipe, the whole frames before the bad one are written (durable)
    /// before the error. Frames files resume after a kill like lines files.
    #[arg(long, value_name = "FORMAT", value_enum)]
    input_format: Option<Format>,
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
    /// Once the input is finished (now, or by an earlier run), seal the sublist into the
    /// run DEST/shard-<N>.bin: a local directory or s3://bucket/prefix (see `producer seal
    /// --help`). Killed while sealing, run again with the same arguments: it seals again.
    /// With --publish-every, publish into DEST as it goes instead.
    #[arg(long, value_name = "DEST")]
    seal_to: Option<String>,
    /// Publish into --seal-to's DEST as it goes, every SECS seconds (fractions allowed,
    /// e.g. 0.2): between two batches, the items made durable since the last publication
    /// become one segment, DEST/segments/shard-<N>/<a>-<b>.seg, then the checkpoint
    /// DEST/shard-<N>.checkpoint is replaced (its segments, its count, its claim). At the
    /// end of the input: the last segment and a finished checkpoint (no run
    /// DEST/shard-<N>.bin). Killed or stopped at any moment and run again with the same
    /// arguments, it publishes the same items, none twice (docs/producer.md).
    #[arg(long, value_name = "SECS", requires = "seal_to")]
    publish_every: Option<f64>,
}

/// `--input-format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// One item per line.
    Lines,
    /// Each item a u32 little-endian length, then its bytes.
    Frames,
}

impl From<Format> for InputFormat {
    fn from(f: Format) -> InputFormat {
        match f {
            Format::Lines => InputFormat::Lines,
            Format::Frames => InputFormat::Frames,
        }
    }
}

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

/// `--shard` and `--data-dir`: required by clap unless a subcommand is given.
fn target(flags: &Flags) -> anyhow::Result<(u32, PathBuf)> {
    match (flags.shard, &flags.data_dir) {
        (Some(shard), Some(dir)) => Ok((shard, dir.clone())),
        _ => Err(qcli::usage("--shard N and --data-dir DIR are required")),
    }
}

fn config(flags: &Flags) -> anyhow::Result<(Config, IdsFrom)> {
    if flags.generate.is_some() && flags.input_format.is_some() {
        return Err(qcli::usage(
            "--input-format applies to --input only, not to --generate",
        ));
    }
    let input = match (&flags.input, flags.generate) {
        (Some(f), None) if f == "-" => ItemInput::Stdin,
        (Some(f), None) => ItemInput::File(PathBuf::from(f)),
        (None, Some(count)) => ItemInput::Generate {
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
        ProgressDisplay::Bar
    } else {
        ProgressDisplay::Log(seconds("log-every", flags.log_every)?)
    };
    let mut ids = idflags::source(&flags.ids)?;
    if let Some(secs) = flags.deadline {
        let deadline = seconds("deadline", secs)?;
        match &mut ids {
            IdsFrom::Nodes(c) => c.deadline = deadline,
            IdsFrom::Brokers { config, .. } => config.deadline = deadline,
        }
    }
    let (shard, data_dir) = target(flags)?;
    let cfg = Config {
        shard,
        data_dir,
        input,
        format: flags.input_format.unwrap_or(Format::Lines).into(),
        batch: flags.batch,
        display,
        publish: publication(flags)?,
    };
    Ok((cfg, ids))
}

/// `--seal-to DEST --publish-every SECS`: publishing as it goes (checked again here, as
/// the library takes it, after clap's `requires`).
fn publication(flags: &Flags) -> anyhow::Result<Option<Publish>> {
    let Some(secs) = flags.publish_every else {
        return Ok(None);
    };
    let every = seconds("publish-every", secs)?;
    let Some(dest) = &flags.seal_to else {
        return Err(qcli::usage("--publish-every needs --seal-to DEST"));
    };
    Ok(Some(Publish::new(dest, every)?))
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

async fn run(flags: &Flags) -> anyhow::Result<()> {
    let (cfg, ids) = config(flags)?;
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
    let summary = if !p.needs_ids() {
        // No ID generator needed to stamp nothing (and to finish a publication).
        p.run(&NoIds).await?
    } else {
        match ids {
            IdsFrom::Nodes(c) => {
                let client = QuorumClient::connect(c)
                    .await
                    .map_err(ProducerError::Connect)?;
                p.run(&client).await?
            }
            IdsFrom::Brokers { addrs, config } => run_with_broker(p, addrs, config).await?,
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
    let cli: Cli =
        qcli::parse(|cmd| cmd.mut_arg("deadline_ms", |a| a.default_value(DEFAULT_DEADLINE_MS)));
    let result = hooks().and_then(|()| match cli.command {
        Some(Command::Seal(args)) => run_seal(&args),
        None => start(&cli.produce),
    });
    qcli::exit("producer", result, classify)
}

/// Reads the test hooks' variables (only in a build with the `test-hooks` feature).
fn hooks() -> anyhow::Result<()> {
    #[cfg(feature = "test-hooks")]
    producer::test_hooks::from_env().map_err(ProducerError::Config)?;
    Ok(())
}

/// The producer's own errors: [`ProducerError`] and [`SealError`] carry their exit code;
/// a [`StoreError`] outside a seal (a bad DEST, the S3 configuration) is usage or output.
fn classify(e: &(dyn std::error::Error + 'static)) -> Option<Cause> {
    if let Some(p) = e.downcast_ref::<ProducerError>() {
        return Some(Cause::from_code(p.exit_code()));
    }
    if let Some(s) = e.downcast_ref::<SealError>() {
        return Some(Cause::from_code(s.exit_code()));
    }
    if let Some(p) = e.downcast_ref::<PublishError>() {
        return Some(Cause::from_code(p.exit_code()));
    }
    e.downcast_ref::<StoreError>().map(|e| match e {
        StoreError::BadLocation { .. } => Cause::Usage,
        _ => Cause::Output,
    })
}

fn start(flags: &Flags) -> anyhow::Result<()> {
    // A bad DEST fails now, not after the whole input is stamped.
    let dest = flags.seal_to.as_deref().map(Dest::parse).transpose()?;
    // Publishing as it goes ends with a finished checkpoint, not a run.
    let dest = dest.filter(|_| flags.publish_every.is_none());
    let (shard, data_dir) = target(flags)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(run(flags))?;
    drop(rt);
    // The producer closed the sublist when its run ended; the store's calls block, so
    // they run here, outside the async runtime.
    if let Some(dest) = dest {
        dest.seal(&data_dir, shard).with_context(|| {
            format!("shard {shard}: the sublist is finished and kept; run again with the same arguments to seal it")
        })?;
    }
    Ok(())
}

/// `producer seal`.
fn run_seal(args: &SealArgs) -> anyhow::Result<()> {
    Dest::parse(&args.to)?.seal(&args.data_dir, args.shard)
}

/// Where runs are sealed to: the parsed DEST and the store that writes there.
struct Dest {
    location: Location,
    store: Store,
}

impl Dest {
    /// Parses DEST and sets up its store (S3: reads the AWS_* variables). A local DEST must
    /// be an existing directory.
    fn parse(dest: &str) -> anyhow::Result<Dest> {
        let location = Location::parse(dest)?;
        if let Location::Dir(dir) = &location {
            if !dir.is_dir() {
                return Err(qcli::fail(
                    Cause::Output,
                    format!("seal destination {}: no such directory", dir.display()),
                ));
            }
        }
        let store = Store::new(StoreOptions::default());
        Ok(Dest { location, store })
    }

    /// Seals shard `shard` of `data_dir` here and prints what it did.
    fn seal(&self, data_dir: &std::path::Path, shard: u32) -> anyhow::Result<()> {
        let mut last_log = Instant::now();
        let mut on_progress = |records: u64, bytes: u64| {
            if last_log.elapsed() >= SEAL_LOG_EVERY {
                last_log = Instant::now();
                tracing::info!(shard, records, mb = bytes / 1_000_000, "sealing");
            }
            #[cfg(feature = "test-hooks")]
            producer::test_hooks::maybe_stall_sealing(records);
        };
        let summary = producer::seal(
            data_dir,
            shard,
            &self.store,
            &self.location,
            &mut on_progress,
        )?;
        println!("{summary}");
        Ok(())
    }
}

/// Log a sealing progress line this often.
const SEAL_LOG_EVERY: Duration = Duration::from_secs(5);

//! `merger`: merge sublists into list.bin, verify a list.bin, print one.
//!
//! ```text
//! merger --out OUT (--data-dir DIR | --runs SRC | INPUT...) [--expect-shards N] [--part I/K] [--jobs J]
//!        [--format auto|bin|parquet] [--compression snappy|zstd[:L]|none] [--row-group-rows N]
//!        [--encode-threads N]
//! merger follow --runs SRC --expect-shards K --out-dir DIR [--format bin|parquet] [--stdout [--json]]
//!        [--poll-ms 200] [--part-bytes N] [--part-every SECS] [--metrics-listen ADDR]
//! merger convert FILE... --out OUT.parquet
//! merger verify FILE...
//! merger cat FILE... [--json]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use merger::command::{open_and_merge, MergeConfig};
use merger::follow::{FollowConfig, FollowStats, Lines, PartFormat};
use merger::output::OutputFormat;
use merger::parquet_list::{
    default_encoders, Codec, ParquetOptions, DEFAULT_ROW_GROUP_ROWS, MAX_ENCODERS,
};
use merger::progress::{MergeProgress, Stall};
use merger::{MergeError, MergeInput};
use qcli::Cause;
use qformat::listbin::ListError;
use qformat::names::has_run_suffix;
use qformat::run::RunError;
use qstore::{Location, Store, StoreError, StoreOptions};

#[derive(Parser)]
#[command(
    name = "merger",
    version = merger::VERSION,
    about = "Merge qlist sublists and runs into one list ordered by ID; verify or print a list",
    long_about = "Merge qlist sublists and runs into one list ordered by ID; verify or print a list.\n\n\
        Inputs are any mix of RocksDB sublists (a producer's DIR/shard-<n>), runs (sealed \
        sublists or merged lists: list.bin version 2 files) and --runs SRC (every *.bin run \
        in a directory or under an S3 prefix). The output is a run too, so merges compose, \
        or (--out *.parquet) a Parquet file sorted by id that DuckDB, pandas/pyarrow, \
        Polars and Spark read directly. SRC, INPUT and --out may be s3://bucket/prefix URLs; \
        the S3 endpoint and credentials come from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, \
        AWS_ENDPOINT_URL and AWS_ALLOW_HTTP=true (plain-http endpoints), never shown.",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    merge: MergeArgs,
}

#[derive(Args)]
#[command(group = clap::ArgGroup::new("input").required(true).multiple(true).args(["data_dir", "runs", "inputs"]))]
struct MergeArgs {
    /// Output: a file (written to a temporary file in the same directory, then renamed) or
    /// s3://bucket/key (a multipart upload, visible only once complete).
    #[arg(long, required = true, value_name = "OUT")]
    out: Option<String>,
    /// Merge every shard-<n> sublist under DIR.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Merge every *.bin run in directory SRC or under s3://bucket/prefix SRC (repeatable).
    #[arg(long, value_name = "SRC")]
    runs: Vec<String>,
    /// Sublists (directories), run files or s3:// run objects to merge.
    #[arg(value_name = "INPUT")]
    inputs: Vec<String>,
    /// Require every shard 0..N-1 to be present and complete, and no other shard.
    #[arg(long, value_name = "N")]
    expect_shards: Option<u32>,
    /// Merge only part I (0-based) of K: the K parts split the ID space at points taken
    /// from the runs' indexes, so K processes started independently agree; run them on
    /// any scheduler, then `merger verify` (or read) the K outputs in order.
    #[arg(long, value_name = "I/K", value_parser = parse_part)]
    part: Option<(u32, u32)>,
    /// Merge with J threads, each an ID range of the runs (the split of --part), into one output.
    #[arg(long, value_name = "J", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    jobs: u32,
    /// Merge sublists whose producer has not finished its input (normally refused).
    #[arg(long)]
    allow_unfinished: bool,
    /// An S3 operation (a ranged read, one part of an upload) may take this long,
    /// retries with backoff included, before the merge fails naming the object.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    store_deadline_secs: u64,
    /// Output format: bin (list.bin, a run: it can be merged again, verified, printed) or
    /// parquet (for DuckDB, pandas/pyarrow, Polars, Spark; docs/list-format.md); auto:
    /// parquet when OUT ends in .parquet, else bin.
    #[arg(long, value_name = "FORMAT", default_value = "auto", value_parser = ["auto", "bin", "parquet"])]
    format: String,
    #[command(flatten)]
    parquet: ParquetArgs,
}

/// How a Parquet output is written.
#[derive(Args, Clone, Copy)]
struct ParquetArgs {
    /// Parquet: compression of the column chunks: snappy, zstd (level 3; zstd:L for level
    /// L, 1-22) or none (BENCHMARKS.md, "Parquet").
    #[arg(long, value_name = "CODEC", default_value = "snappy")]
    compression: Codec,
    /// Parquet: rows per row group at most (a row group also ends at 32 MiB of payloads).
    /// Smaller groups let an ID-range query skip more of the file.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_ROW_GROUP_ROWS as u64, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    row_group_rows: u64,
    /// Parquet: threads encoding row groups while the merge goes on (default: one per
    /// CPU, at most 4); 0 encodes on the merge thread. The file is the same either way;
    /// each thread holds one row group in memory.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=MAX_ENCODERS as u64))]
    encode_threads: Option<u64>,
}

impl ParquetArgs {
    fn options(self) -> ParquetOptions {
        ParquetOptions {
            codec: self.compression,
            row_group_rows: usize::try_from(self.row_group_rows).unwrap_or(DEFAULT_ROW_GROUP_ROWS),
            encoders: self
                .encode_threads
                .map_or_else(default_encoders, |n| n as usize),
        }
    }
}

/// `I/K` with `I < K`.
fn parse_part(s: &str) -> Result<(u32, u32), String> {
    let (i, k) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not I/K (e.g. 0/4)"))?;
    let i: u32 = i
        .parse()
        .map_err(|_| format!("part {i:?} is not a number"))?;
    let k: u32 = k
        .parse()
        .map_err(|_| format!("part count {k:?} is not a number"))?;
    if k == 0 || i >= k || k > MAX_PARTS {
        return Err(format!("part {i}/{k}: need 0 <= I < K <= {MAX_PARTS}"));
    }
    Ok((i, k))
}

/// More parts than this would be ranges smaller than a block of most lists.
const MAX_PARTS: u32 = 1 << 16;

/// `merger follow`'s flags.
#[derive(Args)]
struct FollowArgs {
    /// Where the producers publish (`--publish-every`): a directory or s3://bucket/prefix
    /// holding shard-<n>.checkpoint and segments/.
    #[arg(long, required = true, value_name = "SRC")]
    runs: String,
    /// The list is made of shards 0..K-1: W waits for every one of them (a shard without
    /// a checkpoint yet holds it back).
    #[arg(long, required = true, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=i64::from(merger::follow::MAX_SHARDS)))]
    expect_shards: u32,
    /// Write the list as consecutive parts DIR/part-<i>.bin (or .parquet), each appearing
    /// atomically; a follower started again resumes after the last one.
    #[arg(long, value_name = "DIR", required_unless_present = "stdout")]
    out_dir: Option<PathBuf>,
    /// The parts' format: bin (list.bin runs: merger verify and cat read them in order as
    /// one list) or parquet (a directory DuckDB, pyarrow, Polars and Spark read as one dataset).
    #[arg(long, value_name = "FORMAT", default_value = "bin", value_parser = ["bin", "parquet"])]
    format: String,
    /// Also print each record as `merger cat` does, flushed as W moves (for pipes). Without
    /// --out-dir it starts from the beginning every time; with it, from the last part.
    #[arg(long)]
    stdout: bool,
    /// With --stdout: JSON lines, as `merger cat --json`.
    #[arg(long, requires = "stdout")]
    json: bool,
    /// Read the checkpoints this often while the list moves (backing off to 2 s while it
    /// does not).
    #[arg(long, value_name = "MS", default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    poll_ms: u64,
    /// Close a part once it holds this many bytes.
    #[arg(long, value_name = "N", default_value_t = merger::follow::DEFAULT_PART_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    part_bytes: u64,
    /// Close a part holding records once it has been open this long (fractions allowed).
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    part_every: Duration,
    /// Serve /metrics (qlist_follow_*), /healthz and /readyz on ADDR (e.g. 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// An S3 operation may take this long, retries included, before the follower stops.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    store_deadline_secs: u64,
    #[command(flatten)]
    parquet: ParquetArgs,
}

/// Seconds, fractions allowed, more than 0 and at most a day.
fn parse_secs(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("{s}: need more than 0 and at most 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[derive(Subcommand)]
enum Command {
    /// Follow a list while its producers publish (--publish-every): write the records
    /// that can no longer change, in ID order, as consecutive parts (and/or print them),
    /// until every shard has finished.
    Follow(Box<FollowArgs>),
    /// Write a list already merged as Parquet: a list.bin, a sealed run, one part, or the
    /// K parts of a split in order (one file). The same checks as a merge.
    Convert {
        /// The list (a list.bin version 2 run), or parts in order; s3:// too.
        #[arg(required = true)]
        files: Vec<String>,
        /// The Parquet file to write (atomically: complete, or nothing); s3:// too.
        #[arg(long, required = true, value_name = "OUT")]
        out: String,
        #[command(flatten)]
        parquet: ParquetArgs,
    },
    /// Check a list: format, checksums, strict ID order, every shard's seqs. Given the K
    /// parts of a split merge in order, checks them as one list.
    Verify {
        /// The file(s) to check: a list.bin (version 1 or 2), or parts in order; s3:// too.
        #[arg(required = true)]
        files: Vec<String>,
    },
    /// Print the records of a list (or of parts, in order), one per line.
    Cat {
        /// The file(s) to print.
        #[arg(required = true)]
        files: Vec<String>,
        /// One JSON object per line: {"id","shard","seq","payload"} (or "payload_hex"
        /// instead of "payload" when the payload is not UTF-8).
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    qcli::init_logging("info");
    let cli: Cli = qcli::parse(|cmd| cmd);
    match cli.command {
        Some(Command::Follow(args)) => qcli::exit("merger", run_follow(&args), merge_cause),
        Some(Command::Verify { files }) => qcli::exit("merger", run_verify(&files), read_cause),
        Some(Command::Convert {
            files,
            out,
            parquet,
        }) => qcli::exit(
            "merger",
            run_convert(&files, &out, parquet.options()),
            merge_cause,
        ),
        Some(Command::Cat { files, json }) => {
            qcli::exit("merger", run_cat(&files, json), read_cause)
        }
        None => qcli::exit(
            "merger",
            config(cli.merge).and_then(|c| run_merge(&c)),
            merge_cause,
        ),
    }
}

/// `verify` and `cat`: the list is their input.
fn read_cause(e: &(dyn std::error::Error + 'static)) -> Option<Cause> {
    if let Some(MergeError::Store(StoreError::BadLocation { .. })) = e.downcast_ref::<MergeError>()
    {
        return Some(Cause::Usage);
    }
    (e.is::<ListError>() || e.is::<MergeError>() || e.is::<StoreError>()).then_some(Cause::Input)
}

/// The merge: the sublists and runs are its input, the list its output.
fn merge_cause(e: &(dyn std::error::Error + 'static)) -> Option<Cause> {
    if let Some(StoreError::BadLocation { .. }) = e.downcast_ref::<StoreError>() {
        return Some(Cause::Usage);
    }
    Some(match e.downcast_ref::<MergeError>()? {
        MergeError::BadOut { .. } => Cause::Usage,
        MergeError::Store(StoreError::BadLocation { .. }) => Cause::Usage,
        MergeError::List(_)
        | MergeError::Output { .. }
        | MergeError::Parquet { .. }
        | MergeError::FollowDir { .. } => Cause::Output,
        MergeError::Run {
            error: RunError::Io(_),
            ..
        } => Cause::Output,
        _ => Cause::Input,
    })
}

fn config(args: MergeArgs) -> anyhow::Result<MergeConfig> {
    let Some(out) = args.out else {
        return Err(qcli::usage("--out OUT is required"));
    };
    let format = match args.format.as_str() {
        "parquet" => OutputFormat::Parquet(args.parquet.options()),
        "auto" if out.ends_with(".parquet") => OutputFormat::Parquet(args.parquet.options()),
        _ => OutputFormat::Bin,
    };
    if matches!(format, OutputFormat::Parquet(_)) && has_run_suffix(&out) {
        return Err(qcli::usage(format!(
            "--out {out} with --format parquet: a Parquet file named *.bin would be taken for a run by the next --runs merge of its directory (name it .parquet)"
        )));
    }
    let out = Location::parse(&out).map_err(|e| qcli::usage(format!("--out: {e}")))?;
    let runs = args
        .runs
        .iter()
        .map(|r| Location::parse(r).map_err(|e| qcli::usage(format!("--runs: {e}"))))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if args.part.is_some() && args.jobs > 1 {
        return Err(qcli::usage("--part and --jobs cannot be combined: run the K parts as K processes, or one merge with --jobs"));
    }
    let stall = Stall::from_env().map_err(qcli::usage)?;
    Ok(MergeConfig {
        out,
        format,
        data_dir: args.data_dir,
        runs,
        inputs: args.inputs,
        expect_shards: args.expect_shards,
        part: args.part,
        jobs: args.jobs,
        allow_unfinished: args.allow_unfinished,
        store: StoreOptions {
            deadline: Duration::from_secs(args.store_deadline_secs.max(1)),
            ..StoreOptions::default()
        },
        stall,
    })
}

fn run_merge(cfg: &MergeConfig) -> anyhow::Result<()> {
    let specs = merger::discover::find_inputs(
        &Store::new(cfg.store),
        cfg.data_dir.as_deref(),
        &cfg.runs,
        &cfg.inputs,
        cfg.allow_unfinished,
    )?;
    let jobs = usize::try_from(cfg.jobs).unwrap_or(1);
    let s3 = cfg.out.is_s3()
        || specs
            .iter()
            .any(|s| matches!(s, MergeInput::Run(l) | MergeInput::Checkpoint(l) if l.is_s3()));
    let store = Store::new(merger::runs::read_options(cfg.store, specs.len(), jobs, s3));
    // Fail on a bad --out before spending time opening inputs.
    if let Location::Dir(out) = &cfg.out {
        check_out_dir(out)?;
    }
    merger::discover::check_out(&cfg.out, cfg.data_dir.as_deref(), &cfg.runs, &specs)?;
    let mut progress = MergeProgress::new(0, cfg.stall);
    let result = open_and_merge(cfg, &store, &specs, &mut progress);
    progress.finish();
    let written = result.map_err(|e| {
        anyhow::Error::new(e).context(format!(
            "merge into {} failed; nothing written there",
            cfg.out
        ))
    })?;
    println!(
        "{}",
        written.summary("merged", &cfg.out, progress.start().elapsed())
    );
    Ok(())
}

/// `merger convert`: a merged list (or the parts of one, in order) as Parquet.
fn run_convert(files: &[String], out: &str, opts: ParquetOptions) -> anyhow::Result<()> {
    let store = Store::new(StoreOptions::default());
    let out = Location::parse(out).map_err(|e| qcli::usage(format!("--out: {e}")))?;
    let mut locations = Vec::new();
    for f in files {
        let loc = Location::parse(f).map_err(|e| qcli::usage(format!("{f}: {e}")))?;
        if loc == out || same_file(&loc, &out) {
            return Err(MergeError::BadOut {
                out: PathBuf::from(out.to_string()),
                reason: format!("it is the input {f}"),
            }
            .into());
        }
        locations.push(loc);
    }
    if has_run_suffix(&out.to_string()) {
        return Err(qcli::usage(format!(
            "--out {out}: convert writes Parquet, and a Parquet file named *.bin would be taken for a run by the next --runs merge of its directory (name it .parquet)"
        )));
    }
    if let Location::Dir(p) = &out {
        check_out_dir(p)?;
    }
    let mut progress = MergeProgress::new(0, Stall::none());
    let result = merger::convert::convert_files(&store, &locations, &out, opts, &mut progress);
    progress.finish();
    let written = result.map_err(|e| {
        anyhow::Error::new(e).context(format!(
            "converting {} into {out} failed; nothing written there",
            files.join(" ")
        ))
    })?;
    println!(
        "{}",
        written.summary("converted", &out, progress.start().elapsed())
    );
    Ok(())
}

/// Two local paths that name the same existing file.
fn same_file(a: &Location, b: &Location) -> bool {
    match (a, b) {
        (Location::Dir(a), Location::Dir(b)) => {
            matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
        }
        _ => false,
    }
}

/// `--out` must name a file in an existing directory.
fn check_out_dir(out: &std::path::Path) -> anyhow::Result<()> {
    let out_dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !out_dir.is_dir() {
        return Err(qcli::usage(format!(
            "--out {}: directory {} does not exist",
            out.display(),
            out_dir.display()
        )));
    }
    if out.is_dir() {
        return Err(qcli::usage(format!(
            "--out {} is a directory, expected a file name",
            out.display()
        )));
    }
    Ok(())
}

/// `merger follow`: the flags into a [`FollowConfig`], the metrics endpoint, the follow.
fn run_follow(args: &FollowArgs) -> anyhow::Result<()> {
    let src = Location::parse(&args.runs).map_err(|e| qcli::usage(format!("--runs: {e}")))?;
    let format = match args.format.as_str() {
        "parquet" => PartFormat::Parquet(args.parquet.options()),
        _ => PartFormat::Bin,
    };
    let cfg = FollowConfig {
        format,
        poll: Duration::from_millis(args.poll_ms),
        part_bytes: args.part_bytes,
        part_every: args.part_every,
        ..FollowConfig::new(src, args.expect_shards, args.out_dir.clone())
    };
    let opts = StoreOptions {
        deadline: Duration::from_secs(args.store_deadline_secs.max(1)),
        ..StoreOptions::default()
    };
    let s3 = cfg.src.is_s3();
    let store = Store::new(merger::runs::read_options(
        opts,
        cfg.expect_shards as usize,
        1,
        s3,
    ));
    let stats = std::sync::Arc::new(FollowStats::new(cfg.expect_shards));
    // Kept alive while the follow runs: its worker thread serves the endpoint.
    let _metrics = match &args.metrics_listen {
        Some(addr) => Some(serve_metrics(addr, std::sync::Arc::clone(&stats))?),
        None => None,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let lines = args.stdout.then_some(Lines {
        out: &mut out,
        json: args.json,
    });
    let summary = merger::follow::follow(&store, &cfg, lines, &stats)?;
    drop(out);
    let mut line = format!(
        "followed {} records into {} parts",
        summary.records, summary.parts
    );
    if let Some(dir) = &cfg.out_dir {
        line.push_str(&format!(" in {}", dir.display()));
    }
    if let Some(after) = summary.resumed_after {
        line.push_str(&format!(" (resumed after id {after})"));
    }
    line.push_str(if summary.complete {
        ": every shard finished, the list is complete"
    } else {
        ": stopped, the reader of stdout closed it"
    });
    if args.stdout {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
    Ok(())
}

/// Starts `--metrics-listen` on a runtime of its own (one worker thread); logs the bound
/// address. The endpoint stops when the runtime is dropped.
fn serve_metrics(
    addr: &str,
    stats: std::sync::Arc<FollowStats>,
) -> anyhow::Result<tokio::runtime::Runtime> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let listener = rt.block_on(qmetrics::bind(addr))?;
    let bound = listener.local_addr()?;
    tracing::info!("metrics listening on {bound}");
    let endpoints = std::sync::Arc::new(merger::follow::stats::endpoints(stats));
    rt.spawn(qmetrics::serve(
        listener,
        endpoints,
        qmetrics::Limits::default(),
    ));
    Ok(rt)
}

fn run_verify(files: &[String]) -> anyhow::Result<()> {
    println!("{}", merger::read::verify_files(files)?);
    Ok(())
}

fn run_cat(files: &[String], json: bool) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    merger::read::cat(files, json, &mut out)
}

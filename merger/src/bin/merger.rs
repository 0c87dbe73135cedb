//! `merger`: merge sublists into list.bin, verify a list.bin, print one.
//!
//! ```text
//! merger --out list.bin (--data-dir DIR | SHARD_DB...)
//! merger verify list.bin
//! merger cat list.bin [--json]
//! ```

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use merger::MergeError;
use qcli::Cause;
use sublist::listbin::{verify, ListError, ListReader};

/// Test hook for crash tests: after this many records the merge stops making progress
/// (it sleeps with its temporary file open) so a test can kill it mid-merge
/// deterministically, without racing a fast machine.
const STALL_ENV: &str = "QLIST_MERGER_TEST_STALL_AFTER";
/// Plain-log progress interval when stderr is not a terminal.
const LOG_EVERY: Duration = Duration::from_secs(5);

#[derive(Parser)]
#[command(
    name = "merger",
    about = "Merge qlist sublists into one list.bin ordered by ID; verify or print a list.bin",
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
#[command(group = clap::ArgGroup::new("input").required(true).args(["data_dir", "shard_dbs"]))]
struct MergeArgs {
    /// Output file (written to a temporary file in the same directory, then renamed).
    #[arg(long, required = true, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Merge every shard-<n> database under DIR.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Sublist databases to merge (instead of --data-dir).
    #[arg(value_name = "SHARD_DB")]
    shard_dbs: Vec<PathBuf>,
    /// Merge sublists whose producer has not finished its input (normally refused).
    #[arg(long)]
    allow_unfinished: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Check a list.bin: magic, framing, count, checksum and strict ID order.
    Verify {
        /// The file to check.
        file: PathBuf,
    },
    /// Print the records of a list.bin, one per line.
    Cat {
        /// The file to print.
        file: PathBuf,
        /// One JSON object per line: {"id","shard","seq","payload"} (or "payload_hex"
        /// instead of "payload" when the payload is not UTF-8).
        #[arg(long)]
        json: bool,
    },
}

/// What `merger --out` was asked to do.
struct MergeConfig {
    out: PathBuf,
    input: Input,
    allow_unfinished: bool,
    stall_after: Option<u64>,
}

enum Input {
    DataDir(PathBuf),
    Paths(Vec<PathBuf>),
}

fn main() -> ExitCode {
    qcli::init_logging("info");
    let cli: Cli = qcli::parse(|cmd| cmd);
    match cli.command {
        Some(Command::Verify { file }) => qcli::exit("merger", run_verify(&file), read_cause),
        Some(Command::Cat { file, json }) => qcli::exit("merger", run_cat(&file, json), read_cause),
        None => qcli::exit(
            "merger",
            config(cli.merge).and_then(|c| run_merge(&c)),
            merge_cause,
        ),
    }
}

/// `verify` and `cat`: the list.bin is their input.
fn read_cause(e: &(dyn std::error::Error + 'static)) -> Option<Cause> {
    e.is::<ListError>().then_some(Cause::Input)
}

/// The merge: the sublists are its input, list.bin its output.
fn merge_cause(e: &(dyn std::error::Error + 'static)) -> Option<Cause> {
    Some(match e.downcast_ref::<MergeError>()? {
        MergeError::BadOut { .. } => Cause::Usage,
        MergeError::List(_) => Cause::Output,
        MergeError::Duplicate { .. }
        | MergeError::OutOfOrder { .. }
        | MergeError::WrongShard { .. }
        | MergeError::Source { .. }
        | MergeError::NoShards { .. }
        | MergeError::DataDir { .. }
        | MergeError::BadShardName { .. }
        | MergeError::NeverCreated { .. }
        | MergeError::NoInputs
        | MergeError::SameShard { .. }
        | MergeError::NameMismatch { .. }
        | MergeError::Unfinished { .. }
        | MergeError::Shard(_) => Cause::Input,
    })
}

fn config(args: MergeArgs) -> anyhow::Result<MergeConfig> {
    let Some(out) = args.out else {
        return Err(qcli::usage("--out FILE is required"));
    };
    let input = match args.data_dir {
        Some(dir) => Input::DataDir(dir),
        None => Input::Paths(args.shard_dbs),
    };
    let stall_after = match std::env::var(STALL_ENV) {
        Ok(v) => Some(
            v.parse()
                .map_err(|_| qcli::usage(format!("{STALL_ENV}={v:?} is not a number")))?,
        ),
        Err(_) => None,
    };
    Ok(MergeConfig {
        out,
        input,
        allow_unfinished: args.allow_unfinished,
        stall_after,
    })
}

fn run_merge(cfg: &MergeConfig) -> anyhow::Result<()> {
    // Fail on a bad --out before spending time opening sublists.
    check_out_dir(&cfg.out)?;
    let (paths, data_dir) = match &cfg.input {
        Input::DataDir(dir) => (
            merger::find_shards_to_merge(dir, cfg.allow_unfinished)?,
            Some(dir.as_path()),
        ),
        Input::Paths(p) => (p.clone(), None),
    };
    merger::check_out_path(&cfg.out, data_dir, &paths)?;
    let shards = merger::open_shards(&paths, cfg.allow_unfinished)?;
    let total: u64 = shards.iter().map(|s| s.items).sum();
    tracing::info!(shards = shards.len(), items = total, out = %cfg.out.display(), "merging");
    let mut progress = Progress::new(total, cfg.stall_after);
    let result = merger::merge_to_file(&cfg.out, &shards, &mut |records, bytes| {
        progress.update(records, bytes)
    });
    progress.finish();
    let summary = match result {
        Ok(summary) => summary,
        // The list is in place; only its durability is in doubt, and the message says so.
        Err(e @ merger::MergeError::List(sublist::listbin::ListError::NotDurable { .. })) => {
            return Err(e.into())
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!(
                "merge into {} failed; no list.bin written",
                cfg.out.display()
            )))
        }
    };
    let secs = progress.start.elapsed().as_secs_f64();
    let mb = summary.file_bytes as f64 / 1e6;
    println!(
        "merged {} items from {} shards into {}: {:.1} MB in {:.2}s ({:.1} MB/s, {:.0} items/s)",
        summary.records,
        shards.len(),
        cfg.out.display(),
        mb,
        secs,
        mb / secs.max(1e-9),
        summary.records as f64 / secs.max(1e-9),
    );
    Ok(())
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

/// The merge's progress: a bar on a terminal, a log line every [`LOG_EVERY`] otherwise;
/// and the crash-test stall ([`STALL_ENV`]).
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: u64,
    start: Instant,
    last_log: Instant,
    stall_after: Option<u64>,
}

impl Progress {
    fn new(total: u64, stall_after: Option<u64>) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {human_pos}/{human_len} items  {elapsed} elapsed  eta {eta}  {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        let start = Instant::now();
        Progress {
            bar,
            total,
            start,
            last_log: start,
            stall_after,
        }
    }

    fn update(&mut self, records: u64, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(records);
            let mb = bytes as f64 / 1e6;
            bar.set_message(format!(
                "{mb:.0} MB written, {:.0} MB/s",
                mb / self.start.elapsed().as_secs_f64().max(1e-3)
            ));
        } else if self.last_log.elapsed() >= LOG_EVERY {
            self.last_log = Instant::now();
            let total = self.total;
            tracing::info!(records, total, mb = bytes / 1_000_000, "merging");
        }
        if self.stall_after.is_some_and(|n| records >= n) {
            tracing::warn!(records, "{STALL_ENV} set: stalling until killed");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn run_verify(file: &std::path::Path) -> anyhow::Result<()> {
    let s = verify(file).with_context(|| format!("{} is not a valid list.bin", file.display()))?;
    let ids = match (s.first_id, s.last_id) {
        (Some(a), Some(b)) => format!("ids {a}..={b}"),
        _ => "no ids".to_string(),
    };
    println!(
        "{}: OK: {} records, {} bytes, {}, strictly increasing, crc32 {:#010x}",
        file.display(),
        s.records,
        s.file_bytes,
        ids,
        s.checksum
    );
    Ok(())
}

fn run_cat(file: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let reader = ListReader::open(file)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for item in reader {
        let r = item.with_context(|| {
            format!(
                "{} is not a valid list.bin (records above were printed)",
                file.display()
            )
        })?;
        let line = if json {
            let mut obj = serde_json::json!({ "id": r.id, "shard": r.shard, "seq": r.seq });
            match std::str::from_utf8(&r.payload) {
                Ok(s) => obj["payload"] = serde_json::Value::from(s),
                Err(_) => obj["payload_hex"] = serde_json::Value::from(hex(&r.payload)),
            }
            obj.to_string()
        } else {
            format!(
                "{}\t{}\t{}\t{}",
                r.id,
                r.shard,
                r.seq,
                r.payload.escape_ascii()
            )
        };
        if let Err(e) = writeln!(out, "{line}") {
            // `merger cat | head` closes the pipe early: that is the reader's choice, not an error.
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(e).context("writing to stdout");
        }
    }
    match out.flush() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

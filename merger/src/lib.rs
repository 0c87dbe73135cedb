//! merger: combines the producers' sublists into one list.bin, in ID order.
//!
//! - [`merge`]: the k-way merge as a pure function over sorted iterators of
//!   [`qformat::Record`] (a loser tree of the inputs' heads; memory bounded by the number
//!   of inputs). It stops with an error on a duplicate ID across inputs, an input out of
//!   order, or a record carrying the wrong shard number.
//! - [`find_shards`], [`open_shards`]: finding and opening RocksDB sublists (read-only,
//!   through [`sublist::shard::ShardReader`]); [`merge_inputs`] merges them and runs into a
//!   run ([`kway::Merger`], the one merge loop). Names and formats are `qformat`'s.
//!
//! - [`command::open_and_merge`] (`merger --out`, over a [`command::MergeConfig`]) and
//!   [`convert::convert_files`] (`merger convert`) write one list through
//!   [`output::write_list`] (the format, the atomic upload, what was written), showing
//!   [`progress::MergeProgress`].
//!
//! - [`published`]: shards published as their producers go (a checkpoint, its segments
//!   chained into one input); `merger --runs SRC` merges them like runs.
//! - [`follow::follow`] (`merger follow`): the list while it grows, emitted up to the
//!   stable watermark into consecutive parts ([`follow::Parts`]) and lines, resumable from
//!   its parts; [`follow::FollowStats`] its progress and metrics.
//!
//! The `merger` binary only parses flags into these and maps errors to exit codes
//! (`merger --out`, `merger follow`, `merger convert`, `merger verify`, `merger cat`).

pub mod command;
pub mod convert;
pub mod discover;
pub mod follow;
mod inputs;
pub mod jobs;
pub mod kway;
pub mod output;
pub mod parquet_list;
pub mod progress;
pub mod published;
pub mod read;
pub mod runs;
pub mod sink;
pub mod split;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
pub mod verify;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use inputs::{merge_inputs, open_inputs, Inputs, MergeInput};
pub use jobs::merge_jobs;
pub use kway::{
    merge, Blocks, Input, Merge, Merger, RecordBlocks, SortedRecords, Stretch, READ_AHEAD_BYTES,
    READ_AHEAD_RECORDS,
};
use qformat::listbin::ListError;
use qformat::names::{data_dir_entry, is_sublist_name, shard_number, DataDirEntry};
use qformat::run::{Part, RunError};
use qstore::StoreError;
use sublist::shard::{ShardError, ShardReader};

/// What `--version` prints: the crate's version, and a warning in a build with the
/// `test-hooks` feature ([`qcli::version!`]).
pub const VERSION: &str = qcli::version!();

/// How often (in records) a merge reports progress: often enough for a smooth
/// progress bar, rare enough that the callback costs nothing next to the merge.
pub const PROGRESS_EVERY: u64 = 4096;

/// Everything that can stop a merge.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// Two inputs hold the same ID: a safety violation of the ID generator or the inputs.
    #[error("duplicate id {id}: present in both {first} and {second}")]
    Duplicate {
        /// The ID concerned.
        id: u64,
        /// The first input that holds it.
        first: String,
        /// The second input that holds it.
        second: String,
    },
    /// An input's IDs do not strictly increase.
    #[error("{input} is out of order: id {id} follows id {prev}")]
    OutOfOrder {
        /// The input, as named to the user (a path, an object, a run).
        input: String,
        /// The ID before it.
        prev: u64,
        /// The ID concerned.
        id: u64,
    },
    /// A record names another shard than the input it came from.
    #[error(
        "{input}: record id {id} says shard {found}, but this input {}",
        shard_list(expected)
    )]
    WrongShard {
        /// The input, as named to the user (a path, an object, a run).
        input: String,
        /// The shards the input holds.
        expected: Vec<u32>,
        /// The shard found.
        found: u32,
        /// The ID concerned.
        id: u64,
    },
    /// An input failed to produce its next record.
    #[error("reading {input}: {error}")]
    Read {
        /// The input, as named to the user (a path, an object, a run).
        input: String,
        /// In the message, not a `#[source]`: `{:#}` would print it twice.
        error: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The data dir holds no `shard-<n>` database.
    #[error("no sublists found: {} holds no shard-<n> directory", dir.display())]
    NoShards {
        /// The data dir.
        dir: PathBuf,
    },
    /// The data dir cannot be listed.
    #[error("cannot list data dir {}: {error}", dir.display())]
    DataDir {
        /// The data dir.
        dir: PathBuf,
        /// In the message, not a `#[source]`: `{:#}` would print it twice.
        error: std::io::Error,
    },
    /// An entry is named like a sublist but is not `shard-<number>`.
    #[error("{}: named like a sublist but not shard-<number>; move it out of the data dir or list the SHARD_DBs to merge explicitly", path.display())]
    BadShardName {
        /// The path concerned.
        path: PathBuf,
    },
    /// A producer was killed while creating its sublist: only `.creating-shard-<n>` is left.
    #[error("shard {shard} has no sublist: {} is all that is left of it (its producer was killed while creating the sublist, before writing any item); run the producer of shard {shard} again, or pass --allow-unfinished to merge without shard {shard}", path.display())]
    NeverCreated {
        /// The shard concerned.
        shard: u32,
        /// The path concerned.
        path: PathBuf,
    },
    /// `--out` would overwrite or land inside an input, or take a sublist's name.
    #[error("refusing --out {}: {reason}", out.display())]
    BadOut {
        /// The output, as given with `--out`.
        out: PathBuf,
        /// Why it is refused.
        reason: String,
    },
    /// No input was given at all.
    #[error("no sublists to merge")]
    NoInputs,
    /// Two inputs hold the same shard (the same database or run twice, or a copy).
    #[error("{first} and {second} both hold shard {shard}: inputs must hold disjoint shards")]
    SameShard {
        /// The shard concerned.
        shard: u32,
        /// The first input that holds it.
        first: String,
        /// The second input that holds it.
        second: String,
    },
    /// A run's bytes are wrong (truncated, corrupt, not a run), or a merge would write
    /// a run that breaks its rules.
    #[error("{name}: {error}")]
    Run {
        /// The input, as named to the user.
        name: String,
        /// In the message, not a `#[source]`: `{:#}` would print it twice.
        error: RunError,
    },
    /// A version 1 list.bin given as an input: it has no shard table to check it by.
    #[error("{name} is a version 1 list.bin (QLIST001): it has no shard table, so it cannot be merged again; merge its sublists or runs instead")]
    VersionOne {
        /// The input, as named to the user.
        name: String,
    },
    /// A Parquet file given where a run is read (a merge input, `verify`, `cat`, `convert`).
    #[error("{name} is a Parquet file: merger reads runs (list.bin); read Parquet with DuckDB, pyarrow or Spark, and merge, verify or print the list.bin or runs it was written from")]
    ParquetInput {
        /// The input, as named to the user.
        name: String,
    },
    /// One part of a split merge given as an input: parts are concatenated, not merged.
    #[error("{name} is {part} of a split merge: parts are read in order (merger verify, merger cat), not merged again; merge the runs they came from")]
    PartInput {
        /// The input, as named to the user.
        name: String,
        /// Which part it is.
        part: Part,
    },
    /// `--part` or `--jobs` with a RocksDB sublist: only runs have the index that
    /// split points come from.
    #[error("{} is a RocksDB sublist: --part and --jobs split runs by their index; seal it first (producer seal)", path.display())]
    SplitNeedsRuns {
        /// The path concerned.
        path: PathBuf,
    },
    /// `--runs SRC` found nothing to merge.
    #[error("no runs found: {src} holds no *.bin run and no *.checkpoint")]
    NoRuns {
        /// The source of runs given with `--runs`.
        src: String,
    },
    /// `--expect-shards N`: shards missing or incomplete.
    #[error("--expect-shards {expected}: {}", missing_shards(missing, incomplete))]
    MissingShards {
        /// The shard count given with `--expect-shards`.
        expected: u32,
        /// Shards no input holds.
        missing: Vec<u32>,
        /// Shard number and the input that holds only part of it.
        incomplete: Vec<(u32, String)>,
    },
    /// A list (or the parts of one) given to `merger verify` is not one valid list.
    #[error("{name}: {what}")]
    ListCheck {
        /// The input, as named to the user.
        name: String,
        /// What is wrong, and where.
        what: String,
    },
    /// Reading an input from its store failed (the message names the object).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Writing the output to its store failed.
    #[error("writing {out}: {error}")]
    Output {
        /// The output, as given with `--out`.
        out: String,
        /// In the message, not a `#[source]`: `{:#}` would print it twice.
        error: StoreError,
    },
    /// A directory called `shard-<n>` holds another shard's database.
    #[error("{} holds shard {found}, but its name says shard {named}", path.display())]
    NameMismatch {
        /// The path concerned.
        path: PathBuf,
        /// The shard its name says.
        named: u32,
        /// The shard found.
        found: u32,
    },
    /// The producer of this sublist has not finished its input (still running, or crashed).
    #[error("{} is not finished: its producer wrote {written} items and has not reached the end of its input (still running or crashed? run it again to resume, or pass --allow-unfinished)", path.display())]
    Unfinished {
        /// The path concerned.
        path: PathBuf,
        /// Items written so far.
        written: u64,
    },
    /// Opening or reading a sublist failed.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// Writing list.bin failed.
    #[error(transparent)]
    List(#[from] ListError),
    /// A checkpoint's bytes are not a checkpoint (torn, edited, too long), or it names
    /// another shard than its name (DESIGN.md, "The list while it grows").
    #[error("{name}: {what}")]
    BadCheckpoint {
        /// The checkpoint, as named to the user.
        name: String,
        /// What is wrong.
        what: String,
    },
    /// A published shard breaks the rules of publication: a segment that is not what its
    /// checkpoint says, a checkpoint that drops what an earlier one published.
    #[error("{name}: {what}")]
    Publication {
        /// The segment or checkpoint, as named to the user.
        name: String,
        /// What is wrong.
        what: String,
    },
    /// A shard has both a run and a checkpoint that are not the same finished shard.
    #[error("{run} and {checkpoint} both hold shard {shard}, but {why}: a run supersedes a checkpoint only once it holds the finished shard's every item (compaction); remove the stale one")]
    RunAndCheckpoint {
        /// The shard.
        shard: u32,
        /// The run.
        run: String,
        /// The checkpoint.
        checkpoint: String,
        /// How they differ.
        why: String,
    },
    /// `--part` or `--jobs` with a published shard: split points come from runs' indexes.
    #[error("{name} is a checkpoint (a shard published as it goes): --part and --jobs split runs by their index; compact the shard into a run first (docs/merger.md)")]
    SplitPublished {
        /// The checkpoint, as named to the user.
        name: String,
    },
    /// A follower's output directory holds what its parts cannot continue.
    #[error("{}: {what}", dir.display())]
    FollowDir {
        /// The `--out-dir`.
        dir: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// Encoding or writing a Parquet list failed.
    #[error("writing {out} as Parquet: {error}")]
    Parquet {
        /// The output, as given with `--out`.
        out: String,
        /// In the message, not a `#[source]`: `{:#}` would print it twice.
        error: parquet::errors::ParquetError,
    },
}

/// "is shard 3" or "holds shards 0, 1, 2".
fn shard_list(shards: &[u32]) -> String {
    match shards {
        [one] => format!("is shard {one}"),
        many => format!("holds shards {}", join(many.iter())),
    }
}

fn join<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    items.map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

/// What `--expect-shards` found wrong, in one sentence.
fn missing_shards(missing: &[u32], incomplete: &[(u32, String)]) -> String {
    let mut parts = Vec::new();
    if !missing.is_empty() {
        parts.push(format!(
            "shards missing from every input: {}",
            join(missing.iter())
        ));
    }
    if !incomplete.is_empty() {
        let list = join(incomplete.iter().map(|(s, name)| format!("{s} ({name})")));
        parts.push(format!(
            "shards present but incomplete (unfinished producer or only part of the shard): {list}"
        ));
    }
    parts.join("; ")
}

/// Finds every `shard-<n>` entry under `data_dir`, sorted by shard number.
///
/// # Errors
/// [`MergeError::DataDir`] if the directory cannot be listed, [`MergeError::BadShardName`]
/// for a `shard-*` entry whose suffix is not a number, [`MergeError::NoShards`] if none.
///
/// Leftover `.creating-shard-<n>` directories are ignored here; [`find_shards_to_merge`]
/// refuses them.
pub fn find_shards(data_dir: &Path) -> Result<Vec<PathBuf>, MergeError> {
    let (found, _) = scan_data_dir(data_dir)?;
    if found.is_empty() {
        return Err(MergeError::NoShards {
            dir: data_dir.to_path_buf(),
        });
    }
    Ok(found.into_values().collect())
}

/// [`find_shards`], and a sublist whose creation never completed (a producer killed in its
/// first milliseconds leaves only `.creating-shard-<n>`) counts as an unfinished shard: it
/// is refused unless `allow_unfinished`, since merging without it would drop the shard
/// silently. With `allow_unfinished` it is skipped with a warning (it holds no items).
///
/// # Errors
/// As [`find_shards`], and [`MergeError::NeverCreated`].
pub fn find_shards_to_merge(
    data_dir: &Path,
    allow_unfinished: bool,
) -> Result<Vec<PathBuf>, MergeError> {
    let (found, creating) = scan_data_dir(data_dir)?;
    for (shard, path) in creating {
        if found.contains_key(&shard) {
            // Another producer of the same shard completed the creation: only a leftover.
            continue;
        }
        if !allow_unfinished {
            return Err(MergeError::NeverCreated { shard, path });
        }
        tracing::warn!(shard, path = %path.display(), "merging without shard {shard}: its sublist was never created (--allow-unfinished)");
    }
    if found.is_empty() {
        return Err(MergeError::NoShards {
            dir: data_dir.to_path_buf(),
        });
    }
    Ok(found.into_values().collect())
}

/// The `shard-<n>` entries and the `.creating-shard-<n>` leftovers of a data dir.
type DataDirScan = (BTreeMap<u32, PathBuf>, Vec<(u32, PathBuf)>);

fn scan_data_dir(data_dir: &Path) -> Result<DataDirScan, MergeError> {
    let dir_err = |error| MergeError::DataDir {
        dir: data_dir.to_path_buf(),
        error,
    };
    let mut found = BTreeMap::new();
    let mut creating = Vec::new();
    for entry in std::fs::read_dir(data_dir).map_err(dir_err)? {
        let entry = entry.map_err(dir_err)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        match data_dir_entry(name) {
            Some(DataDirEntry::Creating(shard)) => creating.push((shard, entry.path())),
            Some(DataDirEntry::Shard(shard)) => {
                found.insert(shard, entry.path());
            }
            Some(DataDirEntry::BadShardName) => {
                return Err(MergeError::BadShardName { path: entry.path() });
            }
            None => {}
        }
    }
    creating.sort();
    Ok((found, creating))
}

/// Refuses an output path that would destroy an input: `out` equal to or inside any input
/// sublist (say `D/shard-0/CURRENT`), or named like a sublist (`shard-*`,
/// `.creating-shard-*`) in the data dir or in the directory of any input, where it would
/// break every later merge of that directory. Paths are compared after resolving
/// symlinks and `..` (the output's directory, the output itself if it is a symlink, and
/// every input), so another spelling of the same place is caught too.
///
/// # Errors
/// [`MergeError::BadOut`] naming the input it would hit.
pub fn check_out_path(
    out: &Path,
    data_dir: Option<&Path>,
    inputs: &[PathBuf],
) -> Result<(), MergeError> {
    let bad = |reason: String| MergeError::BadOut {
        out: out.to_path_buf(),
        reason,
    };
    let Some(name) = out.file_name() else {
        return Err(bad("it does not name a file".into()));
    };
    let parent = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir = std::fs::canonicalize(parent).map_err(|e| {
        bad(format!(
            "cannot resolve its directory {}: {e}",
            parent.display()
        ))
    })?;
    let mut targets = vec![dir.join(name)];
    // A symlink is replaced by the rename, not followed; refuse one into an input anyway.
    if let Ok(real) = std::fs::canonicalize(&targets[0]) {
        targets.push(real);
    }
    let mut guarded_dirs = Vec::new();
    if let Some(d) = data_dir.and_then(|d| std::fs::canonicalize(d).ok()) {
        guarded_dirs.push(d);
    }
    for input in inputs {
        // A missing input is reported when it is opened.
        let Ok(input) = std::fs::canonicalize(input) else {
            continue;
        };
        if let Some(target) = targets.iter().find(|t| t.starts_with(&input)) {
            let place = if *target == input { "" } else { "inside " };
            return Err(bad(format!(
                "{} is {place}the input sublist {}; writing it would destroy that sublist",
                target.display(),
                input.display()
            )));
        }
        if let Some(p) = input.parent() {
            guarded_dirs.push(p.to_path_buf());
        }
    }
    let name = name.to_string_lossy();
    if is_sublist_name(&name) {
        if let Some(d) = guarded_dirs.iter().find(|d| **d == dir) {
            return Err(bad(format!(
                "{name} is a sublist's name in the data dir {}; a file there would break every later merge of it (choose another name or directory)",
                d.display()
            )));
        }
    }
    Ok(())
}

/// An opened sublist and what its progress marker says.
pub struct OpenShard {
    /// Read-only handle.
    pub reader: ShardReader,
    /// Items the producer wrote (`next_seq` of its progress marker).
    pub items: u64,
    /// The producer finished its input (`--allow-unfinished` merges one that did not).
    pub finished: bool,
}

/// Opens every sublist read-only and checks them: each must be finished (unless
/// `allow_unfinished`), hold a distinct shard number, and, when named `shard-<n>`, hold shard n.
///
/// # Errors
/// [`MergeError::NoInputs`], [`MergeError::Shard`] (missing path, not a RocksDB sublist,
/// unreadable), [`MergeError::Unfinished`], [`MergeError::SameShard`], [`MergeError::NameMismatch`].
pub fn open_shards(
    paths: &[PathBuf],
    allow_unfinished: bool,
) -> Result<Vec<OpenShard>, MergeError> {
    if paths.is_empty() {
        return Err(MergeError::NoInputs);
    }
    let mut seen: BTreeMap<u32, PathBuf> = BTreeMap::new();
    let mut shards = Vec::with_capacity(paths.len());
    for path in paths {
        let reader = ShardReader::open(path)?;
        let shard = reader.shard();
        let named = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(shard_number);
        if let Some(named) = named {
            if named != shard {
                return Err(MergeError::NameMismatch {
                    path: path.clone(),
                    named,
                    found: shard,
                });
            }
        }
        if let Some(first) = seen.insert(shard, path.clone()) {
            return Err(MergeError::SameShard {
                shard,
                first: first.display().to_string(),
                second: path.display().to_string(),
            });
        }
        let progress = reader.progress()?;
        let written = progress.as_ref().map_or(0, |p| p.next_seq);
        let finished = progress.as_ref().is_some_and(|p| p.finished);
        if !finished {
            if !allow_unfinished {
                return Err(MergeError::Unfinished {
                    path: path.clone(),
                    written,
                });
            }
            tracing::warn!(path = %path.display(), written, "merging an unfinished sublist (--allow-unfinished)");
        }
        shards.push(OpenShard {
            reader,
            items: written,
            finished,
        });
    }
    Ok(shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `{:#}` (anyhow, the binary) prints: the message, then every source in turn.
    fn printed_chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            out = format!("{out}: {c}");
            cause = c.source();
        }
        out
    }

    /// `MergeError::Read` is checked in `kway`, `ListError`'s own variants in `listbin`.
    #[test]
    fn each_cause_is_printed_once() {
        let enospc = "No space left on device (os error 28)";
        let errors = [
            MergeError::DataDir {
                dir: PathBuf::from("/data"),
                error: std::io::Error::from_raw_os_error(28),
            },
            MergeError::Shard(ShardError::Io {
                path: PathBuf::from("/data/shard-0"),
                error: std::io::Error::from_raw_os_error(28),
            }),
            MergeError::List(ListError::Io {
                path: PathBuf::from("/out/.list.bin.x.tmp"),
                op: "write record",
                error: std::io::Error::from_raw_os_error(28),
            }),
        ];
        for e in errors {
            let printed = printed_chain(&e);
            assert_eq!(printed.matches(enospc).count(), 1, "{printed}");
        }
    }
}

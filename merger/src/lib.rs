//! merger: combines the producers' sublists into one list.bin, in ID order.
//!
//! - [`merge`]: the k-way merge as a pure function over sorted iterators of
//!   [`sublist::Record`] (a heap of one head per source; memory bounded by the number of
//!   sources). It stops with an error on a duplicate ID across sources, a source out of
//!   order, or a record carrying the wrong shard number.
//! - [`find_shards`], [`open_shards`], [`merge_to_file`]: the same merge over RocksDB
//!   sublists (opened read-only through [`sublist::shard::ShardReader`]) into a list.bin
//!   written atomically by [`sublist::listbin::ListWriter`]: on any error, no list.bin is
//!   left under the final name.
//!
//! The `merger` binary wraps these (`merger --out`, `merger verify`, `merger cat`).

mod kway;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use kway::{merge, Merge, Source, READ_AHEAD_BYTES, READ_AHEAD_RECORDS};
use sublist::listbin::{ListError, ListWriter, Summary};
use sublist::shard::{ShardError, ShardReader};

/// Sublist databases are directories named `shard-<n>` under the data dir (DESIGN.md).
pub const SHARD_PREFIX: &str = "shard-";
/// The n of a directory named exactly `shard-<n>` (canonical decimal, as the producer
/// names it: not `shard-07`, not `shard-3.bak`).
pub fn shard_number(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(SHARD_PREFIX)?;
    digits
        .parse::<u32>()
        .ok()
        .filter(|n| n.to_string() == digits)
}

/// How often (in records) [`merge_to_file`] reports progress: often enough for a smooth
/// progress bar, rare enough that the callback costs nothing next to the merge.
pub const PROGRESS_EVERY: u64 = 4096;

/// Everything that can stop a merge.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// Two sources hold the same ID: a safety violation of the ID generator or the inputs.
    #[error("duplicate id {id}: present in both {first} and {second}")]
    Duplicate {
        id: u64,
        first: String,
        second: String,
    },
    /// A source's IDs do not strictly increase.
    #[error("{source_name} is out of order: id {id} follows id {prev}")]
    OutOfOrder {
        source_name: String,
        prev: u64,
        id: u64,
    },
    /// A record names another shard than the source it came from.
    #[error(
        "{source_name}: record id {id} says shard {found}, but this source is shard {expected}"
    )]
    WrongShard {
        source_name: String,
        expected: u32,
        found: u32,
        id: u64,
    },
    /// A source failed to produce its next record.
    #[error("reading {source_name}: {error}")]
    Source {
        source_name: String,
        #[source]
        error: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The data dir holds no `shard-<n>` database.
    #[error("no sublists found: {} holds no shard-<n> directory", dir.display())]
    NoShards { dir: PathBuf },
    /// The data dir cannot be listed.
    #[error("cannot list data dir {}: {source}", dir.display())]
    DataDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An entry is named like a sublist but is not `shard-<number>`.
    #[error("{}: named like a sublist but not shard-<number>; move it out of the data dir or list the SHARD_DBs to merge explicitly", path.display())]
    BadShardName { path: PathBuf },
    /// No input was given at all.
    #[error("no sublists to merge")]
    NoInputs,
    /// Two inputs are the same shard (the same database twice, or a copy).
    #[error("{} and {} are both shard {shard}", first.display(), second.display())]
    SameShard {
        shard: u32,
        first: PathBuf,
        second: PathBuf,
    },
    /// A directory called `shard-<n>` holds another shard's database.
    #[error("{} holds shard {found}, but its name says shard {named}", path.display())]
    NameMismatch {
        path: PathBuf,
        named: u32,
        found: u32,
    },
    /// The producer of this sublist has not finished its input (still running, or crashed).
    #[error("{} is not finished: its producer wrote {written} items and has not reached the end of its input (still running or crashed? run it again to resume, or pass --allow-unfinished)", path.display())]
    Unfinished { path: PathBuf, written: u64 },
    /// Opening or reading a sublist failed.
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// Writing list.bin failed.
    #[error(transparent)]
    List(#[from] ListError),
}

/// Finds every `shard-<n>` entry under `data_dir`, sorted by shard number.
///
/// # Errors
/// [`MergeError::DataDir`] if the directory cannot be listed, [`MergeError::BadShardName`]
/// for a `shard-*` entry whose suffix is not a number, [`MergeError::NoShards`] if none.
pub fn find_shards(data_dir: &Path) -> Result<Vec<PathBuf>, MergeError> {
    let dir_err = |source| MergeError::DataDir {
        dir: data_dir.to_path_buf(),
        source,
    };
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(data_dir).map_err(dir_err)? {
        let entry = entry.map_err(dir_err)?;
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| n.starts_with(SHARD_PREFIX)) else {
            continue;
        };
        // "shard-07" or "shard-3.bak" would be a second copy of some shard.
        let Some(shard) = shard_number(name) else {
            return Err(MergeError::BadShardName { path: entry.path() });
        };
        found.insert(shard, entry.path());
    }
    if found.is_empty() {
        return Err(MergeError::NoShards {
            dir: data_dir.to_path_buf(),
        });
    }
    Ok(found.into_values().collect())
}

/// An opened sublist and what its progress marker says.
pub struct OpenShard {
    /// Read-only handle.
    pub reader: ShardReader,
    /// Items the producer wrote (`next_seq` of its progress marker).
    pub items: u64,
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
                first,
                second: path.clone(),
            });
        }
        let progress = reader.progress()?;
        let written = progress.as_ref().map_or(0, |p| p.next_seq);
        if !progress.as_ref().is_some_and(|p| p.finished) {
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
        });
    }
    Ok(shards)
}

/// Merges opened sublists into `out` (a new list.bin, replacing any old one atomically).
/// `progress(records, bytes)` is called every [`PROGRESS_EVERY`] records.
///
/// # Errors
/// Any [`MergeError`] from the merge (duplicate, order, shard number, read errors) or from
/// writing; the temporary file is removed and `out` is left as it was.
pub fn merge_to_file(
    out: &Path,
    shards: &[OpenShard],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Summary, MergeError> {
    let mut writer = ListWriter::create(out)?;
    let sources = shards
        .iter()
        .map(|s| {
            Source::new(
                s.reader.path().display().to_string(),
                s.reader.shard(),
                s.reader.iter(),
            )
        })
        .collect();
    for record in merge(sources) {
        writer.write(&record?)?;
        if writer.records() % PROGRESS_EVERY == 0 {
            progress(writer.records(), writer.bytes());
        }
    }
    let summary = writer.finish()?;
    progress(summary.records, summary.file_bytes);
    tracing::debug!(out = %out.display(), records = summary.records, "list.bin written");
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::shard_number;

    #[test]
    fn only_canonical_shard_names_have_a_number() {
        assert_eq!(shard_number("shard-0"), Some(0));
        assert_eq!(shard_number("shard-4294967295"), Some(u32::MAX));
        for bad in [
            "shard-",
            "shard-07",
            "shard-3.bak",
            "shard--1",
            "shard-+1",
            "shard-4294967296",
            "shard-a",
            "xshard-1",
            "shard-1 ",
        ] {
            assert_eq!(shard_number(bad), None, "{bad}");
        }
    }
}

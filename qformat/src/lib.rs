//! qformat: qlist's on-disk layout, one owner for every name and every byte. It links no
//! RocksDB and no object store, so everything here is tested without either.
//!
//! - [`names`]: the names of sublists (`shard-<n>`, `.creating-shard-<n>`) and runs
//!   (`shard-<n>.bin`, any `*.bin`): the only code that builds or parses them.
//! - [`shard`]: a producer's sublist's RocksDB schema (keys, values, the progress marker)
//!   as plain encode and decode functions; the `sublist` crate stores it in RocksDB.
//! - [`checkpoint`]: a shard's checkpoint while its producer publishes as it goes (its
//!   segments, count, claim, finished), a short text with a CRC.
//! - [`record`]: one item ([`Record`]) and its encoding, shared by both list.bin versions.
//! - [`listbin`]: `list.bin` version 1 (`QLIST001`): streaming reader, verifier (and the
//!   writer that tests make version 1 files with; nothing in the pipeline writes them).
//! - [`run`]: `list.bin` version 2 (`QLIST002`), a *run*: a sealed sublist, a merged list or
//!   one part of a split merge; checksummed blocks, an index, a shard table, a footer. Its
//!   writer, its checks, a local reader ([`run::RunFile`]) and a reader over ranged reads
//!   ([`run::RangedRun`], over any [`run::RangeRead`]).

pub mod checkpoint;
pub mod listbin;
pub mod names;
pub mod record;
pub mod run;
pub mod shard;

pub use record::{Record, RecordRef, MAX_PAYLOAD};

/// An error reading a local list.bin of either version ([`read_list`]).
#[derive(Debug, thiserror::Error)]
pub enum ReadListError {
    /// A version 1 list.bin is wrong.
    #[error(transparent)]
    V1(#[from] listbin::ListError),
    /// A run (version 2) is wrong.
    #[error(transparent)]
    V2(#[from] run::RunError),
}

/// A list.bin's records, streamed ([`read_list`]).
pub type ListRecords = Box<dyn Iterator<Item = Result<Record, ReadListError>>>;

/// The records of a local list.bin of either version, in order, every check made as they
/// stream (version 1: framing, order, count, CRC; version 2: metadata and each block).
///
/// # Errors
/// The file cannot be opened, or its first bytes or (version 2) metadata are bad; later
/// problems come as the iterator's items.
pub fn read_list(path: &std::path::Path) -> Result<ListRecords, ReadListError> {
    use std::io::Read;
    let mut magic = [0u8; 8];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut magic))
        .map_err(|error| run::RunError::File {
            path: path.to_path_buf(),
            op: "open",
            error,
        })?;
    if n == 8 && magic == listbin::MAGIC {
        let reader = listbin::ListReader::open(path)?;
        return Ok(Box::new(reader.map(|r| r.map_err(Into::into))));
    }
    let run = run::RunFile::open(path)?;
    Ok(Box::new(run.map(|r| r.map_err(Into::into))))
}

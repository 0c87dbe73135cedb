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
//!   layout's arithmetic, writer, checks, a local reader ([`run::RunFile`]) and a reader
//!   over ranged reads ([`run::RangedRun`], over any [`run::RangeRead`]).
//! - [`open_list`]: the one switch between the versions ([`read_list`] reads a local file
//!   of either).

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

/// A local list.bin opened by its version ([`open_list`]).
pub enum OpenedList<R> {
    /// Version 1 (`QLIST001`), streamed with every check by its reader.
    V1(listbin::ListReader<std::io::BufReader<std::fs::File>>),
    /// Anything else: a run (version 2), opened by the caller's reader.
    Run(R),
}

/// The one switch between list.bin's versions: a local file at `path` that starts with
/// version 1's magic is opened as version 1; anything else (a run, or a file that cannot
/// be read, whose reader then says why) by `open_run`, the caller's run reader (a local
/// [`run::RunFile`] for [`read_list`], ranged reads for the merger).
///
/// # Errors
/// Opening a version 1 list ([`listbin::ListReader::open`]), or `open_run`'s.
pub fn open_list<R, E: From<listbin::ListError>>(
    path: &std::path::Path,
    open_run: impl FnOnce() -> Result<R, E>,
) -> Result<OpenedList<R>, E> {
    if listbin::is_version_one(path) {
        return Ok(OpenedList::V1(listbin::ListReader::open(path)?));
    }
    open_run().map(OpenedList::Run)
}

/// A list.bin's records, streamed ([`read_list`]).
pub type ListRecords = Box<dyn Iterator<Item = Result<Record, ReadListError>>>;

/// The records of a local list.bin of either version ([`open_list`]), in order, every
/// check made as they stream (version 1: framing, order, count, CRC; version 2: metadata
/// and each block).
///
/// # Errors
/// The file cannot be opened, or its first bytes or (version 2) metadata are bad; later
/// problems come as the iterator's items.
pub fn read_list(path: &std::path::Path) -> Result<ListRecords, ReadListError> {
    let opened = open_list(path, || {
        run::RunFile::open(path).map_err(ReadListError::from)
    })?;
    Ok(match opened {
        OpenedList::V1(reader) => Box::new(reader.map(|r| r.map_err(Into::into))),
        OpenedList::Run(run) => Box::new(run.map(|r| r.map_err(Into::into))),
    })
}

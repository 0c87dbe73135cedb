//! A producer's sublist: one RocksDB database `DIR/shard-<n>` (written by the producer
//! with [`ShardWriter`], read by the merger with [`ShardReader`]). Its names and its
//! schema (keys, values, the progress marker) are `qformat`'s ([`qformat::names`],
//! [`qformat::shard`]); this module is the RocksDB side of them.
//!
//! Every batch of items is written together with the new progress marker in one
//! `WriteBatch` with `sync = true`, so after a crash the marker and the items agree: a
//! producer resumes at `next_seq` and never writes an item twice or loses one.
//!
//! A database is created under `DIR/.creating-shard-<n>` with both column families and the
//! `format` and `shard` keys (synced), then renamed to `DIR/shard-<n>`: a crash during
//! creation never leaves a half-made `shard-<n>` (the next writer completes the leftover).
//! Compression is off (no codec is built).

use qformat::names::{creating_db_path, shard_db_path};
use qformat::shard::{
    decode_item, encode_key, encode_value, ProgressMarker, FORMAT, KEY_FORMAT, KEY_PROGRESS,
    KEY_SHARD, META_CF,
};
use qformat::Record;
use rocksdb::{
    ColumnFamilyDescriptor, DBCompressionType, IteratorMode, Options, ReadOptions, WriteBatch,
    WriteOptions, DB,
};
use std::path::{Path, PathBuf};

/// Everything that can go wrong with a sublist database. Every variant names the path and
/// carries the underlying error in its message (not as a `source`, so `{:#}` does not
/// print it twice).
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// Another process (a producer) holds the database's lock.
    #[error("sublist {path}: in use by another producer (RocksDB lock held): {error}")]
    InUse {
        /// The database's path.
        path: PathBuf,
        /// RocksDB's error on opening it.
        error: rocksdb::Error,
    },

    /// The path exists but is not a sublist database (a file, a foreign directory, ...).
    #[error("{path}: not a sublist database: {reason}")]
    NotAShard {
        /// The database's path.
        path: PathBuf,
        /// What it is instead.
        reason: String,
    },

    /// The path does not exist (readers never create a database).
    #[error("{path}: no such sublist database")]
    Missing {
        /// The database's path.
        path: PathBuf,
    },

    /// The database belongs to another shard number.
    #[error("sublist {path} belongs to shard {found}, not shard {expected}")]
    WrongShard {
        /// The database's path.
        path: PathBuf,
        /// The shard asked for.
        expected: u32,
        /// The shard the database belongs to.
        found: u32,
    },

    /// A stored key or value does not follow the schema.
    #[error("sublist {path}: corrupt: {reason}")]
    Corrupt {
        /// The database's path.
        path: PathBuf,
        /// Which key or value, and what is wrong with it.
        reason: String,
    },

    /// A caller tried to write a batch that breaks the sublist's invariants.
    #[error("sublist {path}: invalid batch: {reason}")]
    InvalidBatch {
        /// The database's path.
        path: PathBuf,
        /// The invariant the batch breaks.
        reason: String,
    },

    /// RocksDB failed (I/O error, corruption detected by RocksDB, ...).
    #[error("sublist {path}: rocksdb: {error}")]
    Rocks {
        /// The database's path.
        path: PathBuf,
        /// RocksDB's error.
        error: rocksdb::Error,
    },

    /// A filesystem operation around the database failed.
    #[error("sublist {path}: {error}")]
    Io {
        /// The path the operation was on.
        path: PathBuf,
        /// The operating system's error.
        error: std::io::Error,
    },
}

/// Options for both column families: only what we use, no compression.
fn cf_options() -> Options {
    let mut o = Options::default();
    o.set_compression_type(DBCompressionType::None);
    o
}

fn rocks(path: &Path) -> impl FnOnce(rocksdb::Error) -> ShardError + '_ {
    move |error| ShardError::Rocks {
        path: path.to_path_buf(),
        error,
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ShardError + '_ {
    move |error| ShardError::Io {
        path: path.to_path_buf(),
        error,
    }
}

fn not_a_shard(path: &Path, reason: impl Into<String>) -> ShardError {
    ShardError::NotAShard {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// RocksDB reports a held lock as "IO error: While lock file: <dir>/LOCK: ...". Match
/// that, not any "lock": "block checksum mismatch" is corruption, not a busy database.
fn is_lock_error(e: &rocksdb::Error) -> bool {
    let s = e.to_string();
    s.contains("While lock file") || s.contains("/LOCK:")
}

/// Checks that `path` looks like a RocksDB with our `meta` column family, without
/// creating anything. `Ok(false)` means the path does not exist or is an empty directory.
fn inspect(path: &Path) -> Result<bool, ShardError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io(path)(e)),
    };
    if !meta.is_dir() {
        return Err(not_a_shard(path, "it is a file, not a directory"));
    }
    if !path.join("CURRENT").exists() {
        let empty = std::fs::read_dir(path).map_err(io(path))?.next().is_none();
        return if empty {
            Ok(false)
        } else {
            Err(not_a_shard(
                path,
                "a non-empty directory that is not a RocksDB database (no CURRENT file)",
            ))
        };
    }
    let cfs = DB::list_cf(&Options::default(), path)
        .map_err(|e| not_a_shard(path, format!("cannot read it as RocksDB: {e}")))?;
    if !cfs.iter().any(|c| c == META_CF) {
        return Err(not_a_shard(
            path,
            format!(
                "a RocksDB database without the `{META_CF}` column family (column families: {})",
                cfs.join(", ")
            ),
        ));
    }
    Ok(true)
}

fn check_format(path: &Path, db: &DB) -> Result<Option<u32>, ShardError> {
    let meta = db
        .cf_handle(META_CF)
        .ok_or_else(|| not_a_shard(path, "no meta column family"))?;
    let format = db.get_cf(meta, KEY_FORMAT).map_err(rocks(path))?;
    let shard = db.get_cf(meta, KEY_SHARD).map_err(rocks(path))?;
    match (format, shard) {
        (Some(f), Some(s)) => {
            if f != FORMAT {
                return Err(not_a_shard(
                    path,
                    format!(
                        "unknown format {:?}, expected {:?}",
                        String::from_utf8_lossy(&f),
                        String::from_utf8_lossy(FORMAT)
                    ),
                ));
            }
            let s: [u8; 4] = s.as_slice().try_into().map_err(|_| ShardError::Corrupt {
                path: path.to_path_buf(),
                reason: format!("shard key has {} bytes, 4 expected", s.len()),
            })?;
            Ok(Some(u32::from_le_bytes(s)))
        }
        _ => Ok(None),
    }
}

fn read_progress(path: &Path, db: &DB) -> Result<Option<ProgressMarker>, ShardError> {
    let meta = db
        .cf_handle(META_CF)
        .ok_or_else(|| not_a_shard(path, "no meta column family"))?;
    match db.get_cf(meta, KEY_PROGRESS).map_err(rocks(path))? {
        None => Ok(None),
        Some(b) => ProgressMarker::decode(&b)
            .map(Some)
            .map_err(|reason| ShardError::Corrupt {
                path: path.to_path_buf(),
                reason,
            }),
    }
}

fn descriptors() -> Vec<ColumnFamilyDescriptor> {
    vec![
        ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, cf_options()),
        ColumnFamilyDescriptor::new(META_CF, cf_options()),
    ]
}

fn open_error(path: &Path, error: rocksdb::Error) -> ShardError {
    if is_lock_error(&error) {
        ShardError::InUse {
            path: path.to_path_buf(),
            error,
        }
    } else {
        ShardError::Rocks {
            path: path.to_path_buf(),
            error,
        }
    }
}

/// Creates a sublist so that `path` never exists half-made: RocksDB creates the
/// `default` column family before `meta`, and a process killed in between would leave a
/// database that is not a sublist. So it is built under `DIR/.creating-shard-<n>` (a
/// name the merger ignores), completed with synced metadata, closed, renamed into place
/// and the directory fsynced. A leftover from a killed creation is simply completed.
fn create(data_dir: &Path, path: &Path, shard: u32) -> Result<(), ShardError> {
    let tmp = creating_db_path(data_dir, shard);
    {
        let mut opts = cf_options();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let db = DB::open_cf_descriptors(&opts, &tmp, descriptors())
            .map_err(|source| open_error(&tmp, source))?;
        let meta = db
            .cf_handle(META_CF)
            .ok_or_else(|| not_a_shard(&tmp, "no meta column family"))?;
        let mut b = WriteBatch::default();
        b.put_cf(meta, KEY_FORMAT, FORMAT);
        b.put_cf(meta, KEY_SHARD, shard.to_le_bytes());
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        db.write_opt(b, &wo).map_err(rocks(&tmp))?;
    }
    match std::fs::rename(&tmp, path) {
        Ok(()) => {}
        // Another producer of the same shard won a creation race: use its database.
        Err(_) if path.join("CURRENT").exists() => return Ok(()),
        Err(e) => return Err(io(path)(e)),
    }
    let dir = std::fs::File::open(data_dir).map_err(io(data_dir))?;
    dir.sync_all().map_err(io(data_dir))
}

/// The only writer of a sublist. RocksDB's LOCK file makes it exclusive across processes.
pub struct ShardWriter {
    db: DB,
    path: PathBuf,
    shard: u32,
    progress: Option<ProgressMarker>,
}

impl ShardWriter {
    /// Opens or creates `DIR/shard-<n>` (creating `DIR` if needed).
    ///
    /// # Errors
    /// [`ShardError::InUse`] if another process has it open; [`ShardError::WrongShard`] if
    /// it belongs to another shard number; [`ShardError::NotAShard`] if the path is a file
    /// or a directory that is not a sublist; I/O and RocksDB errors.
    pub fn open(data_dir: &Path, shard: u32) -> Result<ShardWriter, ShardError> {
        if data_dir.exists() && !data_dir.is_dir() {
            return Err(ShardError::Io {
                path: data_dir.to_path_buf(),
                error: std::io::Error::other("the data dir is not a directory"),
            });
        }
        std::fs::create_dir_all(data_dir).map_err(io(data_dir))?;
        let path = shard_db_path(data_dir, shard);
        if !inspect(&path)? {
            create(data_dir, &path, shard)?;
        }
        let opts = cf_options();
        let db = DB::open_cf_descriptors(&opts, &path, descriptors())
            .map_err(|source| open_error(&path, source))?;
        match check_format(&path, &db)? {
            Some(found) if found != shard => {
                return Err(ShardError::WrongShard {
                    path,
                    expected: shard,
                    found,
                })
            }
            Some(_) => {}
            None => return Err(not_a_shard(&path, "no shard number in its metadata")),
        }
        let progress = read_progress(&path, &db)?;
        let writer = ShardWriter {
            db,
            path,
            shard,
            progress,
        };
        if writer.progress.as_ref().is_some_and(|p| p.finished) {
            // A producer killed between the finished marker and its flush left the tail
            // in the log: flush it now (a no-op when there is nothing to flush).
            writer.flush_finished();
        }
        Ok(writer)
    }

    /// Moves a finished sublist out of the write-ahead log into table files: a reader
    /// opens a finished sublist read-only, and read-only RocksDB replays the log into
    /// memory, which made the merger's memory grow with the data. The data is already
    /// durable, so a failure here only costs a later reader memory: it is logged, not
    /// returned.
    fn flush_finished(&self) {
        let flushed = self
            .db
            .flush()
            .and_then(|()| match self.db.cf_handle(META_CF) {
                Some(meta) => self.db.flush_cf(meta),
                None => Ok(()),
            });
        if let Err(e) = flushed {
            tracing::warn!(path = %self.path.display(), error = %e, "could not flush the finished sublist; readers will replay its log");
        }
    }

    /// The shard number.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The database path `DIR/shard-<n>`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Atomically writes `records` and `progress` in one `WriteBatch` with `sync = true`.
    ///
    /// The batch must continue the sublist: records of this shard, with ascending IDs above
    /// every ID already stored and consecutive seqs starting at the stored `next_seq`;
    /// `progress.next_seq` and `progress.last_id` must describe the sublist after the batch.
    /// Nothing may be written after a finished marker.
    ///
    /// # Errors
    /// [`ShardError::InvalidBatch`] if the batch breaks those rules (nothing is written);
    /// RocksDB errors (the batch is then either wholly written or not at all).
    pub fn write_batch(
        &mut self,
        records: &[Record],
        progress: &ProgressMarker,
    ) -> Result<(), ShardError> {
        self.validate(records, progress)
            .map_err(|reason| ShardError::InvalidBatch {
                path: self.path.clone(),
                reason,
            })?;
        let meta = self
            .db
            .cf_handle(META_CF)
            .ok_or_else(|| not_a_shard(&self.path, "no meta column family"))?;
        let mut b = WriteBatch::default();
        for r in records {
            b.put(encode_key(r.id), encode_value(r.shard, r.seq, &r.payload));
        }
        b.put_cf(meta, KEY_PROGRESS, progress.encode());
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(b, &wo).map_err(rocks(&self.path))?;
        self.progress = Some(progress.clone());
        if progress.finished {
            self.flush_finished();
        }
        Ok(())
    }

    fn validate(&self, records: &[Record], progress: &ProgressMarker) -> Result<(), String> {
        let (mut seq, mut last_id) = match &self.progress {
            Some(p) if p.finished => return Err("the sublist is finished".into()),
            Some(p) => (p.next_seq, p.last_id),
            None => (0, 0),
        };
        for r in records {
            if r.shard != self.shard {
                return Err(format!(
                    "record {} has shard {}, this is shard {}",
                    r.id, r.shard, self.shard
                ));
            }
            if r.seq != seq {
                return Err(format!("record {} has seq {}, {seq} expected", r.id, r.seq));
            }
            if r.id <= last_id {
                return Err(format!(
                    "record id {} is not above the previous id {last_id}",
                    r.id
                ));
            }
            seq += 1;
            last_id = r.id;
        }
        if progress.next_seq != seq || progress.last_id != last_id {
            return Err(format!(
                "progress says next_seq {} last_id {}, the sublist would have next_seq {seq} last_id {last_id}",
                progress.next_seq, progress.last_id
            ));
        }
        Ok(())
    }

    /// The stored items in ascending ID order (the writer's own view, for a producer that
    /// checks its input against what it already wrote before resuming).
    pub fn items(&self) -> impl Iterator<Item = Result<Record, ShardError>> + '_ {
        self.items_from(0)
    }

    /// The stored items with IDs `first_id` and above, in ascending ID order: a producer
    /// publishing as it goes reads what it made durable since its last publication.
    pub fn items_from(
        &self,
        first_id: u64,
    ) -> impl Iterator<Item = Result<Record, ShardError>> + '_ {
        let mut ro = ReadOptions::default();
        ro.fill_cache(false);
        ro.set_readahead_size(SCAN_READAHEAD);
        let from = encode_key(first_id);
        self.db
            .iterator_opt(IteratorMode::From(&from, rocksdb::Direction::Forward), ro)
            .map(move |kv| {
                let (k, v) = kv.map_err(rocks(&self.path))?;
                decode_item(&k, &v).map_err(|reason| ShardError::Corrupt {
                    path: self.path.clone(),
                    reason,
                })
            })
    }

    /// The stored progress marker (`None` before the first batch).
    ///
    /// # Errors
    /// Never for now (the marker is cached); kept fallible for the schema's sake.
    pub fn progress(&self) -> Result<Option<ProgressMarker>, ShardError> {
        Ok(self.progress.clone())
    }
}

/// Read-ahead of a full scan: large enough for sequential disk reads, small enough that
/// 64 shards open at once stay within a few tens of MB.
const SCAN_READAHEAD: usize = 512 * 1024;

/// Read-only access to a sublist (used by the merger and by tests).
pub struct ShardReader {
    db: DB,
    path: PathBuf,
    shard: u32,
}

impl ShardReader {
    /// Opens `path` read-only. Works while no process writes it (RocksDB's read-only mode
    /// takes no lock and sees what was durable when it was opened).
    ///
    /// # Errors
    /// [`ShardError::Missing`] if the path does not exist; [`ShardError::NotAShard`] if it
    /// is not a RocksDB database or has no shard metadata; RocksDB errors.
    pub fn open(path: &Path) -> Result<ShardReader, ShardError> {
        if !inspect(path)? {
            return Err(if path.exists() {
                not_a_shard(path, "an empty directory")
            } else {
                ShardError::Missing {
                    path: path.to_path_buf(),
                }
            });
        }
        let db = DB::open_cf_for_read_only(
            &cf_options(),
            path,
            [rocksdb::DEFAULT_COLUMN_FAMILY_NAME, META_CF],
            false,
        )
        .map_err(rocks(path))?;
        let shard = check_format(path, &db)?
            .ok_or_else(|| not_a_shard(path, "no shard number in its metadata"))?;
        Ok(ShardReader {
            db,
            path: path.to_path_buf(),
            shard,
        })
    }

    /// The shard number stored in the database.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The database path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored progress marker (`None` if no batch was ever written).
    ///
    /// # Errors
    /// RocksDB errors, or a marker that does not parse.
    pub fn progress(&self) -> Result<Option<ProgressMarker>, ShardError> {
        read_progress(&self.path, &self.db)
    }

    /// All items in ascending ID order, streamed (RocksDB key order).
    ///
    /// Each item is checked against the schema and against this database's shard number,
    /// and the seqs against the progress marker: the writer stores seqs 0, 1, 2, ... in ID
    /// order and the marker's `next_seq` says how many, so a gap or a repeat is an item
    /// lost or stored twice, and ending early is a lost tail.
    pub fn iter(&self) -> impl Iterator<Item = Result<Record, ShardError>> + '_ {
        // One pass over every block: caching them would only grow memory with the data
        // (up to the block cache size per open shard); reading ahead makes the scan
        // sequential on disk.
        let mut ro = ReadOptions::default();
        ro.fill_cache(false);
        ro.set_readahead_size(SCAN_READAHEAD);
        let (promised, first_error) = match self.progress() {
            Ok(p) => (p.map_or(0, |p| p.next_seq), None),
            Err(e) => (0, Some(e)),
        };
        ShardIter {
            reader: self,
            items: self.db.iterator_opt(IteratorMode::Start, ro),
            promised,
            first_error,
            expected_seq: 0,
            done: false,
        }
    }

    fn corrupt(&self, reason: String) -> ShardError {
        ShardError::Corrupt {
            path: self.path.clone(),
            reason,
        }
    }
}

/// [`ShardReader::iter`]: the items, then one error if fewer came than the marker says.
struct ShardIter<'a> {
    reader: &'a ShardReader,
    items: rocksdb::DBIteratorWithThreadMode<'a, DB>,
    /// The marker's `next_seq`.
    promised: u64,
    /// Reading the marker failed: this is the first (and last) item.
    first_error: Option<ShardError>,
    expected_seq: u64,
    done: bool,
}

impl Iterator for ShardIter<'_> {
    type Item = Result<Record, ShardError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if let Some(e) = self.first_error.take() {
            self.done = true;
            return Some(Err(e));
        }
        let promised = self.promised;
        let item = match self.items.next() {
            Some(kv) => kv.map_err(rocks(&self.reader.path)).and_then(|(k, v)| self.check(&k, &v, promised)),
            None if self.expected_seq < promised => Err(self.reader.corrupt(format!(
                "{} items, the progress marker says {promised}: the items with seq {}.. are missing",
                self.expected_seq, self.expected_seq
            ))),
            None => {
                self.done = true;
                return None;
            }
        };
        if item.is_err() {
            self.done = true;
        }
        Some(item)
    }
}

impl ShardIter<'_> {
    fn check(&mut self, key: &[u8], value: &[u8], promised: u64) -> Result<Record, ShardError> {
        let r = decode_item(key, value).map_err(|reason| self.reader.corrupt(reason))?;
        if r.shard != self.reader.shard {
            return Err(self.reader.corrupt(format!(
                "item {} says shard {}, the database is shard {}",
                r.id, r.shard, self.reader.shard
            )));
        }
        if r.seq != self.expected_seq {
            return Err(self.reader.corrupt(format!(
                "item {} has seq {}, {} expected (an item is missing or stored twice)",
                r.id, r.seq, self.expected_seq
            )));
        }
        if r.seq >= promised {
            return Err(self.reader.corrupt(format!(
                "item {} has seq {}, beyond the progress marker's {promised} items",
                r.id, r.seq
            )));
        }
        self.expected_seq += 1;
        Ok(r)
    }
}

#[cfg(test)]
mod tests;

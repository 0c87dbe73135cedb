//! Sealing: a finished sublist leaves its machine as a *run* (list.bin version 2,
//! [`qformat::run`]), `DEST/shard-<n>.bin` in a directory or under an S3 prefix.
//!
//! [`seal`] reads the sublist read-only ([`ShardReader`], the way the merger reads it),
//! streams its items in ID order into a [`RunWriter`] over a [`qstore::Upload`], and
//! finishes the upload, which makes the run appear atomically (a directory: temporary file,
//! fsync, rename; S3: a completed multipart upload). Nothing else is ever visible under
//! the run's name: an error or a kill leaves no `shard-<n>.bin`, at most a hidden temporary
//! file or an incomplete multipart upload that the store discards.
//!
//! Sealing is deterministic (the same sublist gives the same bytes), so sealing again is
//! harmless and a seal that was killed is resumed by sealing again.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use qformat::names::{run_name, shard_db_path};
use qformat::run::{Part, RunError, RunWriter, ShardSpec};
use qstore::{Location, Store, StoreError, Upload};
use sublist::shard::{ShardError, ShardReader};

/// Everything that can stop a seal. Each message names the sublist or the destination it
/// is about; [`SealError::exit_code`] maps it to the binaries' exit codes.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The sublist cannot be opened or read (missing, not a sublist, corrupt, I/O). The
    /// cause is in the message, not a `source`, so `{:#}` prints it once.
    #[error("cannot seal: {0}")]
    Sublist(ShardError),

    /// The sublist's producer has not reached the end of its input.
    #[error("cannot seal sublist {}: its producer has not finished its input ({items} items so far); run the producer again with the same arguments to resume and finish it, then seal", path.display())]
    Unfinished {
        /// The sublist.
        path: PathBuf,
        /// Items it holds so far.
        items: u64,
    },

    /// The sublist holds shard `found`, not the shard asked for.
    #[error("cannot seal sublist {}: it holds shard {found}, not shard {expected}", path.display())]
    WrongShard {
        /// The sublist.
        path: PathBuf,
        /// The shard asked for.
        expected: u32,
        /// The shard the sublist holds.
        found: u32,
    },

    /// The sublist's items break a run's rules (order, seqs, count): a corrupt sublist.
    #[error("cannot seal sublist {}: {error}", path.display())]
    BadItems {
        /// The sublist.
        path: PathBuf,
        /// The rule broken, and where.
        error: RunError,
    },

    /// The run cannot be written at its destination (missing directory, refused, I/O);
    /// the store's error names the destination.
    #[error("sealing sublist {}: {error}", path.display())]
    Store {
        /// The sublist.
        path: PathBuf,
        /// The store's error, naming the destination.
        error: Box<StoreError>,
    },

    /// Writing the run's bytes failed.
    #[error("sealing sublist {} into {dest}: writing failed: {error}", path.display())]
    Write {
        /// The sublist.
        path: PathBuf,
        /// The run's destination, as the user named it.
        dest: String,
        /// What the write returned.
        error: std::io::Error,
    },
}

impl From<ShardError> for SealError {
    fn from(e: ShardError) -> Self {
        SealError::Sublist(e)
    }
}

impl SealError {
    /// Exit code: 3 (input) for the sublist's faults, 4 (output) for the destination's.
    pub fn exit_code(&self) -> u8 {
        match self {
            SealError::Sublist(_)
            | SealError::Unfinished { .. }
            | SealError::WrongShard { .. }
            | SealError::BadItems { .. } => 3,
            SealError::Store { error, .. } if matches!(**error, StoreError::BadLocation { .. }) => {
                2
            }
            SealError::Store { .. } | SealError::Write { .. } => 4,
        }
    }
}

/// What a seal did.
#[derive(Debug, Clone, PartialEq)]
pub struct SealSummary {
    /// The shard sealed.
    pub shard: u32,
    /// Items in the run.
    pub records: u64,
    /// Bytes of the run.
    pub bytes: u64,
    /// Where the run is.
    pub run: Location,
    /// How long the seal took.
    pub elapsed: Duration,
}

impl fmt::Display for SealSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sealed shard {}: {} items, {:.1} MB into {} in {:.1}s",
            self.shard,
            self.records,
            self.bytes as f64 / 1e6,
            self.run,
            self.elapsed.as_secs_f64()
        )
    }
}

/// Seals the finished sublist `data_dir/shard-<shard>` into `dest/shard-<shard>.bin`.
/// `progress` is called after each item with the items and bytes written so far.
///
/// The sublist is opened read-only, so sealing works while a producer holds it; only a
/// finished sublist is sealed, and a finished sublist never changes again.
///
/// # Errors
/// [`SealError::Sublist`] (missing, not a sublist, corrupt), [`SealError::Unfinished`],
/// [`SealError::WrongShard`], [`SealError::BadItems`] for the sublist;
/// [`SealError::Store`] and [`SealError::Write`] for the destination. On any error the
/// run does not appear at `dest`.
pub fn seal(
    data_dir: &Path,
    shard: u32,
    store: &Store,
    dest: &Location,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SealSummary, SealError> {
    let start = Instant::now();
    let reader = open_finished(data_dir, shard)?;
    let path = reader.path().to_path_buf();
    let total = reader.progress()?.map_or(0, |p| p.next_seq);
    let run = dest.join(&run_name(shard));
    let store_err = |error: StoreError| SealError::Store {
        path: path.clone(),
        error: Box::new(error),
    };
    let upload = store.create(&run).map_err(store_err)?;
    let spec = ShardSpec {
        shard,
        finished: true,
        total,
    };
    let written = write_run(&reader, upload, spec, &run, progress)?;
    let bytes = written.finish().map_err(store_err)?;
    tracing::debug!(shard, records = total, bytes, run = %run, "sealed");
    Ok(SealSummary {
        shard,
        records: total,
        bytes,
        run,
        elapsed: start.elapsed(),
    })
}

/// Opens `data_dir/shard-<shard>` read-only and checks it is shard `shard`'s, finished.
fn open_finished(data_dir: &Path, shard: u32) -> Result<ShardReader, SealError> {
    let path = shard_db_path(data_dir, shard);
    let reader = ShardReader::open(&path)?;
    if reader.shard() != shard {
        return Err(SealError::WrongShard {
            path,
            expected: shard,
            found: reader.shard(),
        });
    }
    match reader.progress()? {
        Some(p) if p.finished => Ok(reader),
        p => Err(SealError::Unfinished {
            path,
            items: p.map_or(0, |p| p.next_seq),
        }),
    }
}

/// Streams the sublist's items into a run over `upload`; returns the upload, every byte
/// written to it, ready to be finished.
fn write_run(
    reader: &ShardReader,
    upload: Upload,
    spec: ShardSpec,
    run: &Location,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Upload, SealError> {
    let path = reader.path();
    let run_err = |error: RunError| match error {
        RunError::Io(error) => SealError::Write {
            path: path.to_path_buf(),
            dest: run.to_string(),
            error,
        },
        error => SealError::BadItems {
            path: path.to_path_buf(),
            error,
        },
    };
    // On any error below, dropping the writer drops the upload, which discards it.
    let mut writer = RunWriter::new(upload, vec![spec], Part::WHOLE).map_err(run_err)?;
    for item in reader.iter() {
        writer.write(&item?).map_err(run_err)?;
        progress(writer.records(), writer.bytes());
    }
    let (upload, meta) = writer.finish().map_err(run_err)?;
    debug_assert_eq!(meta.records(), spec.total);
    Ok(upload)
}

//! A follower's output: consecutive parts `DIR/part-<i>.bin` (or `.parquet`), each a list
//! whose range is the IDs it covers, written atomically (temporary file, fsync, rename)
//! and cut by size and time; and where a follower resumes, read back from the last one
//! (docs/list-format.md, "Parts of a follow").

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use qformat::names::{follow_part_index, follow_part_name, is_follow_part_temp};
use qformat::run::{Part, RunMeta, RunWriter, ShardEntry, ShardSpec};
use qstore::{Location, Store, Upload};

use crate::parquet_list::{read_list_meta, ParquetOptions, ParquetWriter};
use crate::sink::{ListSink, RunSink};
use crate::MergeError;

/// What a follower writes its parts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartFormat {
    /// list.bin version 2 (`part-<i>.bin`): `merger verify` and `merger cat` read them.
    Bin,
    /// Parquet (`part-<i>.parquet`): a directory DuckDB, pyarrow, Polars and Spark read as
    /// one dataset.
    Parquet(ParquetOptions),
}

impl PartFormat {
    /// The parts' file extension.
    pub fn ext(&self) -> &'static str {
        match self {
            PartFormat::Bin => "bin",
            PartFormat::Parquet(_) => "parquet",
        }
    }
}

/// Where the parts in a directory end: what a follower resumes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// The number of the next part.
    pub next_index: u32,
    /// The last ID the parts cover (`u64::MAX`: the follow is complete).
    pub last_id: u64,
    /// Per shard (0..K): its items in the parts, so the seq its next item carries.
    pub next_seq: Vec<u64>,
}

/// The part being written.
struct OpenPart {
    sink: Sink,
    opened: Instant,
    /// Per shard: its records in this part.
    counts: Vec<u64>,
    path: PathBuf,
}

/// A part's writer, in its format.
enum Sink {
    Bin(Box<RunSink<Upload>>),
    Parquet(Box<ParquetWriter<Upload>>),
}

impl Sink {
    fn list(&mut self) -> &mut dyn ListSink {
        match self {
            Sink::Bin(s) => s.as_mut(),
            Sink::Parquet(p) => p.as_mut(),
        }
    }

    fn last_id(&self) -> Option<u64> {
        match self {
            Sink::Bin(s) => s.writer.last_id(),
            Sink::Parquet(p) => p.last_id(),
        }
    }

    fn restate(&mut self, part: Part, specs: Vec<ShardSpec>) -> Result<(), MergeError> {
        match self {
            Sink::Bin(s) => s
                .writer
                .restate(part, specs)
                .map_err(|error| MergeError::Run {
                    name: s.name.clone(),
                    error,
                }),
            Sink::Parquet(p) => p.restate(part, specs),
        }
    }

    /// Writes the footer; returns the upload to finish and the shard table written.
    fn finish(self) -> Result<(Upload, Vec<ShardEntry>), MergeError> {
        match self {
            Sink::Bin(s) => {
                let RunSink { writer, name } = *s;
                let (upload, meta) = writer
                    .finish()
                    .map_err(|error| MergeError::Run { name, error })?;
                Ok((upload, meta.shards))
            }
            Sink::Parquet(p) => {
                let (upload, summary) = p.finish()?;
                Ok((upload, summary.shards))
            }
        }
    }
}

/// The parts of one follow in a directory: the one open, and where the next begins.
pub struct Parts {
    dir: PathBuf,
    format: PartFormat,
    store: Store,
    shards: u32,
    part_bytes: u64,
    part_every: Duration,
    next_index: u32,
    /// The first ID of the open (or next) part; `None` once a part ended at `u64::MAX`.
    first_id: Option<u64>,
    open: Option<OpenPart>,
    /// Parts written by this follower.
    written: u64,
}

impl Parts {
    /// The parts of a follow of `shards` shards in `dir` (created if missing), in
    /// `format`: removes what a killed follower left half-written, and finds where the
    /// parts there end (`None`: there are none).
    ///
    /// # Errors
    /// [`MergeError::FollowDir`] for a directory that cannot be listed or that holds parts
    /// a follow of these shards cannot continue (a gap in the numbers, parts of the other
    /// format, a last part of other shards), and the errors of reading the last part.
    pub fn open(
        dir: &Path,
        format: PartFormat,
        shards: u32,
        part_bytes: u64,
        part_every: Duration,
    ) -> Result<(Parts, Option<ResumePoint>), MergeError> {
        let resume = scan(dir, format, shards)?;
        let parts = Parts {
            dir: dir.to_path_buf(),
            format,
            store: Store::new(qstore::StoreOptions::default()),
            shards,
            part_bytes: part_bytes.max(1),
            part_every,
            next_index: resume.as_ref().map_or(0, |r| r.next_index),
            first_id: match &resume {
                None => Some(0),
                Some(r) => r.last_id.checked_add(1),
            },
            open: None,
            written: 0,
        };
        Ok((parts, resume))
    }

    /// Parts written by this follower so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Whether a part ended at `u64::MAX`: the follow is complete.
    pub fn complete(&self) -> bool {
        self.first_id.is_none()
    }

    /// Appends a merge's stretch of `records` records of `shard` to the open part (opening
    /// one if none is).
    ///
    /// # Errors
    /// Creating the part's file, and every error of the sink (a record that breaks the
    /// rules, a write error).
    pub fn write(&mut self, bytes: &[u8], shard: u32, records: u64) -> Result<(), MergeError> {
        if self.open.is_none() {
            self.open = Some(self.create()?);
        }
        let Some(open) = self.open.as_mut() else {
            return Ok(());
        };
        open.sink.list().write_encoded(bytes)?;
        open.counts[shard as usize] += records;
        Ok(())
    }

    /// Whether the open part has reached its size: then [`Parts::close`] it at its last ID.
    pub fn full(&mut self) -> Option<u64> {
        let open = self.open.as_mut()?;
        let bytes = open.sink.list().bytes();
        (bytes >= self.part_bytes)
            .then(|| open.sink.last_id())
            .flatten()
    }

    /// Whether the open part has been open for its time ([`Parts::close`] it at the
    /// watermark), and if not, how long until it has (`None`: no part is open).
    pub fn due(&self, now: Instant) -> Option<Duration> {
        let open = self.open.as_ref()?;
        Some(
            (open.opened + self.part_every)
                .checked_duration_since(now)
                .unwrap_or_default(),
        )
    }

    /// Closes the open part at `last_id` (writing an empty one if none is open: the last
    /// part of a finished follow): its range is `first_id..=last_id`, its shard table each
    /// shard's items in it and, as totals, `next_seq` (its items in this part and all
    /// before); a shard is finished there when `final_count` says it finished with that
    /// many items. The part is complete on disk (renamed into place, fsynced) on return.
    ///
    /// # Errors
    /// Every error of the sink and the upload; a table that differs from what was written.
    pub fn close(
        &mut self,
        last_id: u64,
        next_seq: &[u64],
        final_count: &[Option<u64>],
    ) -> Result<(), MergeError> {
        let Some(first_id) = self.first_id else {
            return Ok(());
        };
        let mut open = match self.open.take() {
            Some(o) => o,
            None => self.create()?,
        };
        let specs = (0..self.shards)
            .map(|s| ShardSpec {
                shard: s,
                finished: final_count[s as usize] == Some(next_seq[s as usize]),
                total: next_seq[s as usize],
            })
            .collect();
        let part = Part::follow(self.next_index, first_id, last_id);
        open.sink.restate(part, specs)?;
        let (upload, table) = open.sink.finish()?;
        let name = open.path.display().to_string();
        for (s, entry) in table.iter().enumerate() {
            let count = open.counts[s];
            let first = next_seq[s] - count;
            if entry.count != count || (count > 0 && entry.first_seq != first) {
                return Err(MergeError::ListCheck {
                    name,
                    what: format!(
                        "shard {s}: {} items from seq {} written, {count} from seq {first} merged",
                        entry.count, entry.first_seq
                    ),
                });
            }
        }
        let bytes = upload.finish().map_err(|error| MergeError::Output {
            out: name.clone(),
            error,
        })?;
        let records: u64 = open.counts.iter().sum();
        tracing::info!(part = %name, first_id, last_id, records, bytes, "part written");
        self.written += 1;
        self.next_index += 1;
        self.first_id = last_id.checked_add(1);
        Ok(())
    }

    /// A new part's file and writer: every shard expected, ID range and totals unknown
    /// until it closes.
    fn create(&mut self) -> Result<OpenPart, MergeError> {
        let Some(first_id) = self.first_id else {
            return Err(MergeError::FollowDir {
                dir: self.dir.clone(),
                what: "a record above the part that ends at the last id".into(),
            });
        };
        let path = self.dir.join(follow_part_name(
            u64::from(self.next_index),
            self.format.ext(),
        ));
        let name = path.display().to_string();
        let upload = self
            .store
            .create(&Location::Dir(path.clone()))
            .map_err(|error| MergeError::Output {
                out: name.clone(),
                error,
            })?;
        let specs: Vec<ShardSpec> = (0..self.shards)
            .map(|shard| ShardSpec {
                shard,
                finished: false,
                total: u64::MAX,
            })
            .collect();
        let part = Part::follow(self.next_index, first_id, u64::MAX);
        let sink = match self.format {
            PartFormat::Bin => {
                let writer =
                    RunWriter::new(upload, specs, part).map_err(|error| MergeError::Run {
                        name: name.clone(),
                        error,
                    })?;
                Sink::Bin(Box::new(RunSink { writer, name }))
            }
            PartFormat::Parquet(opts) => Sink::Parquet(Box::new(ParquetWriter::new(
                upload, specs, part, &opts, &name,
            )?)),
        };
        Ok(OpenPart {
            sink,
            opened: Instant::now(),
            counts: vec![0; self.shards as usize],
            path,
        })
    }
}

/// Lists `dir`: removes half-written parts, checks the parts are numbered 0..n with none
/// of the other format, and reads the last one's range and shard table.
fn scan(dir: &Path, format: PartFormat, shards: u32) -> Result<Option<ResumePoint>, MergeError> {
    let bad = |what: String| MergeError::FollowDir {
        dir: dir.to_path_buf(),
        what,
    };
    std::fs::create_dir_all(dir).map_err(|e| bad(format!("create: {e}")))?;
    let other = match format {
        PartFormat::Bin => "parquet",
        PartFormat::Parquet(_) => "bin",
    };
    let mut indexes = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| bad(format!("list: {e}")))? {
        let entry = entry.map_err(|e| bad(format!("list: {e}")))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if is_follow_part_temp(name) {
            // What a follower killed while writing a part left: never a complete part.
            tracing::info!(file = %entry.path().display(), "removing a half-written part");
            std::fs::remove_file(entry.path()).map_err(|e| bad(format!("remove {name}: {e}")))?;
        } else if follow_part_index(name, other).is_some() {
            return Err(bad(format!(
                "holds {name}, a part of a follow written as {other}; follow into another directory"
            )));
        } else if let Some(i) = follow_part_index(name, format.ext()) {
            indexes.push(i);
        }
    }
    indexes.sort_unstable();
    if let Some((at, i)) = indexes.iter().enumerate().find(|&(at, &i)| at as u64 != i) {
        return Err(bad(format!(
            "holds {} but not {}: a part is missing (the parts of a follow are numbered from 0 without a gap)",
            follow_part_name(*i, format.ext()),
            follow_part_name(at as u64, format.ext())
        )));
    }
    let Some(&last) = indexes.last() else {
        return Ok(None);
    };
    let path = dir.join(follow_part_name(last, format.ext()));
    let (part, table) = match format {
        PartFormat::Bin => {
            let meta = read_run_meta(&path)?;
            (meta.part(), meta.shards)
        }
        PartFormat::Parquet(_) => read_list_meta(&path)?,
    };
    let name = path.display();
    if !part.is_follow() || u64::from(part.index) != last {
        return Err(bad(format!(
            "{name} is {part}, not follow part {last}: not the output of a follow"
        )));
    }
    let same_shards =
        table.len() == shards as usize && table.iter().zip(0..shards).all(|(e, s)| e.shard == s);
    if !same_shards {
        return Err(bad(format!(
            "{name} lists shards {:?}, this follow expects 0..{shards}: the parts of another follow",
            table.iter().map(|e| e.shard).collect::<Vec<_>>()
        )));
    }
    let next_index = part
        .index
        .checked_add(1)
        .ok_or_else(|| bad("no part number is left".into()))?;
    Ok(Some(ResumePoint {
        next_index,
        last_id: part.last_id,
        next_seq: table.iter().map(|e| e.total).collect(),
    }))
}

/// A local run's metadata (its tail only).
fn read_run_meta(path: &Path) -> Result<RunMeta, MergeError> {
    let run = qformat::run::RunFile::open(path).map_err(|error| MergeError::Run {
        name: path.display().to_string(),
        error,
    })?;
    Ok(run.meta)
}

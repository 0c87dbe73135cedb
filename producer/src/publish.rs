//! Publishing as it goes (DESIGN.md, "The list while it grows"): every
//! [`Publish::every`], between two batches, the items made durable since the last
//! publication become one *segment* (a run holding seqs `a..b` of the shard,
//! `DEST/segments/shard-<n>/<a>-<b>.seg`), then the shard's *checkpoint*
//! (`DEST/shard-<n>.checkpoint`) is replaced: its segments, its count, its *claim* and
//! whether it is finished. Names and bytes are qformat's ([`qformat::names`],
//! [`qformat::checkpoint`]).
//!
//! The order is the contract: the segment's upload has finished before the checkpoint
//! that names it is written, and a reader takes segments from the checkpoint only. A
//! producer killed between the two leaves an *orphan* segment that no checkpoint names;
//! the restarted producer removes it when it opens (`Publisher::open`) and publishes the
//! same seqs again (sealing is deterministic).
//!
//! The claim is taken by the stamper (`Stamper::publish` in the crate root) at a moment
//! when no ID request is in flight and every stamped item is durable: the largest ID the
//! generator returned, or one fresh ID when nothing was stamped since the last checkpoint,
//! and never less than the last checkpoint's claim.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use qformat::checkpoint::{Checkpoint, CheckpointError, SegmentRef, MAX_CHECKPOINT_BYTES};
use qformat::names::{checkpoint_name, segment_name, segment_range, segments_dir_name};
use qformat::run::{RunError, RunWriter};
use qstore::{Location, Store, StoreError};
use sublist::shard::{ShardError, ShardWriter};

use crate::ProducerMetrics;

/// What to publish where, and how often: `--seal-to DEST --publish-every SECS`, or
/// [`crate::AppendConfig::publish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    /// The destination: a local directory that exists, or `s3://bucket/prefix`
    /// (credentials from the `AWS_*` variables, as for sealing).
    pub dest: Location,
    /// How often what became durable is published. Above zero.
    pub every: Duration,
}

impl Publish {
    /// Publishing into `dest` (a local directory or `s3://bucket/prefix`) every `every`.
    ///
    /// # Errors
    /// [`PublishError::Config`]: `dest` is not a destination, or `every` is zero.
    pub fn new(dest: &str, every: Duration) -> Result<Publish, PublishError> {
        let dest = Location::parse(dest).map_err(|e| PublishError::Config(e.to_string()))?;
        if every.is_zero() {
            return Err(PublishError::Config(
                "the publication interval must be above zero".into(),
            ));
        }
        Ok(Publish { dest, every })
    }
}

/// Everything that can stop a publication. Each names the shard and the object it is
/// about; [`PublishError::exit_code`] maps it to the binaries' exit codes.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The publication's settings make no sense (a bad destination, a zero interval).
    #[error("invalid publication settings: {0}")]
    Config(String),

    /// The destination's checkpoint of this shard cannot be decoded: it is never taken
    /// for an empty one (that would publish the shard's items a second time).
    #[error("publishing shard {shard}: {checkpoint} is not a valid checkpoint ({error}); it is not taken for an empty one: restore it, or remove it and the segments under {segments} to publish the shard again from its first item")]
    BadCheckpoint {
        /// The shard.
        shard: u32,
        /// The checkpoint's location.
        checkpoint: String,
        /// Its segments' directory or prefix.
        segments: String,
        /// What is wrong with its bytes.
        error: CheckpointError,
    },

    /// The destination's checkpoint cannot be this sublist's: another shard's, or more
    /// items than the sublist holds, or finished while the sublist is not.
    #[error("publishing shard {shard}: {checkpoint} is not this sublist's ({reason}): another producer publishes there; use another destination")]
    Foreign {
        /// The shard.
        shard: u32,
        /// The checkpoint's location.
        checkpoint: String,
        /// Why it cannot be this sublist's.
        reason: String,
    },

    /// The destination refused or failed (missing directory, denied, I/O, S3); the
    /// store's error names the object.
    #[error("publishing shard {shard}: {error}")]
    Store {
        /// The shard.
        shard: u32,
        /// The store's error.
        error: Box<StoreError>,
    },

    /// Reading the sublist's durable items failed.
    #[error("publishing shard {shard}: {error}")]
    Sublist {
        /// The shard.
        shard: u32,
        /// The sublist's error.
        error: ShardError,
    },

    /// Writing a segment failed (I/O), or the sublist's items break a run's rules.
    #[error("publishing shard {shard}: segment {segment}: {error}")]
    Segment {
        /// The shard.
        shard: u32,
        /// The segment's location.
        segment: String,
        /// What went wrong.
        error: RunError,
    },
}

impl PublishError {
    /// Exit code: 2 bad settings, 3 a checkpoint that is bad or not this sublist's (and
    /// items that break a run's rules), 4 the destination or the sublist failing.
    pub fn exit_code(&self) -> u8 {
        match self {
            PublishError::Config(_) => 2,
            PublishError::Store { error, .. }
                if matches!(**error, StoreError::BadLocation { .. }) =>
            {
                2
            }
            PublishError::BadCheckpoint { .. } | PublishError::Foreign { .. } => 3,
            PublishError::Segment {
                error: RunError::Io(_),
                ..
            } => 4,
            PublishError::Segment { .. } => 3,
            PublishError::Store { .. } | PublishError::Sublist { .. } => 4,
        }
    }
}

/// A shard's publisher: the last checkpoint written (or found at open), and where the
/// next goes. Its calls block (the store's); the stamper runs them on the blocking pool.
pub(crate) struct Publisher {
    store: Store,
    dest: Location,
    shard: u32,
    every: Duration,
    /// The last checkpoint written, or read when opened.
    pub(crate) last: Checkpoint,
    /// Items published when opened (the metrics count this run's).
    opened_count: u64,
    /// When the next publication is due.
    due: Instant,
    /// The segments' directory exists (made once, for a directory destination).
    dirs_made: bool,
    metrics: Option<Arc<ProducerMetrics>>,
    /// Segments and checkpoints written by this process (the test hooks count them).
    written: (u64, u64),
}

impl Publisher {
    /// Reads `publish.dest`'s checkpoint of `shard` (none: nothing published yet), checks
    /// it can be this sublist's (`durable` items, `finished` or not), and removes the
    /// shard's orphan segments (those it does not name: a producer killed between a
    /// segment and its checkpoint). Blocks.
    ///
    /// # Errors
    /// [`PublishError::BadCheckpoint`], [`PublishError::Foreign`], [`PublishError::Store`].
    pub(crate) fn open(
        publish: &Publish,
        store: Store,
        shard: u32,
        durable: u64,
        finished: bool,
    ) -> Result<Publisher, PublishError> {
        let mut p = Publisher {
            store,
            dest: publish.dest.clone(),
            shard,
            every: publish.every,
            last: Checkpoint::empty(shard),
            opened_count: 0,
            due: Instant::now() + publish.every,
            dirs_made: false,
            metrics: None,
            written: (0, 0),
        };
        if let Some(found) = p.read_checkpoint()? {
            p.check_ours(&found, durable, finished)?;
            p.last = found;
        }
        p.opened_count = p.last.count;
        p.remove_orphans()?;
        if p.last.count > 0 || p.last.finished {
            tracing::info!(
                shard,
                published = p.last.count,
                claim = p.last.claim,
                finished = p.last.finished,
                "found the shard's checkpoint"
            );
        }
        Ok(p)
    }

    /// The same publisher, counting into `metrics`.
    pub(crate) fn set_metrics(&mut self, metrics: Option<Arc<ProducerMetrics>>) {
        if let Some(m) = &metrics {
            m.claimed(self.last.claim);
        }
        self.metrics = metrics;
    }

    /// A publication is due: its interval has passed since the last one.
    pub(crate) fn due(&self) -> bool {
        Instant::now() >= self.due
    }

    /// For a summary: items published, finished, where.
    pub(crate) fn summary(&self) -> (u64, bool, Location) {
        (self.last.count, self.last.finished, self.dest.clone())
    }

    /// Publishes the sublist's items `last.count..durable` as one segment (none if there
    /// are none), then the checkpoint with `claim` (`finished`: the shard is finished and
    /// claims `u64::MAX`). `writer` must be idle: every item below `durable` is durable.
    /// Blocks.
    ///
    /// # Errors
    /// Reading the sublist, writing the segment or the checkpoint; the checkpoint is then
    /// the one before (a segment already written is an orphan the next open removes).
    pub(crate) fn publish(
        &mut self,
        writer: &ShardWriter,
        durable: u64,
        claim: u64,
        finished: bool,
    ) -> Result<(), PublishError> {
        let start = Instant::now();
        debug_assert!(durable >= self.last.count, "durable items went backwards");
        debug_assert!(finished || claim > self.last.claim, "the claim must grow");
        let mut next = self.last.clone();
        if durable > self.last.count {
            let seg = self.write_segment(writer, durable)?;
            next.segments.push(seg);
            next.count = durable;
        }
        next.claim = if finished { u64::MAX } else { claim };
        next.finished = finished;
        self.write_checkpoint(&next)?;
        if let Some(m) = &self.metrics {
            m.published(next.count - self.opened_count, next.claim, start.elapsed());
        }
        self.last = next;
        self.due = Instant::now() + self.every;
        Ok(())
    }

    fn checkpoint_loc(&self) -> Location {
        self.dest.join(&checkpoint_name(self.shard))
    }

    fn segments_loc(&self) -> Location {
        self.dest.join(&segments_dir_name(self.shard))
    }

    fn store_err(&self) -> impl Fn(StoreError) -> PublishError + '_ {
        |error| PublishError::Store {
            shard: self.shard,
            error: Box::new(error),
        }
    }

    /// The destination's checkpoint of this shard; `None` if there is none.
    fn read_checkpoint(&self) -> Result<Option<Checkpoint>, PublishError> {
        let loc = self.checkpoint_loc();
        let bytes = match self.store.read_small(&loc, MAX_CHECKPOINT_BYTES) {
            Ok(bytes) => bytes,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(StoreError::TooLarge { len, max, .. }) => {
                return Err(self.bad_checkpoint(CheckpointError {
                    line: 0,
                    reason: format!("{len} bytes, above the limit of {max}"),
                }))
            }
            Err(e) => return Err(self.store_err()(e)),
        };
        Checkpoint::decode(&bytes)
            .map(Some)
            .map_err(|e| self.bad_checkpoint(e))
    }

    fn bad_checkpoint(&self, error: CheckpointError) -> PublishError {
        PublishError::BadCheckpoint {
            shard: self.shard,
            checkpoint: self.checkpoint_loc().to_string(),
            segments: self.segments_loc().to_string(),
            error,
        }
    }

    /// A checkpoint found at open can be this sublist's: its shard, at most its durable
    /// items, finished only with the sublist and with all of them.
    fn check_ours(&self, c: &Checkpoint, durable: u64, finished: bool) -> Result<(), PublishError> {
        let reason = if c.shard != self.shard {
            format!("it is shard {}'s", c.shard)
        } else if c.count > durable {
            format!(
                "it publishes {} items, the sublist holds {durable}",
                c.count
            )
        } else if c.finished && (!finished || c.count != durable) {
            format!(
                "it is finished with {} items, the sublist {} with {durable}",
                c.count,
                if finished {
                    "is finished"
                } else {
                    "is not finished"
                }
            )
        } else {
            return Ok(());
        };
        Err(PublishError::Foreign {
            shard: self.shard,
            checkpoint: self.checkpoint_loc().to_string(),
            reason,
        })
    }

    /// Removes every segment of this shard the last checkpoint does not name.
    fn remove_orphans(&mut self) -> Result<(), PublishError> {
        let dir = self.segments_loc();
        let names = self.store.list_names(&dir).map_err(self.store_err())?;
        for name in names {
            let Some((a, b)) = segment_range(&name) else {
                continue; // Not a segment: not ours to remove.
            };
            let named = self
                .last
                .segments
                .iter()
                .any(|s| s.first_seq == a && s.end_seq == b);
            if !named {
                let orphan = dir.join(&name);
                tracing::info!(shard = self.shard, segment = %orphan, "removing a segment no checkpoint names (left by a producer killed before its checkpoint)");
                self.store.delete(&orphan).map_err(self.store_err())?;
            }
        }
        Ok(())
    }

    /// Writes the segment of seqs `last.count..durable`, read from the sublist from the
    /// first ID above the last claim (every published item has an ID at or below it,
    /// every later one above it); returns it once its upload has finished.
    fn write_segment(
        &mut self,
        writer: &ShardWriter,
        durable: u64,
    ) -> Result<SegmentRef, PublishError> {
        let (shard, first_seq) = (self.shard, self.last.count);
        if !self.dirs_made {
            self.store
                .make_dirs(&self.segments_loc())
                .map_err(self.store_err())?;
            self.dirs_made = true;
        }
        let loc = self.dest.join(&segment_name(shard, first_seq, durable));
        let seg_err = |error: RunError| PublishError::Segment {
            shard,
            segment: loc.to_string(),
            error,
        };
        let upload = self.store.create(&loc).map_err(self.store_err())?;
        // On any error below, dropping the writer drops the upload, which discards it.
        let mut run = RunWriter::segment(upload, shard, first_seq, durable).map_err(seg_err)?;
        let from = if first_seq == 0 {
            0
        } else {
            self.last.claim.saturating_add(1)
        };
        for item in writer.items_from(from).take((durable - first_seq) as usize) {
            let item = item.map_err(|error| PublishError::Sublist { shard, error })?;
            run.write(&item).map_err(seg_err)?;
        }
        let (upload, _) = run.finish().map_err(seg_err)?;
        let bytes = upload.finish().map_err(self.store_err())?;
        self.written.0 += 1;
        tracing::debug!(shard, segment = %loc, bytes, "segment published");
        #[cfg(feature = "test-hooks")]
        crate::test_hooks::maybe_abort_publishing(
            crate::test_hooks::PublishPoint::Segment,
            self.written.0,
        );
        Ok(SegmentRef {
            first_seq,
            end_seq: durable,
            bytes,
        })
    }

    /// Replaces the checkpoint (a directory: temporary file, fsync, rename, fsync of the
    /// directory; S3: one PUT).
    fn write_checkpoint(&mut self, c: &Checkpoint) -> Result<(), PublishError> {
        debug_assert!(c.check().is_ok(), "{:?}", c.check());
        let loc = self.checkpoint_loc();
        let mut upload = self.store.create(&loc).map_err(self.store_err())?;
        upload.write_all(&c.encode()).map_err(|e| {
            self.store_err()(StoreError::Io {
                object: loc.to_string(),
                op: "write",
                error: e,
            })
        })?;
        upload.finish().map_err(self.store_err())?;
        self.written.1 += 1;
        tracing::debug!(
            shard = self.shard,
            count = c.count,
            claim = c.claim,
            finished = c.finished,
            "checkpoint written"
        );
        #[cfg(feature = "test-hooks")]
        crate::test_hooks::maybe_abort_publishing(
            crate::test_hooks::PublishPoint::Checkpoint,
            self.written.1,
        );
        Ok(())
    }
}

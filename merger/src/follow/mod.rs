//! `merger follow`: the list while it grows (DESIGN.md, "The list while it grows").
//!
//! [`follow`] polls the checkpoints of the expected shards `0..K` in a source (a
//! directory or an S3 prefix), takes the **stable watermark** W, the smallest claim (a
//! shard without a checkpoint holds it before every ID; a finished one claims every ID),
//! and merges, in ID order, the records with IDs in (previous W, W] from each shard's
//! segments (chained in seq order, [`crate::published::Segments`], through the k-way
//! merge, [`crate::Merger`]). Those are final: nothing can appear below W any more. They
//! go into consecutive parts ([`Parts`]: list.bin or Parquet, cut by size and time, each
//! appearing atomically) and, if asked, to a writer (stdout) as `merger cat` prints them.
//! It stops once every shard has finished and the last part is written.
//!
//! The follower keeps no state the output does not hold: started again, it reads where its
//! parts end (the last part's range and shard table) and resumes after it.

mod parts;
mod shard;
pub mod stats;

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use qstore::{Location, Store};

pub use parts::{PartFormat, Parts, ResumePoint};
pub use shard::{FollowShard, BAD_CHECKPOINT_POLLS};
pub use stats::{FollowStats, ShardStat, Snapshot, PROGRESS_EVERY};

use crate::kway::{Input, Merger};
use crate::read::record_line;
use crate::MergeError;

/// How often the checkpoints are read while something moves (`--poll-ms`).
pub const DEFAULT_POLL: Duration = Duration::from_millis(200);
/// The longest wait between two polls while nothing moves: the interval doubles up to
/// this, so a stalled list costs a request per shard every few seconds, not five a second,
/// and a shard that moves again is seen within this.
pub const MAX_POLL: Duration = Duration::from_secs(2);
/// A part is closed once it holds this many bytes (`--part-bytes`): large enough for
/// the tools that read a directory of parts (a file per few seconds of a busy list, not
/// per poll), small enough to be written and read in one go.
pub const DEFAULT_PART_BYTES: u64 = 64 << 20;
/// A part with records is closed once it has been open this long (`--part-every`): how
/// stale the parts may be behind the watermark; `--stdout` is not held back by it.
pub const DEFAULT_PART_EVERY: Duration = Duration::from_secs(10);
/// The most shards a follow expects: one poll reads every checkpoint.
pub const MAX_SHARDS: u32 = 1 << 16;

/// What `merger follow` is asked to do.
#[derive(Debug, Clone)]
pub struct FollowConfig {
    /// Where the producers publish (`--runs`).
    pub src: Location,
    /// The shards `0..K` the list is made of (`--expect-shards`).
    pub expect_shards: u32,
    /// Where the parts go (`--out-dir`); `None`: none are written (`--stdout` only, which
    /// then starts from the beginning every time).
    pub out_dir: Option<PathBuf>,
    /// What the parts are written as.
    pub format: PartFormat,
    /// The poll interval while something moves.
    pub poll: Duration,
    /// A part is closed at this size.
    pub part_bytes: u64,
    /// A part with records is closed once open this long.
    pub part_every: Duration,
}

impl FollowConfig {
    /// A follow of `expect_shards` shards in `src` into `out_dir`, with the defaults.
    pub fn new(src: Location, expect_shards: u32, out_dir: Option<PathBuf>) -> FollowConfig {
        FollowConfig {
            src,
            expect_shards,
            out_dir,
            format: PartFormat::Bin,
            poll: DEFAULT_POLL,
            part_bytes: DEFAULT_PART_BYTES,
            part_every: DEFAULT_PART_EVERY,
        }
    }
}

/// Where the records go besides the parts: a writer (stdout), a line each, flushed at
/// every move of the watermark.
pub struct Lines<'a> {
    /// The writer.
    pub out: &'a mut dyn Write,
    /// JSON lines (`merger cat --json`) rather than tab-separated text.
    pub json: bool,
}

/// What a follow did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowSummary {
    /// Records emitted by this follower.
    pub records: u64,
    /// Parts written by this follower.
    pub parts: u64,
    /// Where the parts ended when it started (`None`: it started from the beginning).
    pub resumed_after: Option<u64>,
    /// Every shard finished and the last part is written (false: the reader of `--stdout`
    /// closed it first).
    pub complete: bool,
}

/// Follows the list as [`FollowConfig`] says until every shard has finished and the last
/// part is written, reporting to `stats` (and a progress line every [`PROGRESS_EVERY`]).
///
/// # Errors
/// A checkpoint or segment that is bad or breaks the rules of publication (naming it),
/// a merge error (duplicate IDs, order), and every error of reading the source and
/// writing the parts. The parts written before stay: a follower started again resumes
/// after them.
pub fn follow(
    store: &Store,
    cfg: &FollowConfig,
    lines: Option<Lines<'_>>,
    stats: &FollowStats,
) -> Result<FollowSummary, MergeError> {
    let mut f = Follower::start(store, cfg, lines)?;
    if f.complete() {
        tracing::info!("the parts already hold the whole list: nothing to follow");
        return Ok(f.summary());
    }
    let mut wait = cfg.poll;
    let mut report_at = Instant::now() + PROGRESS_EVERY;
    loop {
        let polled = f.poll()?;
        let moved = f.advance()?;
        f.close_if_due()?;
        stats.set(f.snapshot());
        if Instant::now() >= report_at {
            tracing::info!("{}", f.snapshot().line(Instant::now()));
            report_at = Instant::now() + PROGRESS_EVERY;
        }
        if f.stopped || f.finish()? {
            break;
        }
        wait = if polled || moved {
            cfg.poll
        } else {
            (wait * 2).min(MAX_POLL.max(cfg.poll))
        };
        let due = f.parts.as_ref().and_then(|p| p.due(Instant::now()));
        std::thread::sleep(due.map_or(wait, |d| d.min(wait)));
    }
    stats.set(f.snapshot());
    tracing::info!("{}", f.snapshot().line(Instant::now()));
    Ok(f.summary())
}

/// The follower's state between polls.
struct Follower<'a> {
    store: Store,
    shards: Vec<FollowShard>,
    parts: Option<Parts>,
    lines: Option<Lines<'a>>,
    /// The last ID emitted through (`None`: nothing yet): the previous watermark.
    done: Option<u64>,
    /// Per shard: its items emitted, so the seq of its next one.
    next_seq: Vec<u64>,
    records: u64,
    resumed_after: Option<u64>,
    moved_at: Instant,
    /// The reader of `lines` closed it.
    stopped: bool,
}

impl<'a> Follower<'a> {
    fn start(
        store: &Store,
        cfg: &FollowConfig,
        lines: Option<Lines<'a>>,
    ) -> Result<Follower<'a>, MergeError> {
        let k = cfg.expect_shards;
        let (parts, resume) = match &cfg.out_dir {
            Some(dir) => {
                let (p, r) = Parts::open(dir, cfg.format, k, cfg.part_bytes, cfg.part_every)?;
                (Some(p), r)
            }
            None => (None, None),
        };
        let next_seq = resume
            .as_ref()
            .map_or_else(|| vec![0; k as usize], |r| r.next_seq.clone());
        if let Some(r) = &resume {
            tracing::info!(
                next_part = r.next_index,
                after_id = r.last_id,
                "resuming after the last complete part"
            );
        }
        let shards = (0..k)
            .map(|s| FollowShard::new(store, &cfg.src, s, next_seq[s as usize]))
            .collect();
        Ok(Follower {
            store: store.clone(),
            shards,
            parts,
            lines,
            done: resume.as_ref().map(|r| r.last_id),
            next_seq,
            records: 0,
            resumed_after: resume.as_ref().map(|r| r.last_id),
            moved_at: Instant::now(),
            stopped: false,
        })
    }

    /// Reads every unfinished shard's checkpoint; whether anything moved.
    fn poll(&mut self) -> Result<bool, MergeError> {
        let mut moved = false;
        for s in &mut self.shards {
            moved |= s.poll(&self.store)?;
        }
        Ok(moved)
    }

    /// The smallest claim: every record at or below it is published, and no new one
    /// can appear there. Never below what was emitted.
    fn watermark(&self) -> Option<u64> {
        let w = self.shards.iter().map(|s| s.claim).min().flatten();
        w.max(self.done)
    }

    /// Merges and emits the records in (done, W]; whether W moved.
    fn advance(&mut self) -> Result<bool, MergeError> {
        let Some(w) = self.watermark() else {
            return Ok(false);
        };
        if self.done.is_some_and(|d| d >= w) || self.complete() {
            return Ok(false);
        }
        let first = self.done.map_or(0, |d| d + 1);
        self.emit(first, w)?;
        self.done = Some(w);
        self.moved_at = Instant::now();
        if let Some(l) = &mut self.lines {
            if let Err(e) = l.out.flush() {
                self.lines_failed(e)?;
            }
        }
        Ok(true)
    }

    /// The records of every shard with IDs in `first..=last`, merged, into the parts
    /// (cut when full) and the lines.
    fn emit(&mut self, first: u64, last: u64) -> Result<(), MergeError> {
        let final_count: Vec<Option<u64>> = self.shards.iter().map(|s| s.final_count()).collect();
        let mut shard_of = Vec::new();
        let mut inputs = Vec::new();
        for s in self.shards.iter_mut().filter(|s| !s.segments.is_empty()) {
            shard_of.push(s.shard);
            let name = s.name();
            let blocks = Box::new(s.segments.blocks(first, last));
            inputs.push(Input::new(name, vec![s.shard], blocks));
        }
        let mut merger = Merger::new(inputs);
        while let Some(stretch) = merger.next_stretch()? {
            let shard = shard_of[stretch.input];
            self.next_seq[shard as usize] += stretch.records;
            self.records += stretch.records;
            if let Some(parts) = &mut self.parts {
                parts.write(stretch.bytes, shard, stretch.records)?;
                if let Some(at) = parts.full() {
                    parts.close(at, &self.next_seq, &final_count)?;
                }
            }
            if let Some(l) = self.lines.as_mut().filter(|_| !self.stopped) {
                for r in stretch.iter() {
                    if let Err(e) = writeln!(l.out, "{}", record_line(&r.to_record(), l.json)) {
                        self.stopped = true;
                        if e.kind() != std::io::ErrorKind::BrokenPipe {
                            return Err(lines_error(e));
                        }
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    /// A write to the lines failed: a closed pipe ends the follow, anything else is an error.
    fn lines_failed(&mut self, e: std::io::Error) -> Result<(), MergeError> {
        self.stopped = true;
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Ok(());
        }
        Err(lines_error(e))
    }

    /// Closes the open part at W once it has been open for `--part-every`.
    fn close_if_due(&mut self) -> Result<(), MergeError> {
        let (Some(parts), Some(done)) = (&mut self.parts, self.done) else {
            return Ok(());
        };
        if parts.due(Instant::now()) == Some(Duration::ZERO) {
            let final_count: Vec<Option<u64>> =
                self.shards.iter().map(|s| s.final_count()).collect();
            parts.close(done, &self.next_seq, &final_count)?;
        }
        Ok(())
    }

    /// Whether every shard finished and everything is emitted; then closes the last part
    /// at the last ID (empty if nothing lay above the part before).
    fn finish(&mut self) -> Result<bool, MergeError> {
        if self.done != Some(u64::MAX) {
            return Ok(self.complete());
        }
        let final_count: Vec<Option<u64>> = self.shards.iter().map(|s| s.final_count()).collect();
        for (s, count) in final_count.iter().enumerate() {
            if *count != Some(self.next_seq[s]) {
                return Err(MergeError::Publication {
                    name: self.shards[s].name(),
                    what: format!(
                        "finished with {count:?} items, but {} were merged",
                        self.next_seq[s]
                    ),
                });
            }
        }
        if let Some(parts) = &mut self.parts {
            parts.close(u64::MAX, &self.next_seq, &final_count)?;
        }
        Ok(true)
    }

    /// The parts already end at the last ID.
    fn complete(&self) -> bool {
        self.parts.as_ref().is_some_and(Parts::complete)
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            watermark: self.watermark(),
            records: self.records,
            parts: self.parts.as_ref().map_or(0, Parts::written),
            shards: self
                .shards
                .iter()
                .map(|s| ShardStat {
                    claim: s.claim,
                    finished: s.finished,
                    moved_at: s.moved_at,
                })
                .collect(),
            moved_at: self.moved_at,
        }
    }

    fn summary(&self) -> FollowSummary {
        FollowSummary {
            records: self.records,
            parts: self.parts.as_ref().map_or(0, Parts::written),
            resumed_after: self.resumed_after,
            complete: !self.stopped,
        }
    }
}

fn lines_error(e: std::io::Error) -> MergeError {
    MergeError::Output {
        out: "stdout".into(),
        error: qstore::StoreError::Io {
            object: "stdout".into(),
            op: "write",
            error: e,
        },
    }
}

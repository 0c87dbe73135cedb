//! One expected shard as the follower sees it: its latest checkpoint's claim, the
//! segments published and not yet read past, and when its claim last moved.

use std::time::Instant;

use qformat::checkpoint::{Checkpoint, SegmentRef};
use qformat::names::{checkpoint_name, run_name};
use qstore::{Location, Store};

use crate::published::{is_retryable, read_checkpoint, CheckpointRead, Segments};
use crate::runs::open_run;
use crate::MergeError;

/// Polls in a row that may fail to read a good checkpoint before the follower stops. A
/// checkpoint is replaced atomically, so a bad one is corruption; a few retries cover a
/// store that replaces it in two steps, or an object replaced between HEAD and GET.
pub const BAD_CHECKPOINT_POLLS: u32 = 5;

/// A shard being followed.
pub struct FollowShard {
    /// Its number.
    pub shard: u32,
    checkpoint: Location,
    run: Location,
    /// The largest claim read: `None` until a checkpoint is (W is then held before every
    /// ID); `u64::MAX` once finished.
    pub claim: Option<u64>,
    /// Its producer finished and every item is in the segments taken.
    pub finished: bool,
    /// Seqs `0..published` are in the checkpoints read.
    pub published: u64,
    /// The last segment taken, which the next checkpoint must still list.
    last_seg: Option<SegmentRef>,
    etag: Option<String>,
    /// Its segments (or run) not yet read past.
    pub segments: Segments,
    /// When its claim last moved (or the follower started).
    pub moved_at: Instant,
    failures: u32,
    /// Seqs already in the parts (a resumed follower): segments ending at or below are
    /// not read again.
    skip_below: u64,
}

impl FollowShard {
    /// Shard `shard` published in `src`, whose items below seq `skip_below` are in the
    /// parts already.
    pub fn new(store: &Store, src: &Location, shard: u32, skip_below: u64) -> FollowShard {
        FollowShard {
            shard,
            checkpoint: src.join(&checkpoint_name(shard)),
            run: src.join(&run_name(shard)),
            claim: None,
            finished: false,
            published: 0,
            last_seg: None,
            etag: None,
            segments: Segments::new(store.clone(), src.clone(), shard, &[]),
            moved_at: Instant::now(),
            failures: 0,
            skip_below,
        }
    }

    /// The checkpoint's name, for messages.
    pub fn name(&self) -> String {
        self.checkpoint.to_string()
    }

    /// The shard's item count once finished.
    pub fn final_count(&self) -> Option<u64> {
        self.finished.then_some(self.published)
    }

    /// Reads the checkpoint (or, while there has been none, the shard's run: a shard
    /// compacted before the follower started) and takes what it adds; returns whether the
    /// claim, the count or the finished flag moved.
    ///
    /// # Errors
    /// A checkpoint still bad or gone after [`BAD_CHECKPOINT_POLLS`] polls in a row; one
    /// that breaks the rules ([`MergeError::Publication`]); a read that failed.
    pub fn poll(&mut self, store: &Store) -> Result<bool, MergeError> {
        if self.finished {
            return Ok(false);
        }
        let read = read_checkpoint(store, &self.checkpoint, self.etag.as_deref());
        // Gone after it was seen: compaction, or a store that replaces it in two steps.
        let gone = matches!(read, Ok(CheckpointRead::Missing)) && self.claim.is_some();
        let result = match read {
            Ok(CheckpointRead::Unchanged) => Ok(false),
            Ok(CheckpointRead::Found(c, etag)) => self.take(c, etag),
            Ok(CheckpointRead::Missing) if gone => Err(MergeError::Publication {
                name: self.name(),
                what: "the checkpoint disappeared while being followed (the shard was compacted? start the follower again: it resumes from its parts and reads the run)".into(),
            }),
            Ok(CheckpointRead::Missing) => self.take_run(store),
            Err(e) => Err(e),
        };
        match result {
            Ok(changed) => {
                self.failures = 0;
                Ok(changed)
            }
            Err(e) if gone || is_retryable(&e) => {
                self.failures += 1;
                if self.failures >= BAD_CHECKPOINT_POLLS {
                    return Err(e);
                }
                let n = self.failures;
                tracing::warn!(
                    shard = self.shard,
                    "{e:#} (poll {n} of {BAD_CHECKPOINT_POLLS} before giving up)"
                );
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Takes a checkpoint read: it must extend what was taken before.
    fn take(&mut self, c: Checkpoint, etag: Option<String>) -> Result<bool, MergeError> {
        let bad = |what: String| MergeError::Publication {
            name: self.name(),
            what,
        };
        if c.count < self.published {
            return Err(bad(format!(
                "publishes {} items, an earlier version {}: a checkpoint never takes back what it published",
                c.count, self.published
            )));
        }
        if let Some(last) = self.last_seg {
            if !c.segments.contains(&last) {
                return Err(bad(format!(
                    "no longer lists segment {}..{} ({} bytes), which an earlier version did",
                    last.first_seq, last.end_seq, last.bytes
                )));
            }
        }
        if self.claim.is_none() && c.count < self.skip_below {
            return Err(bad(format!(
                "publishes {} items, but the parts already hold {}: they are the output of a follow of another source",
                c.count, self.skip_below
            )));
        }
        let new: Vec<SegmentRef> = c
            .segments
            .iter()
            .filter(|s| s.first_seq >= self.published && s.end_seq > self.skip_below)
            .copied()
            .collect();
        self.segments.extend(&new);
        let claim = if c.finished { u64::MAX } else { c.claim };
        let moved = self.claim.is_none_or(|old| claim > old);
        if let Some(old) = self.claim.filter(|&old| claim < old) {
            tracing::warn!(
                shard = self.shard,
                old,
                claim,
                "the claim went back; keeping the larger one"
            );
        }
        let changed = moved || c.count != self.published || c.finished != self.finished;
        if moved {
            self.claim = Some(claim);
            self.moved_at = Instant::now();
        }
        self.published = c.count;
        self.last_seg = c.segments.last().copied().or(self.last_seg);
        self.finished = c.finished;
        self.etag = etag;
        Ok(changed)
    }

    /// No checkpoint has been seen: a run of the whole shard (`shard-<n>.bin`, what
    /// compaction leaves) makes it finished; otherwise nothing is published yet.
    fn take_run(&mut self, store: &Store) -> Result<bool, MergeError> {
        let run = match open_run(store, &self.run) {
            Ok(r) => r,
            Err(MergeError::Store(e)) if e.is_not_found() => return Ok(false),
            Err(e) => return Err(e),
        };
        let entry = match run.meta.shards.as_slice() {
            [one] if one.shard == self.shard && one.complete() => *one,
            other => {
                return Err(MergeError::Publication {
                    name: run.name.clone(),
                    what: format!(
                        "holds {other:?}, not shard {} alone and complete, and shard {} has no checkpoint",
                        self.shard, self.shard
                    ),
                })
            }
        };
        if entry.total > self.skip_below {
            self.segments.push_run(self.run.clone());
        }
        self.published = entry.total;
        self.finished = true;
        self.claim = Some(u64::MAX);
        self.moved_at = Instant::now();
        Ok(true)
    }
}

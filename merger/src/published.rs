//! Shards published as their producers go (DESIGN.md, "The list while it grows"): a
//! shard's checkpoint read from its destination ([`read_checkpoint`]), its segments
//! opened and checked against it ([`open_segment`]), and chained, in seq order, into one
//! input of the merge ([`Segments`], [`SegmentBlocks`]) that opens one segment at a time,
//! so a shard of ten thousand segments holds one file or object open, not ten thousand.
//!
//! Both readers of checkpoints use this: the batch merge (`merger --runs SRC`, a
//! checkpoint given as an input) and the follower ([`crate::follow`]).

use std::borrow::BorrowMut;
use std::collections::VecDeque;

use bytes::Bytes;
use qformat::checkpoint::{Checkpoint, SegmentRef, MAX_CHECKPOINT_BYTES};
use qformat::names::{checkpoint_shard, segment_name};
use qformat::run::{RunBlocks, ShardEntry};
use qstore::{Location, Store, StoreError};

use crate::kway::Blocks;
use crate::runs::{open_run, RunInput};
use crate::MergeError;

/// What reading a checkpoint found.
#[derive(Debug)]
pub enum CheckpointRead {
    /// No checkpoint there (its producer has published nothing yet, or it was compacted).
    Missing,
    /// The same version as the one the caller already has (the ETag it gave matched).
    Unchanged,
    /// A checkpoint, and the ETag of the version read (S3 only).
    Found(Checkpoint, Option<String>),
}

/// Reads and decodes the checkpoint at `loc`. With `known` (an ETag from an earlier
/// read), an S3 checkpoint still at that version is not read again.
///
/// # Errors
/// [`MergeError::BadCheckpoint`] for bytes that are not a checkpoint (torn, edited, too
/// long) or one whose shard is not the one its name says; [`MergeError::Store`] for a
/// read that failed (a checkpoint replaced between the HEAD and the GET is
/// [`StoreError::Changed`]: read it again).
pub fn read_checkpoint(
    store: &Store,
    loc: &Location,
    known: Option<&str>,
) -> Result<CheckpointRead, MergeError> {
    let object = match store.open(loc) {
        Ok(o) => o,
        Err(e) if e.is_not_found() => return Ok(CheckpointRead::Missing),
        Err(e) => return Err(e.into()),
    };
    let etag = object.etag().map(str::to_string);
    if known.is_some() && etag.as_deref() == known {
        return Ok(CheckpointRead::Unchanged);
    }
    let bad = |what: String| MergeError::BadCheckpoint {
        name: loc.to_string(),
        what,
    };
    if object.len() > MAX_CHECKPOINT_BYTES {
        return Err(bad(format!(
            "{} bytes, above the {MAX_CHECKPOINT_BYTES}-byte limit of a checkpoint",
            object.len()
        )));
    }
    let bytes = object.read_range(0..object.len())?;
    let checkpoint = Checkpoint::decode(&bytes).map_err(|e| bad(e.to_string()))?;
    if let Some(named) = checkpoint_shard(loc.name()).filter(|&n| n != checkpoint.shard) {
        return Err(bad(format!(
            "it says shard {}, its name shard {named}",
            checkpoint.shard
        )));
    }
    Ok(CheckpointRead::Found(checkpoint, etag))
}

/// Whether a failed read of a checkpoint may succeed if tried again: bytes that do not
/// decode (a checkpoint is replaced atomically, so only for a few polls, on a store that
/// is not) or a version replaced between two requests.
pub fn is_retryable(e: &MergeError) -> bool {
    matches!(
        e,
        MergeError::BadCheckpoint { .. } | MergeError::Store(StoreError::Changed { .. })
    )
}

/// Opens the segment `seg` of `shard`, published in `src`, and checks it is what the
/// checkpoint says: `seg.bytes` long, a whole list holding exactly seqs
/// `seg.first_seq..seg.end_seq` of `shard` and nothing else.
///
/// # Errors
/// [`MergeError::Publication`] naming the segment and what differs, and every error of
/// [`open_run`].
pub fn open_segment(
    store: &Store,
    src: &Location,
    shard: u32,
    seg: &SegmentRef,
) -> Result<RunInput, MergeError> {
    let loc = src.join(&segment_name(shard, seg.first_seq, seg.end_seq));
    let run = open_run(store, &loc)?;
    let bad = |what: String| MergeError::Publication {
        name: loc.to_string(),
        what,
    };
    if run.meta.file_len != seg.bytes {
        return Err(bad(format!(
            "{} bytes, its checkpoint says {}",
            run.meta.file_len, seg.bytes
        )));
    }
    let want = ShardEntry {
        shard,
        finished: false,
        first_seq: seg.first_seq,
        count: seg.items(),
        total: seg.end_seq,
    };
    if run.meta.shards != [want] || !run.meta.part().is_whole() {
        return Err(bad(format!(
            "holds {:?} ({}), but a segment of seqs {}..{} holds only shard {shard}'s: {want:?}",
            run.meta.shards,
            run.meta.part(),
            seg.first_seq,
            seg.end_seq
        )));
    }
    Ok(run)
}

/// Where the records of a shard's input come from: a run of the whole shard (a sealed or
/// compacted shard), or its published segments.
#[derive(Debug, Clone)]
enum Source {
    /// Opened, and read once its ID range is reached.
    Run(Location),
    /// A segment of the checkpoint.
    Segment(SegmentRef),
}

/// One shard's records as a chain of runs in seq order (its segments, or one run): the
/// ones not yet opened, and the one being read. A chain is read by ID ranges in
/// increasing order ([`Segments::blocks`]); a run wholly read is closed.
pub struct Segments {
    store: Store,
    src: Location,
    shard: u32,
    pending: VecDeque<Source>,
    current: Option<RunInput>,
}

impl Segments {
    /// The chain of `shard`'s segments `segs` (seq order), published in `src`.
    pub fn new(store: Store, src: Location, shard: u32, segs: &[SegmentRef]) -> Segments {
        let mut s = Segments {
            store,
            src,
            shard,
            pending: VecDeque::new(),
            current: None,
        };
        s.extend(segs);
        s
    }

    /// Appends segments published later (they follow the ones already here).
    pub fn extend(&mut self, segs: &[SegmentRef]) {
        self.pending
            .extend(segs.iter().copied().map(Source::Segment));
    }

    /// Appends a run holding the rest of the shard (its records above those already
    /// read; a compacted shard).
    pub fn push_run(&mut self, run: Location) {
        self.pending.push_back(Source::Run(run));
    }

    /// Whether any run is left to read.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.current.is_none()
    }

    /// The chain's records with IDs in `first..=last`, as blocks for the merge: runs
    /// are opened as the range reaches them, and closed once read to their end.
    pub fn blocks(&mut self, first: u64, last: u64) -> SegmentBlocks<&mut Segments> {
        SegmentBlocks::new(self, first, last)
    }

    fn open_next(&mut self) -> Result<bool, MergeError> {
        let Some(next) = self.pending.pop_front() else {
            return Ok(false);
        };
        let run = match &next {
            Source::Segment(seg) => open_segment(&self.store, &self.src, self.shard, seg)?,
            Source::Run(loc) => open_run(&self.store, loc)?,
        };
        self.current = Some(run);
        Ok(true)
    }
}

/// The blocks of a [`Segments`] chain in an ID range (the merge's [`Blocks`]). Owns the
/// chain (a batch merge) or borrows it (the follower keeps it between ranges).
pub struct SegmentBlocks<S> {
    chain: S,
    first: u64,
    last: u64,
    reading: Option<RunBlocks<StoreError>>,
    done: bool,
}

impl<S: BorrowMut<Segments>> SegmentBlocks<S> {
    /// The blocks of `chain` holding IDs `first..=last`.
    pub fn new(chain: S, first: u64, last: u64) -> SegmentBlocks<S> {
        SegmentBlocks {
            chain,
            first,
            last,
            reading: None,
            done: false,
        }
    }
}

/// The first and last ID of a run with records.
fn id_span(run: &RunInput) -> Option<(u64, u64)> {
    let first = run.meta.blocks.first()?.first_id;
    Some((first, run.meta.blocks.last()?.last_id))
}

impl<S: BorrowMut<Segments>> Blocks for SegmentBlocks<S> {
    fn next_block(&mut self) -> Result<Option<Bytes>, MergeError> {
        while !self.done {
            if let Some(r) = &mut self.reading {
                if let Some(b) = r.next_block()? {
                    return Ok(Some(b));
                }
                self.reading = None;
                let chain = self.chain.borrow_mut();
                let span = chain.current.as_ref().and_then(id_span);
                if span.is_some_and(|(_, last)| last > self.last) {
                    // It goes on above this range: keep it open for the next one.
                    self.done = true;
                    break;
                }
                chain.current = None;
            }
            let chain = self.chain.borrow_mut();
            if chain.current.is_none() && !chain.open_next()? {
                self.done = true;
                break;
            }
            let Some(run) = chain.current.as_ref() else {
                break;
            };
            match id_span(run) {
                // Not reached yet: it stays the current one.
                Some((first, _)) if first > self.last => self.done = true,
                Some(_) => self.reading = Some(run.blocks(self.first, self.last)),
                None => chain.current = None,
            }
        }
        Ok(None)
    }
}

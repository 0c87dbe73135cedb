//! Reading runs (list.bin version 2) from a directory or an object store: the metadata
//! from one read of the tail, then the blocks of an ID range with bounded ranged reads.

use std::collections::VecDeque;
use std::ops::Range;

use bytes::Bytes;
use qstore::{Location, Object, Store};
use sublist::run::{check_block, BlockEntry, BlockRecords, Footer, RunError, RunMeta, TAIL_GUESS};
use sublist::Record;

use crate::MergeError;

/// What all inputs of one merge may hold in reads in flight together, for local files:
/// the store's read size is cut to fit (see [`read_options`]), so a merge of 64 runs
/// holds about as much as one of 4, not 16 times as much. The OS reads ahead of a local
/// file, so small reads cost little.
pub const READ_BUDGET: usize = 64 << 20;
/// The same for a merge that reads from an object store, where every read is a request:
/// 512 KiB reads made a 64-run merge from SeaweedFS 8 times slower than from a
/// directory (BENCHMARKS.md), so reads stay at 1 MiB or more and the budget is larger.
pub const READ_BUDGET_S3: usize = 256 << 20;
/// The smallest read from a local file (one block, so a group of blocks is never cut).
pub const MIN_READ_CHUNK: usize = 256 << 10;
/// The smallest ranged GET from an object store.
pub const MIN_READ_CHUNK_S3: usize = 1 << 20;
/// Ranged GETs a merge from an object store keeps in flight across all its inputs (each
/// input at least the store's own `in_flight`, at most [`MAX_IN_FLIGHT_S3`]): one GET
/// waits on a round trip and the server's disk, so a few inputs need many each to keep
/// the server busy (BENCHMARKS.md, "Runs").
pub const IN_FLIGHT_S3: usize = 32;
/// The most ranged GETs one input keeps in flight.
pub const MAX_IN_FLIGHT_S3: usize = 4;

/// `base` with its read size cut so that `inputs` runs read by `jobs` threads, each with
/// `base.in_flight` reads outstanding, stay within [`READ_BUDGET`] ([`READ_BUDGET_S3`]
/// when any input is in an object store).
pub fn read_options(
    base: qstore::StoreOptions,
    inputs: usize,
    jobs: usize,
    s3: bool,
) -> qstore::StoreOptions {
    let (budget, min) = if s3 {
        (READ_BUDGET_S3, MIN_READ_CHUNK_S3)
    } else {
        (READ_BUDGET, MIN_READ_CHUNK)
    };
    let streams = inputs.max(1) * jobs.max(1);
    let in_flight = if s3 {
        (IN_FLIGHT_S3 / streams).clamp(base.in_flight.max(1), MAX_IN_FLIGHT_S3.max(base.in_flight))
    } else {
        base.in_flight.max(1)
    };
    let chunk = (budget / (streams * in_flight)).clamp(min, base.read_chunk.max(min));
    qstore::StoreOptions {
        read_chunk: chunk,
        in_flight,
        ..base
    }
}

/// An opened run: where it is, its metadata, and a handle for ranged reads.
pub struct RunInput {
    /// Its location (a file or an S3 object).
    pub location: Location,
    /// Footer, index and shard table.
    pub meta: RunMeta,
    object: Object,
    /// Bytes of consecutive blocks fetched by one ranged read: the store's read size, so
    /// a read is never cut inside a group.
    group_bytes: u64,
}

fn run_err(location: &Location) -> impl FnOnce(RunError) -> MergeError + '_ {
    move |error| MergeError::Run {
        name: location.to_string(),
        error,
    }
}

/// Opens a run: one read of its tail (two when its metadata is larger than
/// [`TAIL_GUESS`]), checked by [`RunMeta::decode`].
///
/// # Errors
/// [`MergeError::Store`] (missing, unreadable, credentials), [`MergeError::Run`] (not a
/// run, truncated, corrupt metadata), [`MergeError::VersionOne`] for a version 1 list.bin.
pub fn open_run(store: &Store, location: &Location) -> Result<RunInput, MergeError> {
    let object = store.open(location)?;
    let len = object.len();
    let mut tail = object.read_range(len - len.min(TAIL_GUESS)..len)?;
    let footer = match Footer::decode(&tail, len) {
        Ok(f) => f,
        Err(e @ (RunError::BadMagic { .. } | RunError::TooShort { .. })) => {
            // An old list.bin, or our own Parquet output, gets a better word than "bad magic".
            if len >= 8 {
                let head = object.read_range(0..8)?;
                if head[..] == sublist::listbin::MAGIC {
                    return Err(MergeError::VersionOne {
                        name: location.to_string(),
                    });
                }
                if head.starts_with(b"PAR1") {
                    return Err(MergeError::ParquetInput {
                        name: location.to_string(),
                    });
                }
            }
            return Err(run_err(location)(e));
        }
        Err(e) => return Err(run_err(location)(e)),
    };
    let meta_len = footer.meta_len(len);
    if meta_len > tail.len() as u64 {
        tail = object.read_range(len - meta_len..len)?;
    }
    let meta = RunMeta::decode(len, &tail).map_err(run_err(location))?;
    Ok(RunInput {
        location: location.clone(),
        meta,
        object,
        group_bytes: store.options().read_chunk as u64,
    })
}

impl RunInput {
    /// The blocks holding IDs `first..=last`, streamed as the merge reads them
    /// ([`crate::kway::Blocks`]): only the blocks that may hold them are read, in groups
    /// of up to the store's read size, with its bounded read-ahead; each block is checked
    /// ([`check_block`]) and cut to the records in the range.
    pub fn blocks(&self, first: u64, last: u64) -> RunBlocks {
        let blocks = self.meta.blocks_in(first, last);
        let base = blocks.first().map_or(0, |b| {
            self.meta.blocks.partition_point(|x| x.offset < b.offset)
        });
        let ranges = group_ranges(blocks, self.group_bytes);
        RunBlocks {
            name: self.location.to_string(),
            blocks: blocks.iter().copied().collect(),
            base: base as u64,
            reader: Box::new(self.object.read_ranges(ranges)),
            piece: Bytes::new(),
            used: 0,
            carry: Vec::new(),
            first,
            last,
        }
    }

    /// One block's bytes, CRC included (not checked).
    ///
    /// # Errors
    /// Reading it failed.
    pub fn read_block(&self, b: &BlockEntry) -> Result<Bytes, MergeError> {
        Ok(self.object.read_range(b.range())?)
    }

    /// The records of IDs `first..=last`, copied out of [`RunInput::blocks`] (for tools:
    /// `merger verify`, `merger cat`).
    pub fn records(&self, first: u64, last: u64) -> RunRecords {
        RunRecords {
            blocks: self.blocks(first, last),
            out: VecDeque::new(),
            failed: false,
        }
    }
}

/// Consecutive blocks grouped into byte ranges of at most `limit` bytes (a block larger
/// than that is a range of its own).
fn group_ranges(blocks: &[BlockEntry], limit: u64) -> Vec<Range<u64>> {
    let mut ranges: Vec<Range<u64>> = Vec::new();
    for b in blocks {
        match ranges.last_mut() {
            Some(r) if r.end == b.offset && r.end - r.start + u64::from(b.len) <= limit => {
                r.end += u64::from(b.len)
            }
            _ => ranges.push(b.range()),
        }
    }
    ranges
}

type Pieces = Box<dyn Iterator<Item = Result<(u64, Bytes), qstore::StoreError>> + Send>;

/// The blocks of one run in an ID range ([`RunInput::blocks`]), each checked before it is
/// handed out, cut to the range's records, and borrowed from the read that fetched it
/// (a block split across two reads is copied together).
pub struct RunBlocks {
    name: String,
    /// The blocks still to hand out, in order.
    blocks: VecDeque<BlockEntry>,
    /// Index number of `blocks[0]` (for error messages).
    base: u64,
    reader: Pieces,
    /// The last read, and how much of it is handed out.
    piece: Bytes,
    used: usize,
    /// The start of a block that the last read ended inside.
    carry: Vec<u8>,
    first: u64,
    last: u64,
}

impl RunBlocks {
    /// The bytes of the next block (`next`), from the reads.
    fn block_bytes(&mut self, next: BlockEntry) -> Result<Bytes, MergeError> {
        let len = next.len as usize;
        loop {
            let have = self.piece.len() - self.used;
            if self.carry.is_empty() && have >= len {
                let b = self.piece.slice(self.used..self.used + len);
                self.used += len;
                return Ok(b);
            }
            if !self.carry.is_empty() || have > 0 {
                let want = len - self.carry.len();
                let take = want.min(have);
                self.carry
                    .extend_from_slice(&self.piece[self.used..self.used + take]);
                self.used += take;
                if self.carry.len() == len {
                    return Ok(Bytes::from(std::mem::take(&mut self.carry)));
                }
            }
            let (offset, piece) = match self.reader.next() {
                Some(p) => p?,
                None => {
                    return Err(self.bad(next, "the object ended before this block".into()));
                }
            };
            let expected = next.offset + self.carry.len() as u64;
            if offset != expected {
                return Err(self.bad(
                    next,
                    format!("a read returned byte {offset}, {expected} expected"),
                ));
            }
            self.piece = piece;
            self.used = 0;
        }
    }

    fn bad(&self, b: BlockEntry, what: String) -> MergeError {
        MergeError::Run {
            name: self.name.clone(),
            error: RunError::BadBlock {
                offset: b.offset,
                block: self.base,
                what,
            },
        }
    }
}

impl crate::kway::Blocks for RunBlocks {
    fn next_block(&mut self) -> Result<Option<Bytes>, MergeError> {
        let Some(next) = self.blocks.front().copied() else {
            return Ok(None);
        };
        let bytes = self.block_bytes(next)?;
        let body_len = check_block(&bytes, &next, self.base)
            .map_err(|error| MergeError::Run {
                name: self.name.clone(),
                error,
            })?
            .len();
        self.blocks.pop_front();
        self.base += 1;
        let mut body = bytes.slice(..body_len);
        // Only the blocks at the ends of the range hold records outside it.
        if next.first_id < self.first || next.last_id > self.last {
            let (mut start, mut end) = (None, 0);
            let mut pos = 0;
            for r in BlockRecords::new(&body) {
                if r.id >= self.first && start.is_none() {
                    start = Some(pos);
                }
                pos += r.encoded.len();
                if r.id <= self.last {
                    end = pos;
                }
            }
            let start = start.unwrap_or(end).min(end);
            body = body.slice(start..end);
        }
        Ok(Some(body))
    }
}

/// The records of one run in an ID range ([`RunInput::records`]), copied out.
pub struct RunRecords {
    blocks: RunBlocks,
    out: VecDeque<Record>,
    failed: bool,
}

impl Iterator for RunRecords {
    type Item = Result<Record, MergeError>;

    fn next(&mut self) -> Option<Self::Item> {
        use crate::kway::Blocks;
        while self.out.is_empty() && !self.failed {
            match self.blocks.next_block() {
                Ok(Some(b)) => self
                    .out
                    .extend(BlockRecords::new(&b).map(|r| r.to_record())),
                Ok(None) => return None,
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
        self.out.pop_front().map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(offset: u64, len: u32) -> BlockEntry {
        BlockEntry {
            first_id: offset,
            last_id: offset,
            offset,
            records: 1,
            len,
        }
    }

    #[test]
    fn ranges_group_consecutive_blocks_up_to_the_limit() {
        const LIMIT: u64 = 4 << 20;
        let third = (LIMIT / 3) as u32;
        let blocks: Vec<BlockEntry> = (0..7)
            .map(|i| block(8 + i * u64::from(third), third))
            .collect();
        let ranges = group_ranges(&blocks, LIMIT);
        assert_eq!(ranges.len(), 3, "{ranges:?}");
        assert_eq!(ranges[0], 8..8 + 3 * u64::from(third));
        assert_eq!(ranges[2].end, 8 + 7 * u64::from(third));
        let big = [block(8, (LIMIT * 2) as u32)];
        assert_eq!(group_ranges(&big, LIMIT), vec![8..8 + LIMIT * 2]);
        assert!(group_ranges(&[], LIMIT).is_empty());
    }

    #[test]
    fn read_ahead_fits_the_budget_whatever_the_input_count() {
        let base = qstore::StoreOptions::default();
        for s3 in [false, true] {
            let (budget, min) = if s3 {
                (READ_BUDGET_S3, MIN_READ_CHUNK_S3)
            } else {
                (READ_BUDGET, MIN_READ_CHUNK)
            };
            for (inputs, jobs) in [(1, 1), (4, 1), (64, 1), (64, 4), (1000, 1)] {
                let o = read_options(base, inputs, jobs, s3);
                assert!(o.read_chunk >= min && o.read_chunk <= base.read_chunk.max(min));
                let held = inputs * jobs * o.in_flight * o.read_chunk;
                assert!(
                    held <= budget || o.read_chunk == min,
                    "{inputs}x{jobs}: {held}"
                );
            }
            assert_eq!(read_options(base, 4, 1, s3).read_chunk, base.read_chunk);
        }
    }
}

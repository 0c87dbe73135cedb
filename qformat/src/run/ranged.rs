//! Reading a run (list.bin version 2) through ranged reads, from wherever its bytes are
//! (a local file, an S3 object: anything that implements [`RangeRead`]): the metadata from
//! one read of the tail, then the blocks of an ID range with bounded ranged reads.

use std::collections::VecDeque;
use std::ops::Range;

use bytes::Bytes;

use super::{check_block, BlockEntry, BlockRecords, Footer, RunError, RunMeta, TAIL_GUESS};
use crate::record::Record;

/// What [`RangedRun`] needs of the place its bytes are: their length, one ranged read,
/// and a sequence of ranged reads handed back in order (with whatever read-ahead the
/// implementation keeps). `qstore::Object` is the one the merger uses.
pub trait RangeRead {
    /// What a failed read is.
    type Error: std::error::Error + Send + Sync + 'static;
    /// The reads of [`RangeRead::read_ranges`].
    type Ranges: Iterator<Item = Result<(u64, Bytes), Self::Error>> + Send + 'static;

    /// The length in bytes, as learned when it was opened.
    fn len(&self) -> u64;

    /// Whether it holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Exactly the bytes of `range`.
    ///
    /// # Errors
    /// The read failed, or the range is outside the object.
    fn read_range(&self, range: Range<u64>) -> Result<Bytes, Self::Error>;

    /// The bytes of `ranges`, in order, as `(offset, bytes)` pieces that together cover
    /// each range (a range may come in several pieces); at most one error, then the end.
    fn read_ranges(&self, ranges: Vec<Range<u64>>) -> Self::Ranges;
}

/// Why a run read through [`RangeRead`] cannot be read: the read failed, or its bytes
/// are wrong. Every variant but `Read` names the run.
#[derive(Debug, thiserror::Error)]
pub enum RangedError<E> {
    /// A read failed (its error names the object).
    #[error(transparent)]
    Read(E),
    /// The run's bytes are wrong (truncated, corrupt, not a run).
    #[error("{name}: {error}")]
    Run {
        /// The run (its location).
        name: String,
        /// In the message, not a `#[source]`: `{:#}` would print it twice.
        error: RunError,
    },
    /// A version 1 list.bin, where a run is read.
    #[error("{name} is a version 1 list.bin (QLIST001), not a run")]
    VersionOne {
        /// The file (its location).
        name: String,
    },
    /// A Parquet file, where a run is read.
    #[error("{name} is a Parquet file, not a run")]
    Parquet {
        /// The file (its location).
        name: String,
    },
}

/// An opened run: its name, its metadata, and a handle for ranged reads.
pub struct RangedRun<R> {
    /// What errors call it (its location).
    pub name: String,
    /// Footer, index and shard table.
    pub meta: RunMeta,
    reader: R,
    /// Bytes of consecutive blocks fetched by one ranged read: the store's read size, so
    /// a read is never cut inside a group.
    group_bytes: u64,
}

fn run_err<E>(name: &str) -> impl FnOnce(RunError) -> RangedError<E> + '_ {
    move |error| RangedError::Run {
        name: name.to_string(),
        error,
    }
}

impl<R: RangeRead> RangedRun<R> {
    /// Opens the run in `reader`, called `name`: one read of its tail (two when its
    /// metadata is larger than [`TAIL_GUESS`]), checked by [`RunMeta::decode`]. Later
    /// reads of consecutive blocks are grouped up to `group_bytes` each.
    ///
    /// # Errors
    /// [`RangedError::Read`] (unreadable), [`RangedError::Run`] (not a run, truncated,
    /// corrupt metadata), [`RangedError::VersionOne`] for a version 1 list.bin,
    /// [`RangedError::Parquet`] for a Parquet file.
    pub fn open(reader: R, name: String, group_bytes: u64) -> Result<Self, RangedError<R::Error>> {
        let object = reader;
        let location = name.as_str();
        let len = object.len();
        let mut tail = object
            .read_range(len - len.min(TAIL_GUESS)..len)
            .map_err(RangedError::Read)?;
        let footer = match Footer::decode(&tail, len) {
            Ok(f) => f,
            Err(e @ (RunError::BadMagic { .. } | RunError::TooShort { .. })) => {
                // An old list.bin, or our own Parquet output, gets a better word than "bad magic".
                if len >= 8 {
                    let head = object.read_range(0..8).map_err(RangedError::Read)?;
                    if head[..] == crate::listbin::MAGIC {
                        return Err(RangedError::VersionOne {
                            name: location.to_string(),
                        });
                    }
                    if head.starts_with(b"PAR1") {
                        return Err(RangedError::Parquet {
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
            tail = object
                .read_range(len - meta_len..len)
                .map_err(RangedError::Read)?;
        }
        let meta = RunMeta::decode(len, &tail).map_err(run_err(location))?;
        Ok(RangedRun {
            name,
            meta,
            reader: object,
            group_bytes,
        })
    }

    /// What it reads from.
    pub fn reader(&self) -> &R {
        &self.reader
    }

    /// The blocks holding IDs `first..=last`, streamed as the merge reads them
    /// (the merger's `Blocks`): only the blocks that may hold them are read, in groups
    /// of up to the store's read size, with its bounded read-ahead; each block is checked
    /// ([`check_block`]) and cut to the records in the range.
    pub fn blocks(&self, first: u64, last: u64) -> RunBlocks<R::Error> {
        let blocks = self.meta.blocks_in(first, last);
        let base = blocks.first().map_or(0, |b| {
            self.meta.blocks.partition_point(|x| x.offset < b.offset)
        });
        let ranges = group_ranges(blocks, self.group_bytes);
        RunBlocks {
            name: self.name.clone(),
            blocks: blocks.iter().copied().collect(),
            base: base as u64,
            reader: Box::new(self.reader.read_ranges(ranges)),
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
    pub fn read_block(&self, b: &BlockEntry) -> Result<Bytes, R::Error> {
        self.reader.read_range(b.range())
    }

    /// The records of IDs `first..=last`, copied out of [`RangedRun::blocks`] (for tools:
    /// `merger verify`, `merger cat`).
    pub fn records(&self, first: u64, last: u64) -> RunRecords<R::Error> {
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

type Pieces<E> = Box<dyn Iterator<Item = Result<(u64, Bytes), E>> + Send>;

/// The blocks of one run in an ID range ([`RangedRun::blocks`]), each checked before it is
/// handed out, cut to the range's records, and borrowed from the read that fetched it
/// (a block split across two reads is copied together).
pub struct RunBlocks<E> {
    name: String,
    /// The blocks still to hand out, in order.
    blocks: VecDeque<BlockEntry>,
    /// Index number of `blocks[0]` (for error messages).
    base: u64,
    reader: Pieces<E>,
    /// The last read, and how much of it is handed out.
    piece: Bytes,
    used: usize,
    /// The start of a block that the last read ended inside.
    carry: Vec<u8>,
    first: u64,
    last: u64,
}

impl<E> RunBlocks<E> {
    /// The bytes of the next block (`next`), from the reads.
    fn block_bytes(&mut self, next: BlockEntry) -> Result<Bytes, RangedError<E>> {
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
                Some(p) => p.map_err(RangedError::Read)?,
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

    fn bad(&self, b: BlockEntry, what: String) -> RangedError<E> {
        RangedError::Run {
            name: self.name.clone(),
            error: RunError::BadBlock {
                offset: b.offset,
                block: self.base,
                what,
            },
        }
    }

    /// The next block's records, checked ([`check_block`]) and cut to the range: the
    /// body without its CRC, borrowed from the read that fetched it; `None` after the last.
    ///
    /// # Errors
    /// A read failed, or the block is not what the index says.
    pub fn next_block(&mut self) -> Result<Option<Bytes>, RangedError<E>> {
        let Some(next) = self.blocks.front().copied() else {
            return Ok(None);
        };
        let bytes = self.block_bytes(next)?;
        let body_len = check_block(&bytes, &next, self.base)
            .map_err(|error| RangedError::Run {
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

/// The records of one run in an ID range ([`RangedRun::records`]), copied out.
pub struct RunRecords<E> {
    blocks: RunBlocks<E>,
    out: VecDeque<Record>,
    failed: bool,
}

impl<E> Iterator for RunRecords<E> {
    type Item = Result<Record, RangedError<E>>;

    fn next(&mut self) -> Option<Self::Item> {
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
}

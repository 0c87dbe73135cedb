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
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::record::rec;
    use crate::run::{Part, RunWriter, ShardSpec, BLOCK_CRC_LEN, BLOCK_TARGET, HEADER_LEN};

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

    /// A run in memory behind [`RangeRead`] that logs every range read from it, as it is
    /// read: what a store is asked for. (`qstore::Object` sends each range as one GET or,
    /// past its read size, as several, cut at multiples of it on S3; it never widens one.)
    struct Counting {
        bytes: Bytes,
        asked: Arc<Mutex<Vec<Range<u64>>>>,
    }

    impl Counting {
        fn new(bytes: Vec<u8>) -> Counting {
            Counting {
                bytes: Bytes::from(bytes),
                asked: Arc::default(),
            }
        }
    }

    fn fetch(
        bytes: &Bytes,
        asked: &Mutex<Vec<Range<u64>>>,
        range: Range<u64>,
    ) -> std::io::Result<Bytes> {
        asked.lock().expect("log").push(range.clone());
        if range.start > range.end || range.end > bytes.len() as u64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("bytes {range:?} of {}", bytes.len()),
            ));
        }
        Ok(bytes.slice(range.start as usize..range.end as usize))
    }

    /// The reads of [`Counting::read_ranges`], each logged when the reader takes it.
    struct CountingRanges {
        bytes: Bytes,
        asked: Arc<Mutex<Vec<Range<u64>>>>,
        ranges: std::vec::IntoIter<Range<u64>>,
        failed: bool,
    }

    impl Iterator for CountingRanges {
        type Item = std::io::Result<(u64, Bytes)>;

        fn next(&mut self) -> Option<Self::Item> {
            if self.failed {
                return None;
            }
            let range = self.ranges.next()?;
            let start = range.start;
            let read = fetch(&self.bytes, &self.asked, range);
            self.failed = read.is_err();
            Some(read.map(|b| (start, b)))
        }
    }

    impl RangeRead for Counting {
        type Error = std::io::Error;
        type Ranges = CountingRanges;

        fn len(&self) -> u64 {
            self.bytes.len() as u64
        }

        fn read_range(&self, range: Range<u64>) -> std::io::Result<Bytes> {
            fetch(&self.bytes, &self.asked, range)
        }

        fn read_ranges(&self, ranges: Vec<Range<u64>>) -> CountingRanges {
            CountingRanges {
                bytes: self.bytes.clone(),
                asked: Arc::clone(&self.asked),
                ranges: ranges.into_iter(),
                failed: false,
            }
        }
    }

    /// The ranges logged so far, and a fresh log.
    fn take(asked: &Mutex<Vec<Range<u64>>>) -> Vec<Range<u64>> {
        std::mem::take(&mut *asked.lock().expect("log"))
    }

    /// A run of `n` records written by [`RunWriter`] (IDs 10, 13, 16, ..., three shards,
    /// payloads of 40 to 339 bytes so blocks hold uneven counts): its bytes and records.
    fn a_run(n: u64) -> (Vec<u8>, Vec<Record>) {
        let records: Vec<Record> = (0..n)
            .map(|i| {
                let payload = vec![i as u8; 40 + (i * 7919 % 300) as usize];
                rec(10 + i * 3, (i % 3) as u32, i / 3, &payload)
            })
            .collect();
        let specs = (0..3)
            .map(|shard| ShardSpec {
                shard,
                finished: true,
                total: (n + 2 - u64::from(shard)) / 3,
            })
            .collect();
        let mut w = RunWriter::new(Vec::new(), specs, Part::WHOLE).expect("new");
        for r in &records {
            w.write(r).expect("write");
        }
        (w.finish().expect("finish").0, records)
    }

    /// Four parts' ID ranges `(first, last)`, cut as a split may cut them
    /// (`merger::split`: a part's IDs run from one boundary to the next minus 1): one
    /// boundary on a block's first ID, two inside blocks (a block that straddles a
    /// boundary is read by the parts on both sides).
    fn four_parts(meta: &RunMeta) -> Vec<(u64, u64)> {
        let b = &meta.blocks;
        let n = b.len();
        let cuts = [
            b[n / 4].first_id,
            (b[n / 2].first_id + b[n / 2].last_id) / 2,
            b[3 * n / 4].first_id + 1,
        ];
        vec![
            (0, cuts[0] - 1),
            (cuts[0], cuts[1] - 1),
            (cuts[1], cuts[2] - 1),
            (cuts[2], u64::MAX),
        ]
    }

    /// Whether block `b` holds no ID of `first..=last`.
    fn outside(b: &BlockEntry, first: u64, last: u64) -> bool {
        b.last_id < first || b.first_id > last
    }

    /// Reading a part's range through [`RangedRun::blocks`] (what the merger reads each
    /// run of `--part` and `--jobs` through) asks the store for the run's tail, then for
    /// exactly the bytes of the blocks that may hold the range, each once; never a byte
    /// of a block wholly outside it.
    ///
    /// The allowance, from the code: [`RangedRun::open`] reads the last
    /// `min(len, TAIL_GUESS)` bytes (footer, index, shard table, and whatever blocks lie in
    /// those 256 KiB, not checked; a second read of the metadata alone only when it is
    /// larger); [`RangedRun::blocks`] reads [`group_ranges`] of
    /// [`RunMeta::blocks_in`]`(first, last)`, the blocks whose ID spans meet the range
    /// (so the blocks at its ends, which straddle its boundaries, whole), consecutive ones
    /// joined into one read of at most `group_bytes` (a larger block alone); every read
    /// starts and ends on a block boundary. No rounding or alignment widens a read here;
    /// the store's alignment (`qstore`, on S3) only cuts reads into pieces.
    #[test]
    fn a_part_reads_the_tail_then_only_its_blocks() {
        let (bytes, records) = a_run(30_000);
        let len = bytes.len() as u64;
        let meta = RunMeta::decode(len, &bytes).expect("meta");
        let blocks = &meta.blocks;
        assert!(blocks.len() >= 16, "{} blocks", blocks.len());
        assert!(
            meta.footer.meta_len(len) <= TAIL_GUESS && len > TAIL_GUESS,
            "one opening read of 256 KiB, not the whole run"
        );
        let tail = len - TAIL_GUESS..len;
        let data_bytes: u64 = blocks.iter().map(|b| u64::from(b.len)).sum();
        assert_eq!(HEADER_LEN + data_bytes, meta.footer.index_offset);
        let target = BLOCK_TARGET as u64;
        for (first, last) in four_parts(&meta) {
            let needed = meta.blocks_in(first, last);
            let needed_bytes: u64 = needed.iter().map(|b| u64::from(b.len)).sum();
            let expected: Vec<u64> = records
                .iter()
                .map(|r| r.id)
                .filter(|id| (first..=last).contains(id))
                .collect();
            assert!(!expected.is_empty() && needed.len() < blocks.len() / 2 + 2);
            for group in [1, target, 1 << 20, 4 << 20, u64::MAX] {
                let what = format!("IDs {first}..={last}, reads of up to {group} bytes");
                let store = Counting::new(bytes.clone());
                let asked = Arc::clone(&store.asked);
                let run = RangedRun::open(store, "run".into(), group).expect("open");
                assert_eq!(take(&asked), vec![tail.clone()], "{what}: open");
                let mut ids = Vec::new();
                let mut part = run.blocks(first, last);
                while let Some(body) = part.next_block().expect("block") {
                    ids.extend(BlockRecords::new(&body).map(|r| r.id));
                }
                assert!(ids == expected, "{what}: other IDs");
                let reads = take(&asked);
                // Each read: the part's next blocks, from one's start to another's end.
                let mut next = 0;
                for r in &reads {
                    if let Some(b) = blocks.iter().find(|b| {
                        outside(b, first, last) && r.start < b.range().end && b.offset < r.end
                    }) {
                        panic!("{what}: read {r:?} touches {b:?}, wholly outside the range");
                    }
                    assert!(
                        needed.get(next).is_some_and(|b| b.offset == r.start),
                        "{what}: read {r:?} does not start at the part's next block"
                    );
                    let Some(end) = needed[next..].iter().position(|b| b.range().end == r.end)
                    else {
                        panic!("{what}: read {r:?} does not end at the end of a block of the part");
                    };
                    assert!(
                        end == 0 || r.end - r.start <= group,
                        "{what}: read {r:?} joins {} blocks beyond {group} bytes",
                        end + 1
                    );
                    next += end + 1;
                }
                assert_eq!(
                    next,
                    needed.len(),
                    "{what}: not every block of the part read"
                );
                // The bound a run read whole (or from its start, or to its end) breaks.
                let read_bytes: u64 = reads.iter().map(|r| r.end - r.start).sum();
                assert_eq!(read_bytes, needed_bytes, "{what}: {reads:?}");
                assert!(
                    read_bytes < data_bytes / 2,
                    "{what}: {read_bytes} of the run's {data_bytes} block bytes read"
                );
            }
        }
    }

    /// With every block wholly outside a part's range corrupt, the part's records still
    /// read, through the merger's path ([`RangedRun::blocks`]) and the tools'
    /// ([`RangedRun::records`]); the whole run fails on a corrupt block, naming it. A
    /// reader that read from the run's start (or on to its end) and dropped the IDs
    /// outside the range fails here.
    #[test]
    fn a_part_reads_its_records_with_every_block_outside_it_corrupt() {
        let (good, records) = a_run(30_000);
        let meta = RunMeta::decode(good.len() as u64, &good).expect("meta");
        for (first, last) in four_parts(&meta) {
            let mut bytes = good.clone();
            let mut corrupt = Vec::new();
            for (i, b) in meta.blocks.iter().enumerate() {
                if outside(b, first, last) {
                    bytes[b.offset as usize + 100] ^= 0x10;
                    corrupt.push(i);
                }
            }
            assert!(corrupt.len() >= meta.blocks.len() / 2, "{corrupt:?}");
            let run = RangedRun::open(Counting::new(bytes), "run".into(), 4 << 20)
                .expect("open: the metadata is intact");
            let expected: Vec<Record> = records
                .iter()
                .filter(|r| (first..=last).contains(&r.id))
                .cloned()
                .collect();
            let got: Vec<Record> = run
                .records(first, last)
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("IDs {first}..={last}: {e}"));
            assert!(got == expected, "IDs {first}..={last}: other records");
            let mut part = run.blocks(first, last);
            let mut count = 0;
            while let Some(body) = part
                .next_block()
                .unwrap_or_else(|e| panic!("IDs {first}..={last}: {e}"))
            {
                count += BlockRecords::new(&body).count();
            }
            assert_eq!(count, expected.len(), "IDs {first}..={last}");
            let e = run
                .records(0, u64::MAX)
                .find_map(Result::err)
                .expect("the whole run reaches a corrupt block");
            // The error names the run, the block and its CRC's offset.
            let b = meta.blocks[corrupt[0]];
            let named = format!(
                "run: byte {}: block {} checksum mismatch",
                b.offset + u64::from(b.len) - BLOCK_CRC_LEN,
                corrupt[0]
            );
            assert!(e.to_string().contains(&named), "{e}");
        }
    }
}

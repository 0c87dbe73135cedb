//! Runs: list.bin version 2 (`QLIST002`), the format of a sealed sublist, of a merged list
//! and of one part of a split merge.
//!
//! A run is one immutable file: records as in version 1, grouped into checksummed blocks,
//! then an index of the blocks, a table of the shards it holds and a fixed-size footer
//! that finds both with one read of the file's tail (`docs/list-format.md`, byte by byte):
//!
//! ```text
//! header:  8 bytes magic "QLIST002"
//! blocks:  records (version 1 encoding) of up to ~BLOCK_TARGET bytes, then u32 CRC-32 of them
//! index:   one 32-byte entry per block: u64 first id, u64 last id, u64 offset, u32 records, u32 length
//! shards:  one 32-byte entry per shard: u32 shard, u32 flags, u64 first seq, u64 count, u64 total
//! footer:  72 bytes: index offset, block count, shard count, record count, part, id range,
//!          flags, CRC-32 of index + shards + footer, magic "QLIST002"
//! ```
//!
//! This module is pure: it encodes into any [`Write`] ([`RunWriter`]) and decodes byte
//! slices ([`Footer::decode`], [`RunMeta::decode`], [`decode_block`]); where the bytes come
//! from (a file, an S3 object, a range of either) is the caller's business. Every decoding
//! error names the byte offset in the file. Where blocks start and end, as positions and
//! file offsets, is computed in one place ([`RangeStart::at_position`], [`next_boundary`],
//! [`is_block_boundary`], [`BlockEntry::record_bytes`]), so nothing outside this crate
//! repeats the arithmetic.

use std::io::{self, Write};

use crate::record::{
    decode_record_head, encode_record_head, Record, RecordRef, MAX_PAYLOAD, RECORD_HEAD_LEN,
};

/// The 8 bytes a run starts and ends with.
pub const MAGIC: [u8; 8] = *b"QLIST002";
/// The header is the magic alone: everything a reader needs is in the footer.
pub const HEADER_LEN: u64 = 8;
/// Fixed size of the footer at the end of every run.
pub const FOOTER_LEN: u64 = 72;
/// Bytes of one block's entry in the index.
pub const INDEX_ENTRY_LEN: u64 = 32;
/// Bytes of one shard's entry in the shard table.
pub const SHARD_ENTRY_LEN: u64 = 32;
/// The CRC-32 that ends every block.
pub const BLOCK_CRC_LEN: u64 = 4;
/// A block is closed once its records reach this many bytes: large enough that the index
/// stays small (32 bytes per 256 KiB: 0.01%) and a ranged read is worth its round trip,
/// small enough that a part of a split merge is even to within one block per input.
pub const BLOCK_TARGET: usize = 256 << 10;
/// What a reader reads of the tail first: the footer, index and shard table of a run of
/// up to ~2 GB (8k blocks) in one read; a larger run takes exactly one more.
pub const TAIL_GUESS: u64 = 256 << 10;
/// The most shards one run may list: a corrupt footer can then never make a reader
/// allocate more than 32 MiB for the table (qlist's shard numbers are u32, but a million
/// producers feeding one merge is far beyond any deployment it is built for).
pub const MAX_SHARDS: u64 = 1 << 20;
/// Flag bit of a shard entry: its producer finished its input, so `total` is the shard's size.
pub const SHARD_FINISHED: u32 = 1;

/// One block's entry in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockEntry {
    /// ID of the block's first record.
    pub first_id: u64,
    /// ID of the block's last record.
    pub last_id: u64,
    /// Byte offset of the block in the file.
    pub offset: u64,
    /// Records in the block (at least one).
    pub records: u32,
    /// Bytes of the block, its CRC included.
    pub len: u32,
}

impl BlockEntry {
    /// The byte range of the block in the file.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + u64::from(self.len)
    }
}

/// One shard's entry in the shard table: which of its items this run holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardEntry {
    /// The shard number.
    pub shard: u32,
    /// Its producer finished its input: `total` is the size of the whole shard.
    pub finished: bool,
    /// Seq of the first of its items in this run (0 when it holds none).
    pub first_seq: u64,
    /// Its items in this run: seqs `first_seq..first_seq + count`, each once.
    pub count: u64,
    /// Items of the whole shard (finished), or the items written so far (unfinished).
    pub total: u64,
}

impl ShardEntry {
    /// The run holds the whole shard: its producer finished and every seq `0..total` is here.
    pub fn complete(&self) -> bool {
        self.finished && self.first_seq == 0 && self.count == self.total
    }
}

/// Which part of a split merge a run is: part `index` of `count`, holding the IDs
/// `first_id..=last_id` of the whole list (empty when `first_id > last_id`). A whole list
/// is part 0 of 1 over `0..=u64::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// 0-based part number.
    pub index: u32,
    /// How many parts the list was split into (1: a whole list).
    pub count: u32,
    /// Smallest ID this part may hold.
    pub first_id: u64,
    /// Largest ID this part may hold.
    pub last_id: u64,
}

impl Part {
    /// A whole list: part 0 of 1, every ID.
    pub const WHOLE: Part = Part {
        index: 0,
        count: 1,
        first_id: 0,
        last_id: u64::MAX,
    };

    /// Whether `id` lies in this part's range.
    pub fn contains(&self, id: u64) -> bool {
        self.first_id <= id && id <= self.last_id
    }

    /// A whole list rather than one part of a split.
    pub fn is_whole(&self) -> bool {
        self.count == 1
    }

    /// The `count` that marks a follower's part ([`Part::follow`]): a follow has no
    /// known number of parts, so no split of a merge ever uses this one.
    pub const FOLLOW_COUNT: u32 = u32::MAX;

    /// Part number `index` of a follow (`merger follow`), holding IDs `first_id..=last_id`:
    /// the parts of a follow, in order, tile the ID space from 0 as far as the follower
    /// got; the last part of a finished follow ends at `u64::MAX`.
    pub fn follow(index: u32, first_id: u64, last_id: u64) -> Part {
        Part {
            index,
            count: Part::FOLLOW_COUNT,
            first_id,
            last_id,
        }
    }

    /// One part of a follow ([`Part::follow`]) rather than of a split.
    pub fn is_follow(&self) -> bool {
        self.count == Part::FOLLOW_COUNT
    }
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_follow() {
            return write!(f, "follow part {}", self.index);
        }
        write!(f, "part {}/{}", self.index, self.count)
    }
}

/// Everything that can be wrong with a run's bytes, or with what a writer is asked to
/// write. Decoding errors name the byte offset (from the start of the file).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The file is shorter than a header plus a footer.
    #[error("file is {len} bytes, shorter than the {min}-byte minimum of a run (header + footer): truncated or not a run")]
    TooShort {
        /// The file's length.
        len: u64,
        /// The smallest run: header plus footer.
        min: u64,
    },
    /// The magic at the start or the end is not `QLIST002`.
    #[error("byte {offset}: bad magic {}, expected \"QLIST002\": not a version 2 list.bin or truncated", found.escape_ascii())]
    BadMagic {
        /// Where the magic should be: 0, or the footer's end.
        offset: u64,
        /// The 8 bytes found there.
        found: [u8; 8],
    },
    /// The footer, index or shard table is inconsistent.
    #[error("byte {offset}: {what}")]
    BadMeta {
        /// Where the inconsistent part starts.
        offset: u64,
        /// What is inconsistent.
        what: String,
    },
    /// The CRC-32 over index, shard table and footer does not match.
    #[error("byte {offset}: metadata checksum mismatch: stored {stored:#010x}, computed {computed:#010x} (the index, shard table or footer is corrupt)")]
    MetaChecksum {
        /// Where the checksummed metadata starts.
        offset: u64,
        /// The CRC-32 the footer holds.
        stored: u32,
        /// The CRC-32 of the bytes read.
        computed: u32,
    },
    /// A block's CRC-32 does not match its bytes.
    #[error("byte {offset}: block {block} checksum mismatch: stored {stored:#010x}, computed {computed:#010x} (a record byte is corrupt)")]
    BlockChecksum {
        /// Where the block's CRC-32 is (its last 4 bytes).
        offset: u64,
        /// The block's index (0 for the first).
        block: u64,
        /// The CRC-32 its index entry holds.
        stored: u32,
        /// The CRC-32 of the bytes read.
        computed: u32,
    },
    /// A block's records do not match its index entry or are malformed.
    #[error("byte {offset}: block {block}: {what}")]
    BadBlock {
        /// Where the problem is.
        offset: u64,
        /// The block's index (0 for the first).
        block: u64,
        /// What is wrong.
        what: String,
    },
    /// A writer was handed a record that breaks the run's rules.
    #[error("refusing to write record id {id} (shard {shard}, seq {seq}): {what}")]
    Write {
        /// The record's ID.
        id: u64,
        /// Its shard.
        shard: u32,
        /// Its position in the shard.
        seq: u64,
        /// The rule it breaks.
        what: String,
    },
    /// A whole list (not a part) that does not hold all of a shard's items.
    #[error("shard {shard}: {count} items from seq {first_seq} written, but the shard has {total}: a whole list must hold every item of each of its shards")]
    Incomplete {
        /// The shard.
        shard: u32,
        /// The first position written.
        first_seq: u64,
        /// How many of its items were written.
        count: u64,
        /// How many items the shard has.
        total: u64,
    },
    /// [`RunWriter::restate`] was given a part or shards the records written do not fit.
    #[error("cannot restate the list being written: {what}")]
    Restate {
        /// What does not fit.
        what: String,
    },
    /// Reading a local run file failed.
    #[error("{}: {op}: {error}", path.display())]
    File {
        /// The run file.
        path: std::path::PathBuf,
        /// What was being done (`"open"`, `"read"`, ...).
        op: &'static str,
        /// In the message, not a `#[source]`: `{:#}` would print it twice.
        error: io::Error,
    },
    /// Writing failed.
    #[error("writing the run: {0}")]
    Io(#[from] io::Error),
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// The fixed-size footer, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    /// Offset of the index, which is where the blocks end.
    pub index_offset: u64,
    /// Entries in the index.
    pub blocks: u64,
    /// Entries in the shard table.
    pub shards: u64,
    /// Records in the run.
    pub records: u64,
    /// Which part of a split merge this is.
    pub part: Part,
    /// Reserved, 0.
    pub flags: u32,
    /// CRC-32 of index, shard table and the footer's first 60 bytes.
    pub meta_crc: u32,
}

impl Footer {
    /// Encodes the footer; `meta_crc` is written as given.
    pub fn encode(&self) -> [u8; FOOTER_LEN as usize] {
        let mut b = [0u8; FOOTER_LEN as usize];
        b[0..8].copy_from_slice(&self.index_offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.blocks.to_le_bytes());
        b[16..24].copy_from_slice(&self.shards.to_le_bytes());
        b[24..32].copy_from_slice(&self.records.to_le_bytes());
        b[32..36].copy_from_slice(&self.part.index.to_le_bytes());
        b[36..40].copy_from_slice(&self.part.count.to_le_bytes());
        b[40..48].copy_from_slice(&self.part.first_id.to_le_bytes());
        b[48..56].copy_from_slice(&self.part.last_id.to_le_bytes());
        b[56..60].copy_from_slice(&self.flags.to_le_bytes());
        b[60..64].copy_from_slice(&self.meta_crc.to_le_bytes());
        b[64..72].copy_from_slice(&MAGIC);
        b
    }

    /// Decodes and sanity-checks the last [`FOOTER_LEN`] bytes of a file of `file_len`
    /// bytes: the magic, and sizes that fit the file (so a corrupt count can never make
    /// a reader allocate or fetch more than the file holds).
    ///
    /// # Errors
    /// [`RunError::TooShort`], [`RunError::BadMagic`], [`RunError::BadMeta`].
    pub fn decode(b: &[u8], file_len: u64) -> Result<Footer, RunError> {
        let min = HEADER_LEN + FOOTER_LEN;
        if file_len < min || (b.len() as u64) < FOOTER_LEN {
            return Err(RunError::TooShort { len: file_len, min });
        }
        let b = &b[b.len() - FOOTER_LEN as usize..];
        let at = file_len - FOOTER_LEN;
        let mut found = [0u8; 8];
        found.copy_from_slice(&b[64..72]);
        if found != MAGIC {
            return Err(RunError::BadMagic {
                offset: at + 64,
                found,
            });
        }
        let f = Footer {
            index_offset: le_u64(b, 0),
            blocks: le_u64(b, 8),
            shards: le_u64(b, 16),
            records: le_u64(b, 24),
            part: Part {
                index: le_u32(b, 32),
                count: le_u32(b, 36),
                first_id: le_u64(b, 40),
                last_id: le_u64(b, 48),
            },
            flags: le_u32(b, 56),
            meta_crc: le_u32(b, 60),
        };
        f.check(file_len)?;
        Ok(f)
    }

    fn check(&self, file_len: u64) -> Result<(), RunError> {
        let at = file_len - FOOTER_LEN;
        let bad = |what: String| Err(RunError::BadMeta { offset: at, what });
        let meta = self
            .blocks
            .checked_mul(INDEX_ENTRY_LEN)
            .zip(self.shards.checked_mul(SHARD_ENTRY_LEN))
            .and_then(|(i, s)| i.checked_add(s));
        if self.shards > MAX_SHARDS {
            return bad(format!(
                "footer lists {} shards, above the limit of {MAX_SHARDS} (corrupt footer)",
                self.shards
            ));
        }
        if self.index_offset < HEADER_LEN || meta != Some(at.saturating_sub(self.index_offset)) {
            return bad(format!(
                "footer says the index starts at byte {} with {} blocks and {} shards, which does not fit a {file_len}-byte file (corrupt footer or truncated file)",
                self.index_offset, self.blocks, self.shards
            ));
        }
        if self.part.count == 0 || self.part.index >= self.part.count {
            return bad(format!(
                "footer says part {} of {} (corrupt footer)",
                self.part.index, self.part.count
            ));
        }
        if self.flags != 0 {
            return bad(format!(
                "footer flags {:#x}: written by a newer qlist?",
                self.flags
            ));
        }
        Ok(())
    }

    /// Bytes of index, shard table and footer: what a reader must have of the tail.
    pub fn meta_len(&self, file_len: u64) -> u64 {
        file_len - self.index_offset
    }
}

/// What a run's tail says about it: its footer, index and shard table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunMeta {
    /// The file's size.
    pub file_len: u64,
    /// The decoded footer.
    pub footer: Footer,
    /// The index, in file (and ID) order.
    pub blocks: Vec<BlockEntry>,
    /// The shard table, by shard number.
    pub shards: Vec<ShardEntry>,
}

impl RunMeta {
    /// Decodes the metadata of a run of `file_len` bytes from `tail`, the file's last
    /// bytes: at least [`Footer::meta_len`] of them (more is fine).
    ///
    /// Checks the metadata CRC, that blocks are contiguous from the header to the index,
    /// in strictly increasing ID order, inside the part's range, and that the shard table
    /// is sorted and adds up to the record count.
    ///
    /// # Errors
    /// [`RunError::MetaChecksum`], [`RunError::BadMeta`], and the footer's errors. A
    /// `tail` shorter than the metadata is [`RunError::BadMeta`] (a caller bug).
    pub fn decode(file_len: u64, tail: &[u8]) -> Result<RunMeta, RunError> {
        let footer = Footer::decode(tail, file_len)?;
        let meta_len = footer.meta_len(file_len);
        if (tail.len() as u64) < meta_len {
            return Err(RunError::BadMeta {
                offset: footer.index_offset,
                what: format!(
                    "{} bytes of the tail given, the metadata is {meta_len}",
                    tail.len()
                ),
            });
        }
        let meta = &tail[tail.len() - meta_len as usize..];
        let crc_end = meta.len() - 12;
        let computed = crc32fast::hash(&meta[..crc_end]);
        if computed != footer.meta_crc {
            return Err(RunError::MetaChecksum {
                offset: file_len - 12,
                stored: footer.meta_crc,
                computed,
            });
        }
        let index_len = (footer.blocks * INDEX_ENTRY_LEN) as usize;
        let blocks = meta[..index_len]
            .chunks_exact(INDEX_ENTRY_LEN as usize)
            .map(|e| BlockEntry {
                first_id: le_u64(e, 0),
                last_id: le_u64(e, 8),
                offset: le_u64(e, 16),
                records: le_u32(e, 24),
                len: le_u32(e, 28),
            })
            .collect();
        let shard_end = index_len + (footer.shards * SHARD_ENTRY_LEN) as usize;
        let shards = meta[index_len..shard_end]
            .chunks_exact(SHARD_ENTRY_LEN as usize)
            .map(|e| ShardEntry {
                shard: le_u32(e, 0),
                finished: le_u32(e, 4) & SHARD_FINISHED != 0,
                first_seq: le_u64(e, 8),
                count: le_u64(e, 16),
                total: le_u64(e, 24),
            })
            .collect();
        let meta = RunMeta {
            file_len,
            footer,
            blocks,
            shards,
        };
        meta.check_index()?;
        meta.check_shards()?;
        Ok(meta)
    }

    fn check_index(&self) -> Result<(), RunError> {
        let mut next_offset = HEADER_LEN;
        let mut prev_last: Option<u64> = None;
        let mut records = 0u64;
        let part = self.footer.part;
        for (i, b) in self.blocks.iter().enumerate() {
            let at = self.footer.index_offset + i as u64 * INDEX_ENTRY_LEN;
            let bad = |what: String| Err(RunError::BadMeta { offset: at, what });
            let min_len = u64::from(b.records) * RECORD_HEAD_LEN as u64 + BLOCK_CRC_LEN;
            if b.offset != next_offset || b.records == 0 || u64::from(b.len) < min_len {
                return bad(format!(
                    "index entry {i} (offset {}, {} records, {} bytes) does not follow the block before it at byte {next_offset}",
                    b.offset, b.records, b.len
                ));
            }
            if b.first_id > b.last_id || prev_last.is_some_and(|p| b.first_id <= p) {
                return bad(format!(
                    "index entry {i}: ids {}..={} are not above the previous block's",
                    b.first_id, b.last_id
                ));
            }
            if !part.contains(b.first_id) || !part.contains(b.last_id) {
                return bad(format!(
                    "index entry {i}: ids {}..={} lie outside {part}'s range {}..={}",
                    b.first_id, b.last_id, part.first_id, part.last_id
                ));
            }
            next_offset += u64::from(b.len);
            prev_last = Some(b.last_id);
            records += u64::from(b.records);
        }
        if next_offset != self.footer.index_offset || records != self.footer.records {
            return Err(RunError::BadMeta {
                offset: self.footer.index_offset,
                what: format!(
                    "the index's blocks end at byte {next_offset} with {records} records; the footer says {} and {}",
                    self.footer.index_offset, self.footer.records
                ),
            });
        }
        Ok(())
    }

    fn check_shards(&self) -> Result<(), RunError> {
        let table = self.footer.index_offset + self.footer.blocks * INDEX_ENTRY_LEN;
        let mut records = 0u64;
        for (i, s) in self.shards.iter().enumerate() {
            let at = table + i as u64 * SHARD_ENTRY_LEN;
            let bad = |what: String| Err(RunError::BadMeta { offset: at, what });
            if i > 0 && self.shards[i - 1].shard >= s.shard {
                return bad(format!(
                    "shard table entry {i} (shard {}) is not above the one before it",
                    s.shard
                ));
            }
            let end = s.first_seq.checked_add(s.count);
            if end.is_none_or(|e| s.finished && e > s.total) {
                return bad(format!(
                    "shard {}: seqs {}.. ({} items) exceed its {} items",
                    s.shard, s.first_seq, s.count, s.total
                ));
            }
            records = records.saturating_add(s.count);
        }
        if records != self.footer.records {
            return Err(RunError::BadMeta {
                offset: table,
                what: format!(
                    "the shard table counts {records} records, the footer {}",
                    self.footer.records
                ),
            });
        }
        Ok(())
    }

    /// The shard entry of `shard`, if this run lists it.
    pub fn shard(&self, shard: u32) -> Option<&ShardEntry> {
        self.shards
            .binary_search_by_key(&shard, |s| s.shard)
            .ok()
            .map(|i| &self.shards[i])
    }

    /// Records in the run.
    pub fn records(&self) -> u64 {
        self.footer.records
    }

    /// Which part of a split merge this run is.
    pub fn part(&self) -> Part {
        self.footer.part
    }

    /// The blocks that may hold IDs in `first..=last`: a contiguous slice of the index.
    pub fn blocks_in(&self, first: u64, last: u64) -> &[BlockEntry] {
        let start = self.blocks.partition_point(|b| b.last_id < first);
        let end = self.blocks.partition_point(|b| b.first_id <= last);
        &self.blocks[start..end.max(start)]
    }
}

/// Decodes and checks one block: `bytes` are exactly the block (`entry.len` bytes, its
/// CRC last), `block` its number in the index. The checks of [`check_block`], then each
/// record copied out.
///
/// # Errors
/// [`RunError::BlockChecksum`], [`RunError::BadBlock`], naming the byte offset.
pub fn decode_block(bytes: &[u8], entry: &BlockEntry, block: u64) -> Result<Vec<Record>, RunError> {
    let body = check_block(bytes, entry, block)?;
    Ok(BlockRecords::new(body).map(|r| r.to_record()).collect())
}

/// Checks one block without copying a record: `bytes` are exactly the block
/// (`entry.len` bytes, its CRC last), `block` its number in the index. Checks the CRC
/// first, then that the records fill the block exactly, match the entry's count and IDs,
/// strictly increase, and carry payloads no longer than [`MAX_PAYLOAD`]. Returns the
/// records' bytes (the block without its CRC), which [`BlockRecords`] walks.
///
/// # Errors
/// [`RunError::BlockChecksum`], [`RunError::BadBlock`], naming the byte offset.
pub fn check_block<'b>(
    bytes: &'b [u8],
    entry: &BlockEntry,
    block: u64,
) -> Result<&'b [u8], RunError> {
    let body = checked_block_body(bytes, entry, block)?;
    let (mut pos, mut count) = (0usize, 0u64);
    let (mut first, mut last): (Option<u64>, Option<u64>) = (None, None);
    while pos < body.len() {
        let at = entry.offset + pos as u64;
        let (record, end) = record_at(body, pos).map_err(|what| bad_block(at, block, what))?;
        if let Some(prev) = last.filter(|&p| record.id <= p) {
            return Err(bad_block(
                at,
                block,
                format!(
                    "record id {} is not above the previous id {prev}",
                    record.id
                ),
            ));
        }
        first = first.or(Some(record.id));
        last = Some(record.id);
        count += 1;
        pos = end;
    }
    if count != u64::from(entry.records)
        || first != Some(entry.first_id)
        || last != Some(entry.last_id)
    {
        return Err(bad_block(
            entry.offset,
            block,
            format!(
                "holds {count} records with ids {first:?}..={last:?}; the index says {} records {}..={}",
                entry.records, entry.first_id, entry.last_id
            ),
        ));
    }
    Ok(body)
}

/// The records of a checked block body ([`check_block`]) in order, borrowed. On bytes
/// that were not checked it stops at the first malformed record.
pub struct BlockRecords<'b> {
    body: &'b [u8],
    pos: usize,
}

impl<'b> BlockRecords<'b> {
    /// Walks `body`, records' bytes as [`check_block`] returns them.
    pub fn new(body: &'b [u8]) -> BlockRecords<'b> {
        BlockRecords { body, pos: 0 }
    }
}

impl<'b> Iterator for BlockRecords<'b> {
    type Item = RecordRef<'b>;

    fn next(&mut self) -> Option<RecordRef<'b>> {
        let (record, end) = record_at(self.body, self.pos).ok()?;
        self.pos = end;
        Some(record)
    }
}

/// A [`RunError::BadBlock`]: `what` is wrong at byte `offset`, in block `block`.
fn bad_block(offset: u64, block: u64, what: String) -> RunError {
    RunError::BadBlock {
        offset,
        block,
        what,
    }
}

/// The records' bytes of a block (`bytes` without its CRC) once its length matches the
/// index and its CRC its bytes.
fn checked_block_body<'b>(
    bytes: &'b [u8],
    entry: &BlockEntry,
    block: u64,
) -> Result<&'b [u8], RunError> {
    if bytes.len() as u64 != u64::from(entry.len) {
        return Err(bad_block(
            entry.offset,
            block,
            format!("{} bytes read, the index says {}", bytes.len(), entry.len),
        ));
    }
    let body = &bytes[..bytes.len() - BLOCK_CRC_LEN as usize];
    let stored = le_u32(bytes, body.len());
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(RunError::BlockChecksum {
            offset: entry.offset + body.len() as u64,
            block,
            stored,
            computed,
        });
    }
    Ok(body)
}

/// The record at `pos` of a block's `body`, borrowed, and where the next one starts; or
/// what is wrong with it: fixed fields or a payload running past the body's end, or a
/// payload longer than [`MAX_PAYLOAD`].
///
/// # Errors
/// A message saying what is wrong (the caller adds where).
pub fn record_at(body: &[u8], pos: usize) -> Result<(RecordRef<'_>, usize), String> {
    let Some(head) = body.get(pos..pos + RECORD_HEAD_LEN) else {
        return Err("a record's fixed fields run past the block's end".into());
    };
    let mut h = [0u8; RECORD_HEAD_LEN];
    h.copy_from_slice(head);
    let (id, shard, seq, len) = decode_record_head(&h);
    let start = pos + RECORD_HEAD_LEN;
    let end = (len <= MAX_PAYLOAD as u64)
        .then(|| start + len as usize)
        .filter(|&e| e <= body.len())
        .ok_or_else(|| {
            format!("record id {id} claims a {len}-byte payload, past the block's end")
        })?;
    let record = RecordRef {
        id,
        shard,
        seq,
        payload: &body[start..end],
        encoded: &body[pos..end],
    };
    Ok((record, end))
}

mod check;
mod file;
mod layout;
mod ranged;
mod writer;
pub use check::{holds_all, SeqCheck, ShardSpec, WriteCheck};
pub use file::RunFile;
pub use layout::{is_block_boundary, next_boundary, RangeStart};
pub use ranged::{RangeRead, RangedError, RangedRun, RunBlocks, RunRecords};
pub use writer::{RangeWritten, RunWriter};

#[cfg(test)]
mod tests;

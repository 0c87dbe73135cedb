//! Where a run's blocks start and end, from the records' bytes alone: the layout's
//! arithmetic in one place, for the writer and for whoever plans around its blocks
//! (`merger --jobs` places its ranges with it before anything is merged).
//!
//! A list's *position* is the bytes of its records from its start, CRCs not counted. A
//! block closes after the record that reaches or passes the next multiple of
//! [`BLOCK_TARGET`] above the position where the block opened.

use super::{BlockEntry, BLOCK_CRC_LEN, BLOCK_TARGET, HEADER_LEN};
use crate::record::RECORD_HEAD_LEN;

/// Where a range of a list starts ([`super::RunWriter::range`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeStart {
    /// File offset of its first block.
    pub offset: u64,
    /// Record bytes (CRCs not counted) of the whole list before it: a block boundary.
    pub position: u64,
}

impl RangeStart {
    /// Where every list's first block starts: right after the header, at position 0.
    pub const FIRST: RangeStart = RangeStart {
        offset: HEADER_LEN,
        position: 0,
    };

    /// Where the block that opens at `position` lies in the file: after the header, the
    /// record bytes before it and one CRC per block before it. `position` must be where a
    /// block closed (or 0), in a list whose records are each at most [`BLOCK_TARGET`]
    /// bytes encoded: then each block before it passed exactly one multiple of the
    /// target, so there are `position / BLOCK_TARGET` of them ([`may_hold_long_record`]
    /// tells a block that cannot promise this).
    ///
    /// [`may_hold_long_record`]: BlockEntry::may_hold_long_record
    pub fn at_position(position: u64) -> RangeStart {
        RangeStart {
            offset: HEADER_LEN + position + BLOCK_CRC_LEN * (position / BLOCK_TARGET as u64),
            position,
        }
    }
}

/// The position at which a block open at `position` closes: the next multiple of
/// [`BLOCK_TARGET`] above it.
pub fn next_boundary(position: u64) -> u64 {
    (position / BLOCK_TARGET as u64 + 1) * BLOCK_TARGET as u64
}

/// Whether a record that ends at `position` ends its block there: `position` is a
/// multiple of [`BLOCK_TARGET`] (0 included: the list's start, where the first block
/// opens). The next record then starts a block.
pub fn is_block_boundary(position: u64) -> bool {
    position.is_multiple_of(BLOCK_TARGET as u64)
}

impl BlockEntry {
    /// Bytes of the block's records: its length less its CRC (the position it adds).
    pub fn record_bytes(&self) -> u64 {
        u64::from(self.len).saturating_sub(BLOCK_CRC_LEN)
    }

    /// Whether the block may hold a record longer than [`BLOCK_TARGET`] bytes encoded,
    /// judged from its index entry alone: its record bytes less the least its other
    /// records take (a head each) is above the target. Such a record may pass two
    /// multiples of the target, so block boundaries after it cannot be placed in advance
    /// ([`RangeStart::at_position`]).
    pub fn may_hold_long_record(&self) -> bool {
        let others = u64::from(self.records).saturating_sub(1) * RECORD_HEAD_LEN as u64;
        self.record_bytes().saturating_sub(others) > BLOCK_TARGET as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{encoded_len, rec};
    use crate::run::{Part, RunMeta, RunWriter, ShardSpec};

    const T: u64 = BLOCK_TARGET as u64;

    fn entry(records: u32, len: u32) -> BlockEntry {
        BlockEntry {
            first_id: 1,
            last_id: 1,
            offset: HEADER_LEN,
            records,
            len,
        }
    }

    /// One shard's records with these payload lengths, written as a whole list.
    fn written(payloads: &[usize]) -> RunMeta {
        let spec = ShardSpec {
            shard: 0,
            finished: true,
            total: payloads.len() as u64,
        };
        let mut w = RunWriter::new(Vec::new(), vec![spec], Part::WHOLE).expect("new");
        for (i, &len) in payloads.iter().enumerate() {
            w.write(&rec(i as u64 + 1, 0, i as u64, &vec![7; len]))
                .expect("write");
        }
        w.finish().expect("finish").1
    }

    #[test]
    fn boundaries_are_the_multiples_of_the_target() {
        assert_eq!(next_boundary(0), T);
        assert_eq!(next_boundary(T - 1), T);
        assert_eq!(next_boundary(T), 2 * T);
        assert_eq!(next_boundary(2 * T + 5), 3 * T);
        for p in [0, T, 2 * T, 7 * T] {
            assert!(is_block_boundary(p), "{p}");
        }
        for p in [1, T - 1, T + 1, 2 * T - 1] {
            assert!(!is_block_boundary(p), "{p}");
        }
    }

    #[test]
    fn a_position_gives_its_file_offset() {
        assert_eq!(RangeStart::FIRST, RangeStart::at_position(0));
        assert_eq!(
            RangeStart::FIRST,
            RangeStart {
                offset: 8,
                position: 0
            }
        );
        // One block closed before position T + 5, two before 2T + 9: a CRC each.
        assert_eq!(
            RangeStart::at_position(T + 5),
            RangeStart {
                offset: 8 + T + 5 + 4,
                position: T + 5
            }
        );
        assert_eq!(RangeStart::at_position(2 * T + 9).offset, 8 + 2 * T + 9 + 8);
    }

    /// Against the writer itself: every block starts where its position says.
    #[test]
    fn every_written_block_starts_at_its_position() {
        let payloads: Vec<usize> = (0..6000).map(|i| 10 + (i * 7919) % 900).collect();
        let meta = written(&payloads);
        assert!(meta.blocks.len() > 5, "{} blocks", meta.blocks.len());
        let mut position = 0;
        for b in &meta.blocks {
            assert_eq!(RangeStart::at_position(position).offset, b.offset, "{b:?}");
            assert!(!b.may_hold_long_record(), "{b:?}");
            position += b.record_bytes();
        }
        let records: u64 = payloads.iter().map(|&p| encoded_len(p) as u64).sum();
        assert_eq!(position, records, "record bytes of every block, summed");
        // The last block is closed by the end of the list, not by a boundary.
        assert_eq!(
            meta.footer.index_offset,
            HEADER_LEN + position + BLOCK_CRC_LEN * meta.blocks.len() as u64
        );
    }

    #[test]
    fn a_long_record_is_told_from_the_entry() {
        let head = RECORD_HEAD_LEN as u32;
        let t = BLOCK_TARGET as u32;
        assert_eq!(entry(1, 34).record_bytes(), 30);
        // One record: its bytes alone.
        assert!(!entry(1, t + 4).may_hold_long_record());
        assert!(entry(1, t + 5).may_hold_long_record());
        // Three records: the other two take a head each at least.
        assert!(!entry(3, t + 2 * head + 4).may_hold_long_record());
        assert!(entry(3, t + 2 * head + 5).may_hold_long_record());
        // From the writer: a payload of the target's size, and small ones.
        let long = written(&[100, BLOCK_TARGET, 100]);
        assert!(long.blocks.iter().any(BlockEntry::may_hold_long_record));
        let short = written(&[100; 5000]);
        assert!(!short.blocks.iter().any(BlockEntry::may_hold_long_record));
    }
}

//! What every format here stores: one item of the list, and the payload limit all
//! writers and readers keep. A leaf: the formats import it, it imports none of them.

/// The largest payload of one item anywhere in qlist: the producer refuses longer input
/// items, and list.bin readers refuse longer payload lengths, so a corrupt length can never
/// make a reader allocate more than this.
pub const MAX_PAYLOAD: usize = 16 << 20;

/// One item of the list: its ID, the shard that produced it, its 0-based position in
/// that producer's input, and its payload. Field order and types are the list.bin record
/// layout (bincode legacy fixed-int encoding of this struct).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    /// Its ID, unique in the whole list: the order of the list.
    pub id: u64,
    /// The shard (producer) that wrote it.
    pub shard: u32,
    /// Its 0-based position in that producer's input.
    pub seq: u64,
    /// The item's bytes, at most [`MAX_PAYLOAD`].
    pub payload: Vec<u8>,
}

/// The tests' shorthand for a record holding a copy of `payload`.
#[cfg(test)]
pub(crate) fn rec(id: u64, shard: u32, seq: u64, payload: &[u8]) -> Record {
    Record {
        id,
        shard,
        seq,
        payload: payload.to_vec(),
    }
}

/// One item borrowed from the bytes it was decoded from (a run's block): what a merge
/// hands its writer without copying the payload. `encoded` is the whole record as
/// list.bin stores it (fixed fields, then the payload), so a writer of the same encoding
/// copies it in one piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// Its ID, unique in the whole list: the order of the list.
    pub id: u64,
    /// The shard (producer) that wrote it.
    pub shard: u32,
    /// Its 0-based position in that producer's input.
    pub seq: u64,
    /// The item's bytes, a slice of `encoded`.
    pub payload: &'a [u8],
    /// The record's encoded bytes: the 28-byte head, then `payload`.
    pub encoded: &'a [u8],
}

impl RecordRef<'_> {
    /// An owned copy.
    pub fn to_record(&self) -> Record {
        Record {
            id: self.id,
            shard: self.shard,
            seq: self.seq,
            payload: self.payload.to_vec(),
        }
    }
}

// The record codec: list.bin's record encoding (both versions store records this way).

/// Fixed part of a record before its payload: id u64, shard u32, seq u64, length u64.
pub const RECORD_HEAD_LEN: usize = 8 + 4 + 8 + 8;

/// Bytes of one record encoded with a payload of `payload_len` bytes: its head, then the
/// payload.
pub fn encoded_len(payload_len: usize) -> usize {
    RECORD_HEAD_LEN + payload_len
}

/// Encodes the fixed part of a record (everything but the payload bytes): the same bytes
/// `bincode::serialize` produces for the first four fields, written by hand for speed.
pub fn encode_record_head(record: &Record) -> [u8; RECORD_HEAD_LEN] {
    let mut head = [0u8; RECORD_HEAD_LEN];
    head[0..8].copy_from_slice(&record.id.to_le_bytes());
    head[8..12].copy_from_slice(&record.shard.to_le_bytes());
    head[12..20].copy_from_slice(&record.seq.to_le_bytes());
    head[20..28].copy_from_slice(&(record.payload.len() as u64).to_le_bytes());
    head
}

/// Appends one full encoded record to `out` (used by tools that build list.bin bytes
/// themselves, e.g. benchmarks and tests).
pub fn encode_record(record: &Record, out: &mut Vec<u8>) {
    out.extend_from_slice(&encode_record_head(record));
    out.extend_from_slice(&record.payload);
}

/// The fixed fields of an encoded record head: id, shard, seq, payload length.
pub fn decode_record_head(head: &[u8; RECORD_HEAD_LEN]) -> (u64, u32, u64, u64) {
    (
        u64::from_le_bytes(le8(&head[0..8])),
        u32::from_le_bytes([head[8], head[9], head[10], head[11]]),
        u64::from_le_bytes(le8(&head[12..20])),
        u64::from_le_bytes(le8(&head[20..28])),
    )
}

fn le8(b: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_encoding_is_bincode_legacy_fixint() {
        let r = rec(0x1122_3344_5566_7788, 0xAABB_CCDD, 42, b"hi\x00\xff");
        let mut ours = Vec::new();
        encode_record(&r, &mut ours);
        assert_eq!(ours, bincode::serialize(&r).expect("bincode"));
        let expected: Vec<u8> = [
            &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11][..],
            &[0xDD, 0xCC, 0xBB, 0xAA],
            &[42, 0, 0, 0, 0, 0, 0, 0],
            &[4, 0, 0, 0, 0, 0, 0, 0],
            b"hi\x00\xff",
        ]
        .concat();
        assert_eq!(ours, expected);
    }

    #[test]
    fn encoded_len_is_head_and_payload() {
        let mut bytes = Vec::new();
        encode_record(&rec(1, 2, 3, b"four"), &mut bytes);
        assert_eq!(encoded_len(4), bytes.len());
        assert_eq!(encoded_len(0), 28);
    }
}

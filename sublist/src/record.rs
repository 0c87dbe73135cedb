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
    pub id: u64,
    pub shard: u32,
    pub seq: u64,
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
    pub id: u64,
    pub shard: u32,
    pub seq: u64,
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

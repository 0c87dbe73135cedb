//! sublist: the on-disk formats of qlist, one owner per format.
//!
//! - [`shard`]: a producer's sublist, one RocksDB database `DIR/shard-<n>` (written by the
//!   producer, read by the merger).
//! - [`listbin`]: `list.bin`, the merger's output (writer, streaming reader, verifier).

pub mod listbin;
pub mod shard;

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

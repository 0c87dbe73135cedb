//! sublist: a producer's sublist, one RocksDB database `DIR/shard-<n>` ([`shard`]),
//! written durably and resumably by the producer and read by the merger. Its names and
//! its schema are `qformat`'s ([`qformat::names`], [`qformat::shard`]); this crate is the
//! only one that links RocksDB for them.

pub mod shard;

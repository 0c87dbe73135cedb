//! The RocksDB sublist schema (owned by the producer work).

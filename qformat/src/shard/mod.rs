//! The schema of a producer's sublist, one RocksDB database `DIR/shard-<n>`
//! ([`crate::names`]): its keys and values as plain bytes, encoded and decoded here. The
//! database itself (opening, writing, reading it with RocksDB) is the `sublist` crate's,
//! which builds on these; this crate does not link RocksDB.
//!
//! # Schema (format version 1)
//!
//! Two column families. All integers are fixed width; IDs in keys are big-endian so that
//! RocksDB's bytewise key order is ID order, everything else is little-endian.
//!
//! Column family `default`: the items, and nothing else.
//!
//! | key                  | value                                                     |
//! |----------------------|-----------------------------------------------------------|
//! | u64 ID, big-endian   | u32 shard (LE), u64 seq (LE), payload bytes (rest, may be empty) |
//!
//! Column family `meta`: what the database is and how far the producer got.
//!
//! | key        | value                                                                 |
//! |------------|-----------------------------------------------------------------------|
//! | `format`   | the 14 ASCII bytes `qlist-shard-v1`                                   |
//! | `shard`    | u32 shard number (LE)                                                 |
//! | `progress` | the progress marker, see below (absent until the first batch)         |
//!
//! The progress marker:
//!
//! ```text
//! u64 next_seq   (LE)  items 0..next_seq are in the sublist, exactly once each
//! u8  finished         1 once the producer reached the end of its input, else 0
//! u64 last_id    (LE)  the highest ID in the sublist (0 while it is empty)
//! u32 fp_len     (LE)  length of the input fingerprint
//! fp_len bytes         the input fingerprint (opaque to this module, UTF-8 by convention)
//! ```
//!
//! Every batch of items is written together with the new progress marker in one
//! `WriteBatch` with `sync = true`, so after a crash the marker and the items agree: a
//! producer resumes at `next_seq` and never writes an item twice or loses one.
//!
//! A database is created under `DIR/.creating-shard-<n>` with both column families and the
//! `format` and `shard` keys (synced), then renamed to `DIR/shard-<n>`: a crash during
//! creation never leaves a half-made `shard-<n>` (the next writer completes the leftover).
//! Compression is off (no codec is built).

use crate::record::Record;

/// Name of the column family holding the metadata (never seen by item iteration).
pub const META_CF: &str = "meta";
/// Value of the `format` key: the schema version this module writes and reads.
pub const FORMAT: &[u8] = b"qlist-shard-v1";

/// `meta` key: the schema version ([`FORMAT`]).
pub const KEY_FORMAT: &[u8] = b"format";
/// `meta` key: the shard number, u32 LE.
pub const KEY_SHARD: &[u8] = b"shard";
/// `meta` key: the progress marker ([`ProgressMarker`]).
pub const KEY_PROGRESS: &[u8] = b"progress";
/// Bytes of an item value before the payload: u32 shard + u64 seq.
pub const VALUE_HEADER: usize = 12;
/// Bytes of the progress marker before the fingerprint.
pub const PROGRESS_HEADER: usize = 8 + 1 + 8 + 4;

/// How far a producer got: written in the same atomic batch as the items it describes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProgressMarker {
    /// Items with seq `0..next_seq` are in the sublist, each exactly once.
    pub next_seq: u64,
    /// The producer reached the end of its input: nothing more will be written.
    pub finished: bool,
    /// The highest ID in the sublist (0 while it is empty).
    pub last_id: u64,
    /// Identifies the producer's input, so a restart with different input is refused.
    pub fingerprint: Vec<u8>,
}

impl ProgressMarker {
    /// The marker's stored bytes (see the module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(PROGRESS_HEADER + self.fingerprint.len());
        out.extend_from_slice(&self.next_seq.to_le_bytes());
        out.push(u8::from(self.finished));
        out.extend_from_slice(&self.last_id.to_le_bytes());
        // A fingerprint is a short description; anything above u32 is a caller bug.
        let len = u32::try_from(self.fingerprint.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&self.fingerprint[..len as usize]);
        out
    }

    /// Parses the stored bytes; `Err` carries a reason.
    pub fn decode(bytes: &[u8]) -> Result<ProgressMarker, String> {
        if bytes.len() < PROGRESS_HEADER {
            return Err(format!(
                "progress marker has {} bytes, at least {PROGRESS_HEADER} expected",
                bytes.len()
            ));
        }
        let next_seq = u64::from_le_bytes(bytes[0..8].try_into().map_err(|_| "short")?);
        let finished = match bytes[8] {
            0 => false,
            1 => true,
            b => return Err(format!("progress marker: finished flag is {b}, not 0 or 1")),
        };
        let last_id = u64::from_le_bytes(bytes[9..17].try_into().map_err(|_| "short")?);
        let len = u32::from_le_bytes(bytes[17..21].try_into().map_err(|_| "short")?) as usize;
        if bytes.len() != PROGRESS_HEADER + len {
            return Err(format!(
                "progress marker has {} bytes, {} expected for a {len}-byte fingerprint",
                bytes.len(),
                PROGRESS_HEADER + len
            ));
        }
        Ok(ProgressMarker {
            next_seq,
            finished,
            last_id,
            fingerprint: bytes[PROGRESS_HEADER..].to_vec(),
        })
    }
}

/// An item's key: its ID, big-endian.
pub fn encode_key(id: u64) -> [u8; 8] {
    id.to_be_bytes()
}

/// An item's value: u32 shard LE, u64 seq LE, payload.
pub fn encode_value(shard: u32, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(VALUE_HEADER + payload.len());
    v.extend_from_slice(&shard.to_le_bytes());
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// Parses one stored item; `Err` carries a reason.
pub fn decode_item(key: &[u8], value: &[u8]) -> Result<Record, String> {
    let id: [u8; 8] = key
        .try_into()
        .map_err(|_| format!("item key has {} bytes, 8 expected", key.len()))?;
    if value.len() < VALUE_HEADER {
        return Err(format!(
            "item value has {} bytes, at least {VALUE_HEADER} expected",
            value.len()
        ));
    }
    let shard = u32::from_le_bytes(value[0..4].try_into().map_err(|_| "short")?);
    let seq = u64::from_le_bytes(value[4..12].try_into().map_err(|_| "short")?);
    Ok(Record {
        id: u64::from_be_bytes(id),
        shard,
        seq,
        payload: value[VALUE_HEADER..].to_vec(),
    })
}

#[cfg(test)]
mod tests;

//! list.bin: the merger's output, one file holding every item in strictly increasing ID order.
//!
//! Layout (little-endian throughout, see `docs/list-format.md`):
//!
//! ```text
//! header:  8 bytes magic "QLIST001", u64 record count
//! record:  u64 id, u32 shard, u64 seq, u64 payload length, payload bytes
//!          (bincode 1.3 legacy fixed-int encoding of `Record`)
//! footer:  u32 CRC-32 (IEEE, as zlib's crc32) of all record bytes
//! ```
//!
//! - `ListWriter` (only with the `v1-writer` feature, which only tests and benchmarks turn
//!   on: merges write runs, version 2) writes a temporary file next to the target, fsyncs
//!   it, renames it into place and fsyncs the directory, so a reader never sees a torn
//!   list.bin; a writer that is dropped before `finish` (or fails) removes its temporary
//!   file.
//! - [`ListReader`] streams records back as `Result<Record, ListError>`, checking framing,
//!   strict ID order, the count and the checksum as it goes; every error names a byte offset.
//! - [`verify`] reads a whole file and returns a [`Summary`] or the first problem.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::record::{decode_record_head, Record, MAX_PAYLOAD, RECORD_HEAD_LEN};

// The version 1 writer: merges write runs (version 2) now, so only tests and benchmarks
// make version 1 files, to check that they stay readable.
#[cfg(any(test, feature = "v1-writer"))]
mod writer;
#[cfg(any(test, feature = "v1-writer"))]
pub use writer::ListWriter;

/// The footer's checksum (CRC-32 IEEE), re-exported so tools that produce list.bin bytes
/// themselves (benchmarks, tests) compute exactly the same one.
pub use crc32fast::Hasher as Crc32;

/// The 8 bytes every list.bin starts with; the digits version the format.
pub const MAGIC: [u8; 8] = *b"QLIST001";
/// Magic plus the u64 record count.
pub const HEADER_LEN: u64 = 16;
/// The u32 CRC-32 after the last record.
pub const FOOTER_LEN: u64 = 4;
/// Large buffers: list.bin is written and read strictly sequentially, and the default 8 KiB
/// would cost one syscall per ~60 records.
const IO_BUFFER: usize = 1 << 20;

/// Everything that can go wrong writing or reading a list.bin. Format errors carry the byte
/// offset (from the start of the file) of the first problem found.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// An operating-system error on the named file.
    #[error("{path}: {op}: {error}")]
    Io {
        /// The file the operation was on.
        path: PathBuf,
        /// What was being done (`"open"`, `"write"`, `"fsync"`, ...).
        op: &'static str,
        /// In the message, not a `#[source]`: `{:#}` would print it twice.
        error: io::Error,
    },
    /// The list is complete and renamed into place, but the fsync of its directory
    /// failed: the file is there and readable, but a crash now could lose the rename.
    #[error("{} is complete, but fsync of its directory {} failed ({error}): a crash now could lose it; rerun to be sure", path.display(), dir.display())]
    NotDurable {
        /// The complete list.bin.
        path: PathBuf,
        /// Its directory, whose fsync failed.
        dir: PathBuf,
        /// In the message, not a `#[source]`: `{:#}` would print it twice.
        error: io::Error,
    },
    /// The directory that should receive the output does not exist.
    #[error("output directory {} does not exist", dir.display())]
    MissingDir {
        /// The missing directory.
        dir: PathBuf,
    },
    /// The writer was handed IDs that are not strictly increasing.
    #[error(
        "refusing to write record id {id} after id {prev}: list.bin ids must strictly increase"
    )]
    WriteOrder {
        /// The last ID written.
        prev: u64,
        /// The ID refused, not above `prev`.
        id: u64,
    },
    /// The file is shorter than a header plus a footer.
    #[error("file is {len} bytes, shorter than the {min}-byte minimum (header + footer): not a list.bin or truncated")]
    TooShort {
        /// The file's length.
        len: u64,
        /// [`HEADER_LEN`] + [`FOOTER_LEN`].
        min: u64,
    },
    /// The first 8 bytes are not `QLIST001`.
    #[error("byte 0: bad magic {}, expected \"QLIST001\": not a list.bin", found.escape_ascii())]
    BadMagic {
        /// The file's first 8 bytes.
        found: [u8; 8],
    },
    /// A record's fixed part or payload runs past the start of the footer.
    #[error("byte {offset}: record {index} is truncated: its {what} needs {need} bytes but only {have} remain before the footer")]
    Truncated {
        /// The offset of the record's start.
        offset: u64,
        /// The record's index (0 for the first).
        index: u64,
        /// The part that runs past the footer (`"fixed fields"` or `"payload"`).
        what: &'static str,
        /// The bytes that part needs.
        need: u64,
        /// The bytes left before the footer.
        have: u64,
    },
    /// A record's payload length is above [`MAX_PAYLOAD`]: no qlist writer makes
    /// such a record, so the length is corrupt (checked before allocating it).
    #[error("byte {offset}: record {index} claims a payload of {len} bytes, above the limit of {limit} bytes (corrupt length)")]
    PayloadTooLong {
        /// The offset of the record's start.
        offset: u64,
        /// The record's index (0 for the first).
        index: u64,
        /// The payload length the record claims.
        len: u64,
        /// [`MAX_PAYLOAD`].
        limit: u64,
    },
    /// The header count disagrees with the records actually present.
    #[error("byte {offset}: header says {header} records but {}", if *found < *header { format!("the records end after {found}") } else { format!("more record bytes follow record {header} ({extra} bytes before the footer)") })]
    CountMismatch {
        /// Where the records and the count part ways.
        offset: u64,
        /// The count in the header.
        header: u64,
        /// The records actually present (up to `header` + 1).
        found: u64,
        /// Record bytes left after record `header` (0 if the records end early).
        extra: u64,
    },
    /// A record's ID is not above the previous record's ID.
    #[error("byte {offset}: record {index} has id {id}, not above the previous id {prev}: ids must strictly increase")]
    OutOfOrder {
        /// The offset of the record's start.
        offset: u64,
        /// The record's index (0 for the first).
        index: u64,
        /// The previous record's ID.
        prev: u64,
        /// This record's ID.
        id: u64,
    },
    /// The stored CRC-32 does not match the record bytes.
    #[error("byte {offset}: checksum mismatch: footer stores {stored:#010x}, records hash to {computed:#010x} (a record byte or the footer is corrupt)")]
    Checksum {
        /// The offset of the footer.
        offset: u64,
        /// The CRC-32 the footer holds.
        stored: u32,
        /// The CRC-32 of the record bytes read.
        computed: u32,
    },
}

/// What a complete, valid list.bin holds (returned by [`verify`] and `ListWriter::finish`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    /// Number of records.
    pub records: u64,
    /// Total file size in bytes.
    pub file_bytes: u64,
    /// Sum of payload lengths.
    pub payload_bytes: u64,
    /// Smallest ID, if any record.
    pub first_id: Option<u64>,
    /// Largest ID, if any record.
    pub last_id: Option<u64>,
    /// The CRC-32 stored in the footer.
    pub checksum: u32,
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> ListError + 'a {
    move |error| ListError::Io {
        path: path.to_path_buf(),
        op,
        error,
    }
}

/// Streams the records of a list.bin, validating as it reads.
///
/// Yields every record in order, then (instead of `None`) one error if the end of the file
/// is wrong: a count mismatch or a checksum mismatch. Records are yielded before the
/// checksum can be checked, so a consumer must read to the end and treat any error as
/// "the whole file is bad". After the first error the iterator ends.
pub struct ListReader<R> {
    input: R,
    /// Named in I/O errors; empty for an anonymous stream.
    path: PathBuf,
    /// Offset of the first footer byte: records occupy `HEADER_LEN..records_end`.
    records_end: u64,
    header_count: u64,
    pos: u64,
    index: u64,
    last_id: Option<u64>,
    hasher: crc32fast::Hasher,
    payload_bytes: u64,
    first_id: Option<u64>,
    done: bool,
    checksum: Option<u32>,
}

impl ListReader<BufReader<File>> {
    /// Opens a list.bin file and checks its header.
    ///
    /// # Errors
    /// [`ListError::Io`] if the file cannot be opened, [`ListError::TooShort`] or
    /// [`ListError::BadMagic`] if it is not a list.bin.
    pub fn open(path: &Path) -> Result<Self, ListError> {
        let file = File::open(path).map_err(io_err(path, "open"))?;
        let len = file.metadata().map_err(io_err(path, "stat"))?.len();
        let mut reader = ListReader::new(BufReader::with_capacity(IO_BUFFER, file), len).map_err(
            |e| match e {
                ListError::Io { op, error, .. } => ListError::Io {
                    path: path.to_path_buf(),
                    op,
                    error,
                },
                other => other,
            },
        )?;
        reader.path = path.to_path_buf();
        Ok(reader)
    }
}

impl<R: Read> ListReader<R> {
    /// Reads the header from `input`, a stream of exactly `len` bytes (the file size: it
    /// locates the footer and bounds every payload length, so a corrupt length can never
    /// make the reader allocate more than the file holds).
    ///
    /// # Errors
    /// [`ListError::TooShort`], [`ListError::BadMagic`], or [`ListError::Io`] (with an
    /// empty path when reading an anonymous stream).
    pub fn new(mut input: R, len: u64) -> Result<Self, ListError> {
        let min = HEADER_LEN + FOOTER_LEN;
        if len < min {
            return Err(ListError::TooShort { len, min });
        }
        let mut header = [0u8; HEADER_LEN as usize];
        input
            .read_exact(&mut header)
            .map_err(io_err(Path::new(""), "read header"))?;
        let mut found = [0u8; 8];
        found.copy_from_slice(&header[..8]);
        if found != MAGIC {
            return Err(ListError::BadMagic { found });
        }
        let header_count = u64::from_le_bytes(le8(&header[8..16]));
        Ok(ListReader {
            input,
            path: PathBuf::new(),
            records_end: len - FOOTER_LEN,
            header_count,
            pos: HEADER_LEN,
            index: 0,
            last_id: None,
            hasher: crc32fast::Hasher::new(),
            payload_bytes: 0,
            first_id: None,
            done: false,
            checksum: None,
        })
    }

    /// The record count the header claims (checked against the records when the end is read).
    pub fn header_count(&self) -> u64 {
        self.header_count
    }

    /// Byte offset of the next record to be read.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// After the iterator returned `None` (the file is fully valid), its summary.
    pub fn summary(&self) -> Option<Summary> {
        self.checksum.map(|checksum| Summary {
            records: self.index,
            file_bytes: self.records_end + FOOTER_LEN,
            payload_bytes: self.payload_bytes,
            first_id: self.first_id,
            last_id: self.last_id,
            checksum,
        })
    }

    fn read_record(&mut self) -> Result<Option<Record>, ListError> {
        let offset = self.pos;
        let have = self.records_end - offset;
        if self.index == self.header_count {
            self.check_records_end(offset, have)?;
            return self.read_footer().map(|()| None);
        }
        let head = self.read_head(offset, have)?;
        let (id, shard, seq, len) = decode_record_head(&head);
        self.check_head(offset, have - RECORD_HEAD_LEN as u64, id, len)?;
        // `len <= have <= file size`, which fits in memory's address space on 64-bit.
        let mut payload = vec![0u8; len as usize];
        self.input
            .read_exact(&mut payload)
            .map_err(io_err(&self.path, "read payload"))?;
        self.hasher.update(&head);
        self.hasher.update(&payload);
        self.pos += RECORD_HEAD_LEN as u64 + len;
        self.index += 1;
        self.payload_bytes += len;
        self.first_id.get_or_insert(id);
        self.last_id = Some(id);
        Ok(Some(Record {
            id,
            shard,
            seq,
            payload,
        }))
    }

    /// After the header's count of records, the footer must follow: `have` bytes remain.
    fn check_records_end(&self, offset: u64, have: u64) -> Result<(), ListError> {
        if have == 0 {
            return Ok(());
        }
        Err(ListError::CountMismatch {
            offset,
            header: self.header_count,
            found: self.index,
            extra: have,
        })
    }

    /// Reads the fixed part of the record at `offset`, `have` bytes before the footer.
    fn read_head(&mut self, offset: u64, have: u64) -> Result<[u8; RECORD_HEAD_LEN], ListError> {
        if have == 0 {
            return Err(ListError::CountMismatch {
                offset,
                header: self.header_count,
                found: self.index,
                extra: 0,
            });
        }
        if have < RECORD_HEAD_LEN as u64 {
            return Err(ListError::Truncated {
                offset,
                index: self.index,
                what: "fixed fields",
                need: RECORD_HEAD_LEN as u64,
                have,
            });
        }
        let mut head = [0u8; RECORD_HEAD_LEN];
        self.input
            .read_exact(&mut head)
            .map_err(io_err(&self.path, "read record"))?;
        Ok(head)
    }

    /// Checks a record's fixed part before its payload is read: `have` bytes remain after
    /// it before the footer.
    fn check_head(&self, offset: u64, have: u64, id: u64, len: u64) -> Result<(), ListError> {
        // The guards against a lying length: never allocate more than any writer would
        // have written, nor more than the file still holds.
        if len > MAX_PAYLOAD as u64 {
            return Err(ListError::PayloadTooLong {
                offset,
                index: self.index,
                len,
                limit: MAX_PAYLOAD as u64,
            });
        }
        if len > have {
            return Err(ListError::Truncated {
                offset,
                index: self.index,
                what: "payload",
                need: len,
                have,
            });
        }
        match self.last_id {
            Some(prev) if id <= prev => Err(ListError::OutOfOrder {
                offset,
                index: self.index,
                prev,
                id,
            }),
            _ => Ok(()),
        }
    }

    fn read_footer(&mut self) -> Result<(), ListError> {
        let mut footer = [0u8; FOOTER_LEN as usize];
        self.input
            .read_exact(&mut footer)
            .map_err(io_err(&self.path, "read footer"))?;
        let stored = u32::from_le_bytes(footer);
        let computed = self.hasher.clone().finalize();
        if stored != computed {
            return Err(ListError::Checksum {
                offset: self.records_end,
                stored,
                computed,
            });
        }
        self.checksum = Some(stored);
        Ok(())
    }
}

impl<R: Read> Iterator for ListReader<R> {
    type Item = Result<Record, ListError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.read_record() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

fn le8(b: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    a
}

/// Whether the local file at `path` starts with version 1's magic (an old list.bin);
/// `false` when it cannot be read (whoever opens it next says why).
pub fn is_version_one(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    let n = File::open(path)
        .and_then(|mut f| f.read(&mut magic))
        .unwrap_or(0);
    n == 8 && magic == MAGIC
}

/// Checks a whole list.bin: magic, framing of every record, strict ID order, the header
/// count and the checksum.
///
/// # Errors
/// The first problem found, with its byte offset; [`ListError::Io`] if the file cannot be read.
pub fn verify(path: &Path) -> Result<Summary, ListError> {
    ListReader::open(path)?.verify_rest()
}

impl<R: Read> ListReader<R> {
    /// Reads the rest of the list, checking every record, and returns its summary.
    ///
    /// # Errors
    /// The first problem found, with its byte offset, as [`verify`].
    pub fn verify_rest(mut self) -> Result<Summary, ListError> {
        for item in self.by_ref() {
            item?;
        }
        self.summary().ok_or_else(|| ListError::Io {
            path: self.path.clone(),
            op: "verify",
            error: io::Error::other("reader stopped without a verdict"),
        })
    }
}

#[cfg(test)]
mod tests;

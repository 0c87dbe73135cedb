//! The version 1 list.bin writer, kept for tests and benchmarks (feature `v1-writer`):
//! they make version 1 files to check that merges, `verify` and `cat` still read them.

use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::{io_err, ListError, Summary, FOOTER_LEN, HEADER_LEN, IO_BUFFER, MAGIC};
use crate::record::{encode_record_head, Record, RECORD_HEAD_LEN};

/// Byte offset of the record count inside the header (patched by the writer at the end).
const COUNT_OFFSET: u64 = 8;

/// Writes a list.bin atomically: records go to a temporary file in the target directory,
/// which [`ListWriter::finish`] completes (count, checksum), fsyncs and renames into place.
///
/// Dropping the writer before `finish`, or any error, removes the temporary file, so no
/// partial file ever appears under the final name.
pub struct ListWriter {
    path: PathBuf,
    tmp: Option<tempfile::NamedTempFile>,
    out: BufWriter<File>,
    hasher: crc32fast::Hasher,
    records: u64,
    bytes: u64,
    payload_bytes: u64,
    first_id: Option<u64>,
    last_id: Option<u64>,
}

impl ListWriter {
    /// Starts writing `path` (through a temporary file in the same directory).
    ///
    /// # Errors
    /// [`ListError::MissingDir`] if the parent directory does not exist, [`ListError::Io`]
    /// if the temporary file cannot be created.
    pub fn create(path: &Path) -> Result<ListWriter, ListError> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dir.is_dir() {
            return Err(ListError::MissingDir { dir });
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // A leading dot and a .tmp suffix: clearly not a finished list.bin to anyone listing
        // the directory, and unique so concurrent or crashed merges never collide.
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .tempfile_in(&dir)
            .map_err(io_err(&dir, "create temporary file"))?;
        let file = tmp
            .reopen()
            .map_err(io_err(tmp.path(), "open temporary file"))?;
        let mut out = BufWriter::with_capacity(IO_BUFFER, file);
        let mut header = [0u8; HEADER_LEN as usize];
        header[..8].copy_from_slice(&MAGIC);
        out.write_all(&header)
            .map_err(io_err(tmp.path(), "write header"))?;
        Ok(ListWriter {
            path: path.to_path_buf(),
            tmp: Some(tmp),
            out,
            hasher: crc32fast::Hasher::new(),
            records: 0,
            bytes: HEADER_LEN,
            payload_bytes: 0,
            first_id: None,
            last_id: None,
        })
    }

    /// The final path this writer will rename its file to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Bytes written so far (header and records).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn tmp_path(&self) -> &Path {
        self.tmp.as_ref().map(|t| t.path()).unwrap_or(&self.path)
    }

    /// Appends one record.
    ///
    /// # Errors
    /// [`ListError::WriteOrder`] if `record.id` is not above the previous ID (list.bin's
    /// order is its contract, so the writer enforces it too), [`ListError::Io`] on a write error.
    pub fn write(&mut self, record: &Record) -> Result<(), ListError> {
        if let Some(prev) = self.last_id {
            if record.id <= prev {
                return Err(ListError::WriteOrder {
                    prev,
                    id: record.id,
                });
            }
        }
        let head = encode_record_head(record);
        self.hasher.update(&head);
        self.hasher.update(&record.payload);
        let res = self
            .out
            .write_all(&head)
            .and_then(|()| self.out.write_all(&record.payload));
        if let Err(e) = res {
            return Err(io_err(self.tmp_path(), "write record")(e));
        }
        self.records += 1;
        self.bytes += (RECORD_HEAD_LEN + record.payload.len()) as u64;
        self.payload_bytes += record.payload.len() as u64;
        self.first_id.get_or_insert(record.id);
        self.last_id = Some(record.id);
        Ok(())
    }

    /// Writes the footer, patches the count into the header, fsyncs the file, renames it to
    /// the final path and fsyncs the directory.
    ///
    /// # Errors
    /// [`ListError::Io`] if any step up to the rename fails; the temporary file is removed
    /// then. [`ListError::NotDurable`] if only the directory fsync after it fails.
    pub fn finish(mut self) -> Result<Summary, ListError> {
        let checksum = self.hasher.clone().finalize();
        let tmp_path = self.tmp_path().to_path_buf();
        let tmp = self.tmp.take();
        let res = (|| {
            self.out
                .write_all(&checksum.to_le_bytes())
                .map_err(io_err(&tmp_path, "write footer"))?;
            self.out.flush().map_err(io_err(&tmp_path, "write"))?;
            let file = self.out.get_mut();
            file.seek(SeekFrom::Start(COUNT_OFFSET))
                .map_err(io_err(&tmp_path, "seek"))?;
            file.write_all(&self.records.to_le_bytes())
                .map_err(io_err(&tmp_path, "write count"))?;
            file.sync_all().map_err(io_err(&tmp_path, "fsync"))?;
            Ok(())
        })();
        // On error `tmp` drops here and deletes the temporary file.
        res?;
        let tmp = tmp.ok_or_else(|| ListError::Io {
            path: tmp_path.clone(),
            op: "finish",
            error: io::Error::other("writer already finished"),
        })?;
        tmp.persist(&self.path).map_err(|e| ListError::Io {
            path: self.path.clone(),
            op: "rename temporary file into place",
            error: e.error,
        })?;
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // The rename is durable only once the directory entry is on disk.
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|error| ListError::NotDurable {
                path: self.path.clone(),
                dir: dir.clone(),
                error,
            })?;
        Ok(Summary {
            records: self.records,
            file_bytes: self.bytes + FOOTER_LEN,
            payload_bytes: self.payload_bytes,
            first_id: self.first_id,
            last_id: self.last_id,
            checksum,
        })
    }
}

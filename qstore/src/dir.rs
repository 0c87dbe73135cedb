//! Local directories: listing runs, and atomic writes (temp file, fsync, rename, fsync dir).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

use crate::location::is_run_name;
use crate::{Location, StoreError};

/// Large buffers: runs are written strictly sequentially, and the default 8 KiB would cost
/// one syscall per few records.
const WRITE_BUFFER: usize = 1 << 20;
/// Random characters in a temporary file's name (`.NAME.XXXXXX.tmp`).
const TEMP_RANDOM_CHARS: usize = 6;

/// The `*.bin` files directly in `dir`, unsorted.
pub(crate) fn list_runs(dir: &Path) -> Result<Vec<Location>, StoreError> {
    let shown = dir.display();
    let entries =
        std::fs::read_dir(dir).map_err(|e| StoreError::io(&shown, "list directory", e))?;
    let mut runs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io(&shown, "list directory", e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_run_name(name) {
            continue;
        }
        // Follows symlinks: a run may be linked in from elsewhere.
        let path = entry.path();
        if path.is_file() {
            runs.push(Location::Dir(path));
        }
    }
    Ok(runs)
}

/// An atomic write of one file: a hidden temporary file in the same directory, renamed
/// over the final name by [`DirUpload::finish`]; removed if dropped unfinished.
pub(crate) struct DirUpload {
    path: PathBuf,
    out: BufWriter<NamedTempFile>,
    bytes: u64,
}

impl DirUpload {
    pub(crate) fn create(path: &Path) -> Result<DirUpload, StoreError> {
        let shown = path.display();
        let name =
            path.file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| StoreError::BadLocation {
                    input: shown.to_string(),
                    reason: "no file name to write".to_string(),
                })?;
        let dir = parent(path);
        if !dir.is_dir() {
            return Err(StoreError::NotFound {
                object: format!("directory {}", dir.display()),
            });
        }
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .rand_bytes(TEMP_RANDOM_CHARS)
            .tempfile_in(&dir)
            .map_err(|e| StoreError::io(dir.display(), "create temporary file", e))?;
        Ok(DirUpload {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(WRITE_BUFFER, tmp),
            bytes: 0,
        })
    }

    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf).map_err(|e| self.named(e, "write"))?;
        self.bytes += n as u64;
        Ok(n)
    }

    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.out.flush().map_err(|e| self.named(e, "write"))
    }

    /// The I/O error with the temporary file's name in it (`io::Write` can carry no more).
    fn named(&self, e: io::Error, op: &str) -> io::Error {
        let tmp = self.out.get_ref().path().display();
        io::Error::new(e.kind(), format!("{tmp}: {op}: {e}"))
    }

    /// Flushes and fsyncs the temporary file, renames it into place, fsyncs the directory.
    ///
    /// On any error before the rename the temporary file is removed.
    pub(crate) fn finish(self) -> Result<u64, StoreError> {
        let DirUpload { path, out, bytes } = self;
        let tmp_shown = out.get_ref().path().display().to_string();
        let tmp = out
            .into_inner()
            .map_err(|e| StoreError::io(&tmp_shown, "write", e.into_error()))?;
        tmp.as_file()
            .sync_all()
            .map_err(|e| StoreError::io(&tmp_shown, "fsync", e))?;
        tmp.persist(&path).map_err(|e| StoreError::Io {
            object: path.display().to_string(),
            op: "rename temporary file into place",
            error: e.error,
        })?;
        // The rename is durable only once the directory entry is on disk.
        let dir = parent(&path);
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|error| StoreError::NotDurable {
                path: path.clone(),
                dir,
                error,
            })?;
        Ok(bytes)
    }
}

/// The directory holding `path` ("." for a bare file name).
fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

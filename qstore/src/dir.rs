//! Local directories: listing runs, and atomic writes (temp file, fsync, rename, fsync dir).

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use tempfile::NamedTempFile;

use crate::{Location, StoreError};

/// Writes smaller than this are gathered (the default 8 KiB would cost one syscall per
/// few records); a run's blocks (~256 KiB) are larger and go to the file as they are,
/// without a copy into the buffer first: with a 1 MiB buffer that copy was a sixth of a
/// merge's user time (BENCHMARKS.md, "The merge at the machine's limit").
const WRITE_BUFFER: usize = 128 << 10;
/// Random characters in a temporary file's name (`.NAME.XXXXXX.tmp`).
const TEMP_RANDOM_CHARS: usize = 6;
/// Every this many bytes written, a background thread asks the kernel to write what is
/// dirty so far to disk (`fdatasync` on another handle), so the disk works while the
/// file is still being written and the fsync of [`DirUpload::finish`] waits only for the
/// last stretch: without it, Linux starts writing back a large file only once a tenth of
/// memory is dirty, and a 1.3 GB merge spent about a second in its final fsync.
const WRITEBACK_EVERY: u64 = 32 << 20;

/// The files directly in `dir` whose names `keep` accepts, unsorted.
pub(crate) fn list_named(dir: &Path, keep: fn(&str) -> bool) -> Result<Vec<Location>, StoreError> {
    let shown = dir.display();
    let entries =
        std::fs::read_dir(dir).map_err(|e| StoreError::io(&shown, "list directory", e))?;
    let mut runs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io(&shown, "list directory", e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !keep(name) {
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

/// The names of the regular files directly in `dir` that are not hidden; none for a
/// directory that does not exist.
pub(crate) fn list_names(dir: &Path) -> Result<Vec<String>, StoreError> {
    let shown = dir.display();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::io(&shown, "list directory", e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io(&shown, "list directory", e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !name.starts_with('.') && entry.path().is_file() {
            names.push(name);
        }
    }
    Ok(names)
}

/// The whole of the file `path`, refused if it is larger than `max` bytes.
pub(crate) fn read_small(path: &Path, max: u64) -> Result<Vec<u8>, StoreError> {
    use std::io::Read;
    let shown = path.display();
    let file = File::open(path).map_err(|e| StoreError::io(&shown, "open", e))?;
    let mut bytes = Vec::new();
    // Read one byte more than allowed: a file that grows after a stat is caught too.
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| StoreError::io(&shown, "read", e))?;
    if bytes.len() as u64 > max {
        let len = std::fs::metadata(path).map_or(bytes.len() as u64, |m| m.len());
        return Err(StoreError::TooLarge {
            object: shown.to_string(),
            len,
            max,
        });
    }
    Ok(bytes)
}

/// Removes the file `path` durably (its directory is fsynced); a missing file is no error.
pub(crate) fn delete(path: &Path) -> Result<(), StoreError> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(StoreError::io(path.display(), "remove", e)),
    }
    sync_dir(&parent(path))
}

/// Creates the directory `dir` and its missing parents, durably: each directory created
/// and the one that holds it are fsynced, so that a file renamed into `dir` later survives
/// a crash with its path.
pub(crate) fn make_dirs(dir: &Path) -> Result<(), StoreError> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.exists() {
        missing.push(at.to_path_buf());
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => at = p,
            _ => break,
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| StoreError::io(dir.display(), "create directory", e))?;
    for created in missing.iter().rev() {
        sync_dir(created)?;
        sync_dir(&parent(created))?;
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(dir.display(), "fsync directory", e))
}

/// An atomic write of one file: a hidden temporary file in the same directory, renamed
/// over the final name by [`DirUpload::finish`]; removed if dropped unfinished.
pub(crate) struct DirUpload {
    path: PathBuf,
    out: BufWriter<NamedTempFile>,
    bytes: u64,
    writeback: Writeback,
}

/// The background writeback of [`WRITEBACK_EVERY`].
struct Writeback {
    /// Wakes the thread; `None` once it is told to stop.
    wake: Option<std::sync::mpsc::SyncSender<()>>,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
    /// Bytes written at which it is woken next.
    next_at: u64,
}

impl Writeback {
    /// A thread that `fdatasync`s `file` each time it is woken (wake-ups that come while
    /// it is busy are merged into one). Without a thread (none could be started) or a
    /// second handle, nothing is written back early: only `finish` syncs.
    fn start(file: &File) -> Writeback {
        let thread = file.try_clone().ok().and_then(|file| {
            let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
            std::thread::Builder::new()
                .name("qstore-writeback".into())
                .spawn(move || {
                    while woken.recv().is_ok() {
                        file.sync_data()?;
                    }
                    Ok(())
                })
                .ok()
                .map(|t| (wake, t))
        });
        let (wake, thread) = thread.unzip();
        Writeback {
            wake,
            thread,
            next_at: WRITEBACK_EVERY,
        }
    }

    fn written(&mut self, bytes: u64) {
        if bytes >= self.next_at {
            self.next_at = bytes + WRITEBACK_EVERY;
            if let Some(wake) = &self.wake {
                // Full: the thread is busy and will sync again anyway.
                let _ = wake.try_send(());
            }
        }
    }

    /// Stops the thread; its first error, if any (an fdatasync error must not be lost:
    /// the kernel reports it only once).
    fn stop(&mut self) -> io::Result<()> {
        self.wake = None;
        match self.thread.take().map(|t| t.join()) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(e),
            Some(Err(_)) => Err(io::Error::other("the writeback thread panicked")),
        }
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        let _ = self.stop();
    }
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
        let writeback = Writeback::start(tmp.as_file());
        Ok(DirUpload {
            path: path.to_path_buf(),
            out: BufWriter::with_capacity(WRITE_BUFFER, tmp),
            bytes: 0,
            writeback,
        })
    }

    pub(crate) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf).map_err(|e| self.named(e, "write"))?;
        self.bytes += n as u64;
        self.writeback.written(self.bytes);
        Ok(n)
    }

    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.out.flush().map_err(|e| self.named(e, "write"))
    }

    /// Another handle to the temporary file (for writes at offsets).
    pub(crate) fn file_handle(&self) -> Result<File, StoreError> {
        let tmp = self.out.get_ref();
        tmp.as_file()
            .try_clone()
            .map_err(|e| StoreError::io(tmp.path().display(), "duplicate file handle", e))
    }

    /// Flushes, then moves the write position to `offset` (bytes written there by
    /// another handle count as written).
    pub(crate) fn skip_to(&mut self, offset: u64) -> io::Result<()> {
        use std::io::{Seek, SeekFrom};
        self.flush()?;
        self.out
            .get_mut()
            .as_file_mut()
            .seek(SeekFrom::Start(offset))
            .map_err(|e| self.named(e, "seek"))?;
        self.bytes = offset;
        Ok(())
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
        let DirUpload {
            path,
            out,
            bytes,
            mut writeback,
        } = self;
        let tmp_shown = out.get_ref().path().display().to_string();
        let tmp = out
            .into_inner()
            .map_err(|e| StoreError::io(&tmp_shown, "write", e.into_error()))?;
        writeback
            .stop()
            .map_err(|e| StoreError::io(&tmp_shown, "fsync", e))?;
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

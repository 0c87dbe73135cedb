//! [`Object`]: one run opened for ranged reads; [`RangeReader`]: bounded read-ahead.

use std::collections::VecDeque;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use tokio::task::JoinHandle;

use crate::options::StoreOptions;
use crate::s3::S3Target;
use crate::tasks::{wait, Tasks};
use crate::{Location, StoreError};

/// One run opened for reading: a local file or an S3 object, of a size fixed at
/// [`crate::Store::open`]. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Object {
    inner: Arc<Inner>,
}

struct Inner {
    loc: Location,
    len: u64,
    tasks: Tasks,
    opts_read_chunk: u64,
    opts_in_flight: usize,
    backing: Backing,
}

/// What an object's bytes are read from: a file kept open, or one version of an S3 object.
enum Backing {
    /// Kept open: a file renamed over during a read keeps reading the original.
    File(File),
    /// The ETag from the HEAD; every read asks for (and checks) this version.
    S3 {
        target: S3Target,
        etag: Option<Arc<str>>,
    },
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Object")
            .field("location", &self.inner.loc)
            .field("len", &self.inner.len)
            .finish_non_exhaustive()
    }
}

impl Object {
    pub(crate) fn open_file(
        tasks: &Tasks,
        opts: StoreOptions,
        loc: &Location,
        path: &Path,
    ) -> Result<Object, StoreError> {
        let file = File::open(path).map_err(|e| StoreError::io(loc, "open", e))?;
        let meta = file
            .metadata()
            .map_err(|e| StoreError::io(loc, "stat", e))?;
        if meta.is_dir() {
            return Err(StoreError::io(
                loc,
                "open",
                std::io::Error::other("is a directory, not a run"),
            ));
        }
        Ok(Object::build(
            tasks,
            opts,
            loc,
            meta.len(),
            Backing::File(file),
        ))
    }

    pub(crate) fn from_s3(
        tasks: &Tasks,
        opts: StoreOptions,
        loc: &Location,
        target: S3Target,
        len: u64,
        etag: Option<String>,
    ) -> Object {
        let etag = etag.map(Arc::from);
        Object::build(tasks, opts, loc, len, Backing::S3 { target, etag })
    }

    fn build(
        tasks: &Tasks,
        opts: StoreOptions,
        loc: &Location,
        len: u64,
        backing: Backing,
    ) -> Object {
        Object {
            inner: Arc::new(Inner {
                loc: loc.clone(),
                len,
                tasks: tasks.clone(),
                opts_read_chunk: opts.read_chunk as u64,
                opts_in_flight: opts.in_flight,
                backing,
            }),
        }
    }

    /// Its size in bytes, as learned when it was opened.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Where it is.
    pub fn location(&self) -> &Location {
        &self.inner.loc
    }

    /// The ETag of the version being read (S3 only, when the server gives one).
    pub fn etag(&self) -> Option<&str> {
        match &self.inner.backing {
            Backing::S3 { etag, .. } => etag.as_deref(),
            Backing::File(_) => None,
        }
    }

    /// One ranged read: exactly the bytes of `range`.
    ///
    /// # Errors
    /// [`StoreError::BadRange`] outside the object; [`StoreError::Changed`] if the S3
    /// object was replaced since it was opened; I/O and S3 errors naming the object and
    /// the range.
    pub fn read_range(&self, range: Range<u64>) -> Result<Bytes, StoreError> {
        self.check(&range)?;
        match &self.inner.backing {
            Backing::File(file) => self.read_file(file, range),
            Backing::S3 { .. } => wait(self.spawn_read(range)?),
        }
    }

    /// The given ranges in order, each split into reads of at most `read_chunk` bytes,
    /// yielded in order as `(offset, bytes)`. On S3 up to `in_flight` reads are
    /// outstanding (read-ahead), so memory stays within `in_flight x read_chunk` whatever
    /// the object's size. Empty ranges yield nothing.
    ///
    /// The iterator yields at most one error (a bad range is reported before any read)
    /// and then ends.
    pub fn read_ranges(&self, ranges: Vec<Range<u64>>) -> RangeReader {
        let bad = ranges.iter().find_map(|r| self.check(r).err());
        RangeReader {
            object: self.clone(),
            ranges: ranges.into_iter().filter(|r| r.start < r.end).collect(),
            pending: VecDeque::new(),
            failed: bad,
            done: false,
        }
    }

    fn check(&self, range: &Range<u64>) -> Result<(), StoreError> {
        if range.start > range.end || range.end > self.inner.len {
            return Err(StoreError::BadRange {
                object: self.inner.loc.to_string(),
                range: range.clone(),
                len: self.inner.len,
            });
        }
        Ok(())
    }

    /// Reads `range` of `file` into one of the store's read buffers (its old contents are
    /// overwritten, and only the bytes beyond its length are zeroed first).
    fn read_file(&self, file: &File, range: Range<u64>) -> Result<Bytes, StoreError> {
        let buffers = self.inner.tasks.read_buffers();
        let mut buf = buffers.take();
        let len = usize::try_from(range.end - range.start).map_err(|_| StoreError::BadRange {
            object: self.inner.loc.to_string(),
            range: range.clone(),
            len: self.inner.len,
        })?;
        if buf.len() >= len {
            buf.truncate(len);
        } else {
            buf.resize(len, 0);
        }
        file.read_exact_at(&mut buf, range.start)
            .map_err(|e| StoreError::Io {
                object: self.inner.loc.to_string(),
                op: "read",
                error: std::io::Error::new(
                    e.kind(),
                    format!("bytes {}..{}: {e}", range.start, range.end),
                ),
            })?;
        Ok(buffers.hand_out(buf))
    }

    /// Starts one ranged GET (S3 only).
    fn spawn_read(
        &self,
        range: Range<u64>,
    ) -> Result<JoinHandle<Result<Bytes, StoreError>>, StoreError> {
        let Backing::S3 { target, etag } = &self.inner.backing else {
            unreachable!("spawn_read on a local file");
        };
        let (target, etag) = (target.clone(), etag.clone());
        let (gets, buffers) = (self.inner.tasks.gets(), self.inner.tasks.read_buffers());
        self.inner.tasks.spawn(async move {
            let _turn = Tasks::get_turn(gets).await;
            target.get_range(etag.as_deref(), range, &buffers).await
        })
    }
}

/// The iterator of [`Object::read_ranges`]: `(offset, bytes)` in order, then at most one
/// error. Dropping it cancels the reads still in flight.
pub struct RangeReader {
    object: Object,
    /// What is left to read, already checked and non-empty.
    ranges: VecDeque<Range<u64>>,
    /// S3 reads started, oldest first (at most `in_flight`).
    pending: VecDeque<(u64, JoinHandle<Result<Bytes, StoreError>>)>,
    /// An error to yield next.
    failed: Option<StoreError>,
    done: bool,
}

impl RangeReader {
    /// The next chunk to read: at most `read_chunk` bytes of the first range left.
    fn next_chunk(&mut self) -> Option<Range<u64>> {
        let chunk = self.object.inner.opts_read_chunk;
        let first = self.ranges.front_mut()?;
        // On S3 pieces end on multiples of the read size, so after the first one every
        // GET is aligned: a store keeps an object in chunks of such a size (SeaweedFS's are
        // 4 MiB), and a GET across two of them costs the server two (BENCHMARKS.md, "The
        // merge at the machine's limit"). A local file is read as asked.
        let end = match self.object.inner.backing {
            Backing::S3 { .. } => (first.start / chunk + 1).saturating_mul(chunk),
            Backing::File(_) => first.start.saturating_add(chunk),
        };
        let end = first.end.min(end);
        let piece = first.start..end;
        first.start = end;
        if first.start == first.end {
            self.ranges.pop_front();
        }
        Some(piece)
    }

    /// Keeps `in_flight` S3 reads going.
    fn fill(&mut self) -> Result<(), StoreError> {
        while self.pending.len() < self.object.inner.opts_in_flight {
            let Some(piece) = self.next_chunk() else {
                break;
            };
            let start = piece.start;
            let handle = self.object.spawn_read(piece)?;
            self.pending.push_back((start, handle));
        }
        Ok(())
    }

    fn next_result(&mut self) -> Option<Result<(u64, Bytes), StoreError>> {
        if let Some(e) = self.failed.take() {
            return Some(Err(e));
        }
        let object = self.object.clone();
        if let Backing::File(file) = &object.inner.backing {
            // The OS reads ahead for a local file: plain sequential reads suffice.
            let piece = self.next_chunk()?;
            let start = piece.start;
            return Some(object.read_file(file, piece).map(|b| (start, b)));
        }
        if let Err(e) = self.fill() {
            return Some(Err(e));
        }
        let (start, handle) = self.pending.pop_front()?;
        Some(wait(handle).map(|b| (start, b)))
    }
}

impl Iterator for RangeReader {
    type Item = Result<(u64, Bytes), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.next_result();
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
            self.cancel();
        }
        item
    }
}

impl RangeReader {
    fn cancel(&mut self) {
        for (_, handle) in self.pending.drain(..) {
            handle.abort();
        }
        self.ranges.clear();
    }
}

impl Drop for RangeReader {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// The run reader's view of an object (`qformat::run::RangedRun`): its length and
/// ranged reads, with this object's ETag check and read-ahead.
impl qformat::run::RangeRead for Object {
    type Error = StoreError;
    type Ranges = RangeReader;

    fn len(&self) -> u64 {
        Object::len(self)
    }

    fn read_range(&self, range: Range<u64>) -> Result<Bytes, StoreError> {
        Object::read_range(self, range)
    }

    fn read_ranges(&self, ranges: Vec<Range<u64>>) -> RangeReader {
        Object::read_ranges(self, ranges)
    }
}

//! [`Upload`]: an atomic write of one run, to a directory or to S3.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::path::Path;

use bytes::Bytes;
use object_store::multipart::PartId;
use object_store::PutPayload;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use crate::dir::DirUpload;
use crate::s3::S3Target;
use crate::tasks::{wait, Tasks};
use crate::StoreError;

/// Parts uploading at once: one on the wire while the next is filled (S3 throughput per
/// connection is ~50-100 MB/s), and memory stays within (2 + 1) x part_size.
const MAX_PARTS_IN_FLIGHT: usize = 2;

/// An atomic write of one file or object: nothing is visible at its location until
/// [`Upload::finish`] succeeds. Dropped unfinished (or after a failure), it leaves nothing:
/// the temporary file is removed, the S3 multipart upload aborted.
///
/// Data is written with [`std::io::Write`]; wrap it in nothing (it buffers itself).
pub struct Upload {
    inner: Inner,
}

enum Inner {
    File(DirUpload),
    S3(S3Upload),
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.inner {
            Inner::File(_) => "file",
            Inner::S3(_) => "s3",
        };
        f.debug_struct("Upload")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

impl Upload {
    pub(crate) fn create_file(path: &Path) -> Result<Upload, StoreError> {
        Ok(Upload {
            inner: Inner::File(DirUpload::create(path)?),
        })
    }

    pub(crate) fn create_s3(tasks: &Tasks, part_size: usize, target: S3Target) -> Upload {
        Upload {
            inner: Inner::S3(S3Upload {
                tasks: tasks.clone(),
                target,
                part_size,
                buf: Vec::new(),
                multipart: None,
                bytes: 0,
                failed: false,
                completed: false,
            }),
        }
    }

    /// Makes the data visible at the location, all at once; returns its size in bytes.
    ///
    /// A directory: flush, fsync the temporary file, rename it into place, fsync the
    /// directory. S3: one PUT if the data fits in one part, else upload the last part and
    /// complete the multipart upload.
    ///
    /// # Errors
    /// I/O or S3 errors naming the location, after which nothing is visible there (the
    /// temporary file is removed, the multipart upload aborted), except
    /// [`StoreError::NotDurable`]: the file is in place but its directory's fsync failed.
    pub fn finish(self) -> Result<u64, StoreError> {
        match self.inner {
            Inner::File(f) => f.finish(),
            Inner::S3(s) => s.finish(),
        }
    }

    /// A local file upload's temporary file, for writes at offsets beyond what was written
    /// through [`Write`] (`merger --jobs` writes its ranges into their places): another
    /// handle to the same open file. `None` for S3.
    ///
    /// # Errors
    /// Duplicating the handle failed.
    pub fn local_file(&self) -> Result<Option<std::fs::File>, StoreError> {
        match &self.inner {
            Inner::File(f) => f.file_handle().map(Some),
            Inner::S3(_) => Ok(None),
        }
    }

    /// Moves a local file upload's write position to `offset`, past bytes written there
    /// through [`Upload::local_file`]: what [`Write`] writes next goes there, and
    /// [`Upload::finish`] counts the file as `offset` bytes plus what follows.
    ///
    /// # Errors
    /// Flushing or seeking failed; an S3 upload, which has no positions.
    pub fn skip_to(&mut self, offset: u64) -> io::Result<()> {
        match &mut self.inner {
            Inner::File(f) => f.skip_to(offset),
            Inner::S3(_) => Err(io::Error::other(
                "an S3 upload is written in order: it cannot skip to an offset",
            )),
        }
    }

    /// Gives up: removes the temporary file or aborts the multipart upload (best effort,
    /// failures logged). Dropping an unfinished upload does the same.
    pub fn abort(self) {
        drop(self);
    }
}

impl Write for Upload {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.inner {
            Inner::File(f) => f.write(buf),
            Inner::S3(s) => s.write(buf),
        }
    }

    /// Local files: flushes the buffer to the temporary file. S3: nothing (data leaves in
    /// whole parts; only [`Upload::finish`] sends the rest).
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.inner {
            Inner::File(f) => f.flush(),
            Inner::S3(_) => Ok(()),
        }
    }
}

/// An S3 upload: buffered into parts; the multipart upload starts with the first full
/// part, so a small object is one PUT.
struct S3Upload {
    tasks: Tasks,
    target: S3Target,
    part_size: usize,
    /// The part being filled.
    buf: Vec<u8>,
    multipart: Option<Multipart>,
    bytes: u64,
    /// A part failed: the upload cannot be finished.
    failed: bool,
    completed: bool,
}

struct Multipart {
    id: String,
    /// Index of the next part to send (0-based).
    next: usize,
    /// Parts uploaded, in order.
    parts: Vec<PartId>,
    /// Parts uploading, oldest first.
    pending: VecDeque<JoinHandle<Result<PartId, StoreError>>>,
}

impl S3Upload {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.failed {
            let e = format!(
                "{}: an earlier part of this upload failed",
                self.target.name
            );
            return Err(io::Error::other(e));
        }
        let mut rest = data;
        while !rest.is_empty() {
            let n = (self.part_size - self.buf.len()).min(rest.len());
            self.buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            if self.buf.len() == self.part_size {
                self.send_part().map_err(|e| {
                    self.failed = true;
                    io::Error::other(e)
                })?;
            }
        }
        self.bytes += data.len() as u64;
        Ok(data.len())
    }

    /// Sends the buffer as the next part, first waiting while too many are in flight.
    fn send_part(&mut self) -> Result<(), StoreError> {
        let data = Bytes::from(std::mem::take(&mut self.buf));
        if self.multipart.is_none() {
            let t = self.target.clone();
            let id = self.tasks.run(async move { t.create_multipart().await })?;
            debug!(object = %self.target.name, "multipart upload started");
            self.multipart = Some(Multipart {
                id,
                next: 0,
                parts: Vec::new(),
                pending: VecDeque::new(),
            });
        }
        let mp = self.multipart.as_mut().expect("set above");
        while mp.pending.len() >= MAX_PARTS_IN_FLIGHT {
            let oldest = mp.pending.pop_front().expect("non-empty");
            mp.parts.push(wait(oldest)?);
        }
        let (t, id, idx) = (self.target.clone(), mp.id.clone(), mp.next);
        mp.next += 1;
        let payload = PutPayload::from(data);
        let handle = self
            .tasks
            .spawn(async move { t.put_part(&id, idx, payload).await })?;
        mp.pending.push_back(handle);
        Ok(())
    }

    fn finish(mut self) -> Result<u64, StoreError> {
        if self.failed {
            return Err(StoreError::S3 {
                object: self.target.name.to_string(),
                op: "upload".to_string(),
                message: "an earlier part failed; nothing was written".to_string(),
            });
        }
        if self.multipart.is_none() {
            let (t, data) = (
                self.target.clone(),
                Bytes::from(std::mem::take(&mut self.buf)),
            );
            self.tasks
                .run(async move { t.put(PutPayload::from(data)).await })?;
        } else {
            if !self.buf.is_empty() {
                self.send_part()?;
            }
            let mp = self.multipart.as_mut().expect("checked above");
            while let Some(handle) = mp.pending.pop_front() {
                mp.parts.push(wait(handle)?);
            }
            let (t, id, parts) = (self.target.clone(), mp.id.clone(), mp.parts.clone());
            self.tasks
                .run(async move { t.complete(&id, parts).await })?;
        }
        self.completed = true;
        Ok(self.bytes)
    }
}

impl Drop for S3Upload {
    fn drop(&mut self) {
        if self.completed {
            return;
        }
        let Some(mp) = self.multipart.take() else {
            return; // Nothing was sent.
        };
        for handle in &mp.pending {
            handle.abort();
        }
        let (t, id) = (self.target.clone(), mp.id);
        let res = self
            .tasks
            .run(async move { t.abort(&id).await })
            .map(|()| debug!(object = %self.target.name, "multipart upload aborted"));
        if let Err(e) = res {
            warn!(
                object = %self.target.name,
                error = %e,
                "could not abort an unfinished multipart upload: its parts stay stored (and \
                 billed) until the bucket's lifecycle rule or a later abort removes them"
            );
        }
    }
}

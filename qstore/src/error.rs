//! [`StoreError`]: everything that can go wrong reading or writing a location.
//!
//! Every message names the location it is about. No variant holds a credential or an
//! `object_store` error value: S3 causes are kept as text, built from the error chain,
//! whose parts (method, URL, status, response body) never contain the secret key or the
//! session token (requests are signed in headers, and headers are not printed).

use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong with a [`crate::Location`].
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The string is neither a local path nor `s3://bucket/prefix`.
    #[error("bad location {input:?}: {reason}")]
    BadLocation {
        /// The string given (any `user:password@` part is masked).
        input: String,
        /// What is wrong with it, for a person to read.
        reason: String,
    },
    /// The object, file or directory does not exist.
    #[error("{object} does not exist")]
    NotFound {
        /// The location it is about, as shown (`s3://bucket/key` or a path).
        object: String,
    },
    /// The server refused the request: wrong or missing credentials, or no permission.
    #[error("{object}: {op} was refused ({message}): check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) and the bucket policy")]
    Denied {
        /// The location it is about, as shown (`s3://bucket/key` or a path).
        object: String,
        /// The request refused (`GET`, `PUT`, `list`, ...).
        op: String,
        /// The server's reason, as text.
        message: String,
    },
    /// The object was replaced between [`crate::Store::open`] and a later read.
    #[error("{object} changed while it was being read (ETag was {was}, now {now}): it was replaced; rerun the merge")]
    Changed {
        /// The location it is about, as shown (`s3://bucket/key` or a path).
        object: String,
        /// The ETag seen at open (`?` if the server gave none).
        was: String,
        /// The ETag the server reports now.
        now: String,
    },
    /// A read outside the object, or a backwards range: a caller's mistake.
    #[error("{object}: cannot read bytes {}..{} of a {len}-byte object", range.start, range.end)]
    BadRange {
        /// The location it is about, as shown (`s3://bucket/key` or a path).
        object: String,
        /// The byte range asked for, end exclusive.
        range: Range<u64>,
        /// The object's size in bytes.
        len: u64,
    },
    /// An object read whole is larger than the caller allows ([`crate::Store::read_small`]).
    #[error("{object} is {len} bytes, above the limit of {max} for it")]
    TooLarge {
        /// The location it is about, as shown (`s3://bucket/key` or a path).
        object: String,
        /// Its size in bytes.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// An operating-system error on a local file or directory.
    #[error("{object}: {op}: {error}")]
    Io {
        /// The location it is about, as shown (`s3://bucket/key` or a path).
        object: String,
        /// What was being done (`write`, `list directory`, ...).
        op: &'static str,
        /// In the message, not a `#[source]`: `{:#}` would print it twice.
        error: io::Error,
    },
    /// An S3 request failed in a way retrying cannot fix (or that is not retried).
    #[error("{object}: {op} failed: {message}")]
    S3 {
        /// The location it is about, as shown (`s3://bucket/key` or a path).
        object: String,
        /// The request that failed (`GET`, `PUT`, `list`, ...).
        op: String,
        /// The cause, its error chain on one line.
        message: String,
    },
    /// A transient S3 failure that lasted longer than the deadline.
    #[error("{object}: {op} failed after {tries} tries over {} s: {cause}", elapsed.as_secs())]
    GaveUp {
        /// The location it is about, as shown (`s3://bucket/key` or a path).
        object: String,
        /// The request retried (`HEAD`, `PUT`, `list`, ...).
        op: String,
        /// Attempts made, the first included.
        tries: u32,
        /// Time from the first attempt to giving up, within the store's deadline.
        elapsed: Duration,
        /// The last attempt's failure, as text.
        cause: String,
    },
    /// The S3 configuration (environment variables) is missing or wrong.
    #[error("S3 configuration: {message}")]
    Config {
        /// What is missing or wrong (a variable, the endpoint, the bucket); never a secret.
        message: String,
    },
    /// The file is complete and renamed into place, but the fsync of its directory failed:
    /// it is there and readable, but a crash now could lose the rename.
    #[error("{} is complete, but fsync of its directory {} failed ({error}): a crash now could lose it; rerun to be sure", path.display(), dir.display())]
    NotDurable {
        /// The file, complete and in place.
        path: PathBuf,
        /// Its directory, whose fsync failed.
        dir: PathBuf,
        /// In the message, not a `#[source]`: `{:#}` would print it twice.
        error: io::Error,
    },
}

impl StoreError {
    /// Whether this is [`StoreError::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::NotFound { .. })
    }

    /// An [`StoreError::Io`] on `object`, or [`StoreError::NotFound`] when the OS says so.
    pub(crate) fn io(object: impl std::fmt::Display, op: &'static str, error: io::Error) -> Self {
        if error.kind() == io::ErrorKind::NotFound {
            return StoreError::NotFound {
                object: object.to_string(),
            };
        }
        StoreError::Io {
            object: object.to_string(),
            op,
            error,
        }
    }
}

/// An error and its causes on one line, each cause once (`object_store` errors often
/// repeat their source's text in their own).
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

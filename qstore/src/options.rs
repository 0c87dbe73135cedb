//! [`StoreOptions`], the limits and timeouts of a [`Store`](crate::Store), and their
//! defaults.

use std::time::Duration;

/// How long one operation (a read, a part, a listing) may take, retries included: long
/// enough to ride out an S3 server restart or a throttling burst, short enough that a dead
/// endpoint is reported within a minute.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);
/// Bytes per ranged GET: large enough that per-request latency (~10-50 ms on S3) is a
/// small part of the transfer time, small enough to keep per-run read-ahead memory low.
pub const DEFAULT_READ_CHUNK: usize = 4 << 20;
/// Ranged GETs in flight per reader: one being consumed while the next arrives.
pub const DEFAULT_IN_FLIGHT: usize = 2;
/// Ranged GETs in flight across every reader of one store: each reader keeps its
/// `in_flight`, but beyond this many at once the rest wait their turn, so a merge of 1000
/// runs sends the server 32 GETs at a time, not 2000 (a burst S3 answers with 503 Slow
/// Down). At 64 runs the cap changed the merge's speed by 1.02-1.05x, within the noise
/// (BENCHMARKS.md, "The merge at the machine's limit").
pub const DEFAULT_MAX_GETS: usize = 32;
/// Multipart part size: S3 allows at most 10,000 parts, so 8 MiB parts allow 78 GiB runs.
pub const DEFAULT_PART_SIZE: usize = 8 << 20;
/// S3 rejects parts smaller than 5 MiB (except the last) when the upload is completed.
pub const S3_MIN_PART_SIZE: usize = 5 << 20;
/// S3's largest part.
pub const S3_MAX_PART_SIZE: usize = 5 << 30;

/// Limits and timeouts of a [`crate::Store`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// Total time for one operation, retries with backoff included.
    pub deadline: Duration,
    /// Bytes per ranged GET in [`crate::Object::read_ranges`] (and per local read).
    pub read_chunk: usize,
    /// Ranged GETs in flight per [`crate::RangeReader`].
    pub in_flight: usize,
    /// Ranged GETs in flight across the store's readers together.
    pub max_gets: usize,
    /// Multipart part size of S3 uploads (kept within S3's 5 MiB..5 GiB).
    pub part_size: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            deadline: DEFAULT_DEADLINE,
            read_chunk: DEFAULT_READ_CHUNK,
            in_flight: DEFAULT_IN_FLIGHT,
            max_gets: DEFAULT_MAX_GETS,
            part_size: DEFAULT_PART_SIZE,
        }
    }
}

impl StoreOptions {
    /// The same with every value within what works: no zero sizes, parts S3 accepts.
    pub(crate) fn sane(self) -> StoreOptions {
        StoreOptions {
            deadline: self.deadline.max(Duration::from_millis(1)),
            read_chunk: self.read_chunk.max(1),
            in_flight: self.in_flight.max(1),
            max_gets: self.max_gets.clamp(1, tokio::sync::Semaphore::MAX_PERMITS),
            part_size: self.part_size.clamp(S3_MIN_PART_SIZE, S3_MAX_PART_SIZE),
        }
    }
}

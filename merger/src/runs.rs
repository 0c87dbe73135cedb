//! Runs as the merger reads them: [`qformat::run::RangedRun`] over a store's objects
//! ([`qstore::Object`] implements its [`qformat::run::RangeRead`]), with the read sizes a
//! merge of many inputs keeps within its memory budget.

use bytes::Bytes;
use qformat::run::{RangedError, RangedRun, RunBlocks};
use qstore::{Location, Object, Store, StoreError};

use crate::MergeError;

/// What all inputs of one merge may hold in reads in flight together, for local files:
/// the store's read size is cut to fit (see [`read_options`]), so a merge of 64 runs
/// holds about as much as one of 4, not 16 times as much. The OS reads ahead of a local
/// file, so small reads cost little.
pub const READ_BUDGET: usize = 64 << 20;
/// The same for a merge that reads from an object store, where every read is a request
/// and the server's cost is mostly per request: 512 KiB reads made a 64-run merge from
/// SeaweedFS 8 times slower than from a directory, and 2 MiB ones cost it 1.4 times the
/// CPU of 4 MiB ones (BENCHMARKS.md, "The merge at the machine's limit"), so the budget is
/// large enough for 4 MiB GETs, two per input, up to 64 inputs.
pub const READ_BUDGET_S3: usize = 512 << 20;
/// The smallest read from a local file (one block, so a group of blocks is never cut).
pub const MIN_READ_CHUNK: usize = 256 << 10;
/// The smallest ranged GET from an object store (the store aligns its GETs to the read
/// size; 4 MiB, SeaweedFS's chunk, is best, and the budget gives that up to 64 inputs).
pub const MIN_READ_CHUNK_S3: usize = 1 << 20;
/// Ranged GETs a merge from an object store keeps in flight across all its inputs: one GET
/// waits on a round trip and the server's disk, so a few inputs need many each to keep
/// the server busy (BENCHMARKS.md, "Runs"). Each input asks for at least two (the one
/// being merged while the next arrives; at most [`MAX_IN_FLIGHT_S3`]); beyond this many
/// at once, the store has the rest wait their turn (`StoreOptions::max_gets`).
pub const IN_FLIGHT_S3: usize = 32;
/// The most ranged GETs one input keeps in flight.
pub const MAX_IN_FLIGHT_S3: usize = 4;

/// `base` with its read size cut so that `inputs` runs read by `jobs` threads, each with
/// `base.in_flight` reads outstanding, stay within [`READ_BUDGET`] ([`READ_BUDGET_S3`]
/// when any input is in an object store).
pub fn read_options(
    base: qstore::StoreOptions,
    inputs: usize,
    jobs: usize,
    s3: bool,
) -> qstore::StoreOptions {
    let (budget, min) = if s3 {
        (READ_BUDGET_S3, MIN_READ_CHUNK_S3)
    } else {
        (READ_BUDGET, MIN_READ_CHUNK)
    };
    let streams = inputs.max(1) * jobs.max(1);
    let in_flight = if s3 {
        (IN_FLIGHT_S3 / streams).clamp(2, MAX_IN_FLIGHT_S3)
    } else {
        base.in_flight.max(1)
    };
    let chunk = (budget / (streams * in_flight)).clamp(min, base.read_chunk.max(min));
    qstore::StoreOptions {
        read_chunk: chunk,
        in_flight,
        max_gets: if s3 { IN_FLIGHT_S3 } else { base.max_gets },
        ..base
    }
}

/// An opened run read from a store: [`RangedRun`] over an [`Object`].
pub type RunInput = RangedRun<Object>;

/// Opens the run at `location`: one read of its tail (two when its metadata is larger
/// than [`qformat::run::TAIL_GUESS`]), in groups of the store's read size.
///
/// # Errors
/// [`MergeError::Store`] (missing, unreadable, credentials), [`MergeError::Run`] (not a
/// run, truncated, corrupt metadata), [`MergeError::VersionOne`] for a version 1 list.bin,
/// [`MergeError::ParquetInput`] for a Parquet file.
pub fn open_run(store: &Store, location: &Location) -> Result<RunInput, MergeError> {
    let object = store.open(location)?;
    // A local file is read in groups of whole blocks (no block is ever split across two
    // reads); an object is asked for all its blocks at once, and the store cuts that into
    // GETs aligned to its read size, as the object is stored (BENCHMARKS.md, "The merge
    // at the machine's limit"): the few blocks split across two GETs are copied together.
    let group_bytes = if location.is_s3() {
        u64::MAX
    } else {
        store.options().read_chunk as u64
    };
    Ok(RangedRun::open(object, location.to_string(), group_bytes)?)
}

impl From<RangedError<StoreError>> for MergeError {
    fn from(e: RangedError<StoreError>) -> MergeError {
        match e {
            RangedError::Read(e) => MergeError::Store(e),
            RangedError::Run { name, error } => MergeError::Run { name, error },
            RangedError::VersionOne { name } => MergeError::VersionOne { name },
            RangedError::Parquet { name } => MergeError::ParquetInput { name },
        }
    }
}

impl crate::kway::Blocks for RunBlocks<StoreError> {
    fn next_block(&mut self) -> Result<Option<Bytes>, MergeError> {
        Ok(RunBlocks::next_block(self)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_ahead_fits_the_budget_whatever_the_input_count() {
        let base = qstore::StoreOptions::default();
        for s3 in [false, true] {
            let (budget, min) = if s3 {
                (READ_BUDGET_S3, MIN_READ_CHUNK_S3)
            } else {
                (READ_BUDGET, MIN_READ_CHUNK)
            };
            for (inputs, jobs) in [(1, 1), (4, 1), (64, 1), (64, 4), (1000, 1)] {
                let o = read_options(base, inputs, jobs, s3);
                assert!(o.read_chunk >= min && o.read_chunk <= base.read_chunk.max(min));
                let held = inputs * jobs * o.in_flight * o.read_chunk;
                assert!(
                    held <= budget || o.read_chunk == min,
                    "{inputs}x{jobs}: {held}"
                );
            }
            assert_eq!(read_options(base, 4, 1, s3).read_chunk, base.read_chunk);
        }
    }
}

//! qstore: where qlist's runs live, a local directory or an object store speaking the S3 API.
//!
//! Producers seal a finished sublist into a *run* (an immutable file, format owned by the
//! `qformat` crate) and write it to a [`Location`]: a local directory or `s3://bucket/prefix`.
//! The merger lists the runs there and reads them with ranged reads.
//!
//! - [`Location`]: a parsed place (`/data/runs`, `s3://bucket/runs`) and the runs in it.
//! - [`Store`]: the entry point, one per process: [`Store::list_runs`], [`Store::open`],
//!   [`Store::create`], [`Store::exists`]; for small objects (a producer's checkpoints and
//!   segments) [`Store::list_names`], [`Store::read_small`], [`Store::delete`],
//!   [`Store::make_dirs`]. Synchronous; S3 requests run on a small tokio
//!   runtime the store owns.
//! - [`Object`]: one run opened for reading; [`Object::read_ranges`] gives a
//!   [`RangeReader`] with bounded read-ahead.
//! - [`Upload`]: an atomic write (`std::io::Write`), visible only after [`Upload::finish`].
//! - [`StoreError`]: every failure, naming the location; never a credential.
//!
//! S3 settings come from the usual `AWS_*` environment variables ([`S3Config::from_env`]).
//! Every S3 operation is retried with backoff on transient failures until
//! [`StoreOptions::deadline`]; an object is read at the version (ETag) it had when opened.

mod dir;
mod error;
mod location;
mod object;
mod options;
mod s3;
mod store;
mod tasks;
mod upload;

pub use error::StoreError;
pub use location::Location;
pub use object::{Object, RangeReader};
pub use options::{
    StoreOptions, DEFAULT_DEADLINE, DEFAULT_IN_FLIGHT, DEFAULT_PART_SIZE, DEFAULT_READ_CHUNK,
    S3_MAX_PART_SIZE, S3_MIN_PART_SIZE,
};
pub use s3::S3Config;
pub use store::Store;
pub use upload::Upload;

#[cfg(test)]
mod s3_tests;
#[cfg(test)]
mod tests;

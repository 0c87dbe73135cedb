//! Where a merge writes: a run (list.bin version 2) or a Parquet file
//! ([`crate::parquet_list`]), behind one trait, so the merge, `--part` and `--jobs` are one
//! piece of code for both formats and every record passes the same
//! [`sublist::run::WriteCheck`].

use std::io::{Read, Write};

use sublist::run::{RunError, RunMeta, RunWriter};
use sublist::Record;

use crate::MergeError;

/// A list being written.
pub trait ListSink {
    /// Appends one record (IDs strictly increasing, in the part's range, seqs following on).
    ///
    /// # Errors
    /// [`MergeError::Run`] for a record that breaks the rules, or a write error.
    fn write(&mut self, r: &Record) -> Result<(), MergeError>;

    /// Appends a run merged elsewhere (`--jobs`): `meta` its metadata, `blocks` the bytes
    /// of its blocks, from the first to the index.
    ///
    /// # Errors
    /// As [`ListSink::write`].
    fn append_run(&mut self, meta: &RunMeta, blocks: &mut dyn Read) -> Result<(), MergeError>;

    /// Records written so far.
    fn records(&self) -> u64;

    /// Bytes written so far (progress; what is buffered included).
    fn bytes(&self) -> u64;
}

/// A [`RunWriter`] with the name its errors carry.
pub struct RunSink<W: Write> {
    /// The writer.
    pub writer: RunWriter<W>,
    /// The output's name (`--out`), for errors.
    pub name: String,
}

impl<W: Write> RunSink<W> {
    fn err(&self) -> impl FnOnce(RunError) -> MergeError + '_ {
        |error| MergeError::Run {
            name: self.name.clone(),
            error,
        }
    }
}

impl<W: Write> ListSink for RunSink<W> {
    fn write(&mut self, r: &Record) -> Result<(), MergeError> {
        let result = self.writer.write(r);
        result.map_err(self.err())
    }

    fn append_run(&mut self, meta: &RunMeta, mut blocks: &mut dyn Read) -> Result<(), MergeError> {
        let result = self.writer.append_run(meta, &mut blocks);
        result.map_err(self.err())
    }

    fn records(&self) -> u64 {
        self.writer.records()
    }

    fn bytes(&self) -> u64 {
        self.writer.bytes()
    }
}

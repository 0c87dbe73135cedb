//! Where a merge writes: a run (list.bin version 2) or a Parquet file
//! ([`crate::parquet_list`]), behind one trait, so the merge, `--part` and `--jobs` are one
//! piece of code for both formats and every record passes the same
//! [`qformat::run::WriteCheck`].

use std::io::{Read, Write};

use qformat::run::{RangeWritten, RunError, RunWriter};

use crate::MergeError;

/// A list being written.
pub trait ListSink {
    /// Appends whole encoded records, one after another (a merge's stretch; IDs strictly
    /// increasing, in the part's range, seqs following on), each checked.
    ///
    /// # Errors
    /// [`MergeError::Run`] for a record that breaks the rules, or a write error.
    fn write_encoded(&mut self, records: &[u8]) -> Result<(), MergeError>;

    /// Takes the next range of the list, merged by another thread (`--jobs`): its blocks
    /// are `bytes` (read from the range's start), or, for `None`, already in place in the
    /// file after this list's (a run written into its own file).
    ///
    /// # Errors
    /// As [`ListSink::write_encoded`]; a sink that needs the bytes and gets none.
    fn join_range(
        &mut self,
        range: &RangeWritten,
        bytes: Option<&mut dyn Read>,
    ) -> Result<(), MergeError>;

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
    fn write_encoded(&mut self, records: &[u8]) -> Result<(), MergeError> {
        let result = self.writer.write_encoded(records);
        result.map_err(self.err())
    }

    fn join_range(
        &mut self,
        range: &RangeWritten,
        bytes: Option<&mut dyn Read>,
    ) -> Result<(), MergeError> {
        let result = self.writer.join_range(range, bytes);
        result.map_err(self.err())
    }

    fn records(&self) -> u64 {
        self.writer.records()
    }

    fn bytes(&self) -> u64 {
        self.writer.bytes()
    }
}

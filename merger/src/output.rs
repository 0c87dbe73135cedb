//! Writing one list, a merge's or a conversion's output: in which format
//! ([`OutputFormat`]), through an atomic upload of the store ([`write_list`]: the list is
//! complete under its name, or nothing is), and what was written ([`ListWritten`]).

use std::time::Duration;

use qformat::run::{Part, RunWriter, ShardSpec};
use qstore::{Location, Store};

use crate::parquet_list::{ParquetOptions, ParquetWriter};
use crate::sink::{ListSink, RunSink};
use crate::MergeError;

/// What an output is written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// list.bin version 2: a run.
    Bin,
    /// Parquet.
    Parquet(ParquetOptions),
}

/// What a merge or a conversion wrote into its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListWritten {
    /// Records in the list.
    pub records: u64,
    /// Shards in the list's shard table.
    pub shards: usize,
    /// Bytes of the output, as uploaded.
    pub bytes: u64,
    /// The part of the ID space the list covers.
    pub part: Part,
    /// Parquet: row groups.
    pub row_groups: Option<u64>,
}

impl ListWritten {
    /// The line the binary prints once `out` is complete, `elapsed` after the start:
    /// `"{verb} N items from S shards into OUT...: MB, seconds, rates"`.
    #[must_use]
    pub fn summary(&self, verb: &str, out: &Location, elapsed: Duration) -> String {
        let secs = elapsed.as_secs_f64();
        let mb = self.bytes as f64 / 1e6;
        let mut what = String::new();
        if !self.part.is_whole() {
            what = format!(
                " ({}, ids {}..={})",
                self.part, self.part.first_id, self.part.last_id
            );
        }
        if let Some(groups) = self.row_groups {
            what.push_str(&format!(" as Parquet ({groups} row groups)"));
        }
        format!(
            "{verb} {} items from {} shards into {out}{what}: {:.1} MB in {:.2}s ({:.1} MB/s, {:.0} items/s)",
            self.records,
            self.shards,
            mb,
            secs,
            mb / secs.max(1e-9),
            self.records as f64 / secs.max(1e-9),
        )
    }
}

/// Fills a list: the sink, and for a run written into a local file, another handle to
/// that file (`--jobs` writes its ranges into their places through it).
pub type Fill<'a> =
    dyn FnMut(&mut dyn ListSink, Option<std::fs::File>) -> Result<(), MergeError> + 'a;

/// Writes a list of `specs`' shards and `part` into an atomic upload of `out`, in
/// `format`, the records coming from `fill`: complete, or nothing under that name.
///
/// # Errors
/// [`MergeError::Output`] for the upload, [`MergeError::Run`] or a Parquet error for a
/// record that breaks the rules, and every error of `fill`.
pub fn write_list(
    store: &Store,
    out: &Location,
    format: OutputFormat,
    specs: Vec<ShardSpec>,
    part: Part,
    fill: &mut Fill<'_>,
) -> Result<ListWritten, MergeError> {
    let name = out.to_string();
    let output = |error| MergeError::Output {
        out: name.clone(),
        error,
    };
    let upload = store.create(out).map_err(output)?;
    let (upload, mut written) = match format {
        OutputFormat::Bin => {
            let run_err = |error| MergeError::Run {
                name: name.clone(),
                error,
            };
            let own_file = upload.local_file().map_err(output)?;
            let writer = RunWriter::new(upload, specs, part).map_err(run_err)?;
            let mut sink = RunSink {
                writer,
                name: name.clone(),
            };
            let in_place = own_file.is_some();
            fill(&mut sink, own_file)?;
            if in_place {
                // Past the blocks written into place (a no-op when none were), where the
                // open block and then the index go.
                let end = sink.writer.block_offset();
                let moved = sink.writer.get_mut().skip_to(end);
                moved.map_err(|e| run_err(e.into()))?;
            }
            let (upload, meta) = sink.writer.finish().map_err(run_err)?;
            let written = ListWritten {
                records: meta.records(),
                shards: meta.shards.len(),
                bytes: 0,
                part,
                row_groups: None,
            };
            (upload, written)
        }
        OutputFormat::Parquet(opts) => {
            let mut writer = ParquetWriter::new(upload, specs, part, &opts, &name)?;
            fill(&mut writer, None)?;
            let (upload, summary) = writer.finish()?;
            let written = ListWritten {
                records: summary.records,
                shards: summary.shards.len(),
                bytes: 0,
                part,
                row_groups: Some(summary.row_groups),
            };
            (upload, written)
        }
    };
    written.bytes = upload.finish().map_err(output)?;
    Ok(written)
}

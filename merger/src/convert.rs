//! `merger convert`: a list already merged (a run: a merged list, a sealed sublist, one
//! part of a split, or all K parts in order) written again in another format, Parquet.
//! Every record passes the writer's [`qformat::run::WriteCheck`] as in a merge, and every
//! block's checksum is checked as it is read. [`convert_files`] is the whole command
//! once its flags are checked; [`plan`] and [`convert`] its two steps.

use qformat::run::{Part, ShardSpec};
use qstore::{Location, Store};

use crate::output::{write_list, ListWritten, OutputFormat};
use crate::parquet_list::ParquetOptions;
use crate::progress::MergeProgress;
use crate::runs::{open_run, RunInput};
use crate::sink::ListSink;
use crate::{MergeError, PROGRESS_EVERY};

/// Opens the runs at `locations` from `store` and writes their records, in order, as
/// Parquet with `opts` into an atomic upload of `out`, reporting to `progress`.
///
/// # Errors
/// Every error of [`open_run`], [`plan`], [`convert`] and
/// [`write_list`]; nothing is then left under `out`.
pub fn convert_files(
    store: &Store,
    locations: &[Location],
    out: &Location,
    opts: ParquetOptions,
    progress: &mut MergeProgress,
) -> Result<ListWritten, MergeError> {
    let runs = locations
        .iter()
        .map(|l| open_run(store, l))
        .collect::<Result<Vec<_>, _>>()?;
    let (specs, part) = plan(&runs)?;
    progress.set_total(runs.iter().map(|r| r.meta.records()).sum());
    let mut report = |records, bytes| progress.update(records, bytes);
    write_list(
        store,
        out,
        OutputFormat::Parquet(opts),
        specs,
        part,
        &mut |writer, _| convert(&runs, writer, &mut report),
    )
}

/// The shards and the part that `runs` hold together: one run's own, or, for the K
/// parts of one split given in order (checked as `merger verify` does), the whole list.
///
/// # Errors
/// [`MergeError::NoInputs`]; [`MergeError::ListCheck`] for files that are not one list,
/// one part, or all parts of one split in order.
pub fn plan(runs: &[RunInput]) -> Result<(Vec<ShardSpec>, Part), MergeError> {
    let Some(first) = runs.first() else {
        return Err(MergeError::NoInputs);
    };
    let mut table = first;
    let part = if runs.len() == 1 {
        first.meta.part()
    } else {
        crate::verify::check_parts(runs)?;
        let last = &runs[runs.len() - 1];
        match last.meta.part() {
            // A follow's parts: the last one's table holds the totals; a follow not yet
            // complete is one part of it, from id 0 to where its parts end.
            p if p.is_follow() => {
                table = last;
                if p.last_id == u64::MAX {
                    Part::WHOLE
                } else {
                    Part::follow(0, 0, p.last_id)
                }
            }
            _ => Part::WHOLE,
        }
    };
    let specs = table
        .meta
        .shards
        .iter()
        .map(|s| ShardSpec {
            shard: s.shard,
            finished: s.finished,
            total: s.total,
        })
        .collect();
    Ok((specs, part))
}

/// Writes the records of `runs`, in order, into `writer` (made for [`plan`]'s shards and
/// part). `progress(records, bytes)` is called every [`PROGRESS_EVERY`] records and at the end.
///
/// # Errors
/// Reading a run (checksums, order), and every error of the writer.
pub fn convert(
    runs: &[RunInput],
    writer: &mut dyn ListSink,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), MergeError> {
    let mut report_at = PROGRESS_EVERY;
    for run in runs {
        let mut blocks = run.blocks(0, u64::MAX);
        while let Some(block) = blocks.next_block()? {
            writer.write_encoded(&block)?;
            if writer.records() >= report_at {
                progress(writer.records(), writer.bytes());
                report_at = writer.records() + PROGRESS_EVERY;
            }
        }
    }
    progress(writer.records(), writer.bytes());
    Ok(())
}

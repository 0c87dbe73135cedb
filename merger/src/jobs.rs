//! `merger --jobs J`: the split of `--part` inside one process. The ID space is cut into
//! J ranges by the same split points ([`crate::split::split`]); range 0 is merged straight
//! into the output while ranges 1.. are merged at the same time, each by its own thread
//! into a temporary run, and appended in order ([`ListSink::append_run`]: a run's blocks
//! as they are, or Parquet rows) as the output reaches them. The output is one whole
//! list, as one merge would write it (the records are the same; block or row group
//! boundaries may differ where the ranges meet).

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom};
use std::path::Path;

use sublist::run::{Part, RunMeta, RunWriter, HEADER_LEN};

use crate::inputs::{run_sources, write_merged, Inputs};
use crate::sink::{ListSink, RunSink};
use crate::MergeError;

/// Buffer of a temporary run's writer: written once, sequentially.
const SPILL_BUFFER: usize = 1 << 20;

/// Merges `inputs` (runs only) with `jobs` threads into `writer`, a whole list (a run or
/// Parquet, made and finished by the caller).
///
/// # Errors
/// [`MergeError::SplitNeedsRuns`] for a sublist among the inputs, every error of the
/// merge, and [`MergeError::Run`] for a temporary file that cannot be written in `tmp_dir`.
pub fn merge_jobs(
    inputs: &Inputs,
    jobs: u32,
    tmp_dir: &Path,
    writer: &mut dyn ListSink,
    out: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), MergeError> {
    if let Some(s) = inputs.sublists.first() {
        return Err(MergeError::SplitNeedsRuns {
            path: s.reader.path().to_path_buf(),
        });
    }
    let run_err = |error| MergeError::Run {
        name: out.to_string(),
        error,
    };
    let parts = crate::split::split(&inputs.metas(), jobs);
    let specs = inputs.shard_specs();
    std::thread::scope(|scope| {
        let spills: Vec<_> = parts[1..]
            .iter()
            .map(|&part| {
                let specs = specs.clone();
                scope.spawn(move || spill(inputs, specs, part, tmp_dir, out))
            })
            .collect();
        write_merged(writer, run_sources(&inputs.runs, parts[0]), progress)?;
        for handle in spills {
            let (mut file, meta) = handle.join().map_err(|_| MergeError::Run {
                name: out.to_string(),
                error: sublist::run::RunError::Io(std::io::Error::other("a merge thread panicked")),
            })??;
            file.seek(SeekFrom::Start(HEADER_LEN))
                .map_err(|e| run_err(e.into()))?;
            writer.append_run(
                &meta,
                &mut std::io::BufReader::with_capacity(SPILL_BUFFER, file),
            )?;
            progress(writer.records(), writer.bytes());
        }
        progress(writer.records(), writer.bytes());
        Ok(())
    })
}

/// Merges one range into an anonymous temporary file (gone when closed, even after kill -9).
fn spill(
    inputs: &Inputs,
    specs: Vec<sublist::run::ShardSpec>,
    part: Part,
    tmp_dir: &Path,
    out: &str,
) -> Result<(File, RunMeta), MergeError> {
    let name = format!("{out} (temporary file for {part} in {})", tmp_dir.display());
    let run_err = |error| MergeError::Run {
        name: name.clone(),
        error,
    };
    let file = tempfile::tempfile_in(tmp_dir).map_err(|e| run_err(e.into()))?;
    let sink = BufWriter::with_capacity(SPILL_BUFFER, file);
    let writer = RunWriter::new(sink, specs, part).map_err(run_err)?;
    let mut writer = RunSink {
        writer,
        name: name.clone(),
    };
    write_merged(&mut writer, run_sources(&inputs.runs, part), &mut |_, _| {})?;
    let (sink, meta) = writer.writer.finish().map_err(run_err)?;
    let file = sink
        .into_inner()
        .map_err(|e| run_err(e.into_error().into()))?;
    Ok((file, meta))
}

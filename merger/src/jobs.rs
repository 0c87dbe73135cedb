//! `merger --jobs J`: the split of `--part` inside one process, written as one list.
//!
//! The ID space is cut into J ranges near the split points of [`crate::split::split`],
//! each cut moved forward to where the whole list's block boundary falls (a run's blocks
//! end where the list's record bytes reach a multiple of the block target, counted from
//! the list's start: [`qformat::run::RunWriter`]). So each range's blocks are exactly the
//! whole list's blocks there, and where each range starts in the file is known before
//! anything is merged: its record bytes before it, plus one CRC per block before it.
//! Range 0 is merged by the calling thread straight into the output, the others at the
//! same time by their own threads, each writing its blocks at their offsets (into the
//! output file itself, or for an output that is not a local file, into one temporary
//! file that is then copied after range 0). The output is byte for byte the list one
//! merge writes.
//!
//! The plan needs a record to cross at most one block boundary: no record longer than
//! the block target. Inputs whose index cannot rule that out (payloads of more than
//! ~200 KiB) are merged by one thread, which says so.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use qformat::run::{
    check_block, is_block_boundary, next_boundary, BlockEntry, BlockRecords, Part, RangeStart,
    RangeWritten, RunError, RunWriter, ShardSpec, BLOCK_TARGET,
};

use crate::inputs::{run_inputs, write_merged, Inputs};
use crate::kway::Merger;
use crate::runs::RunInput;
use crate::sink::ListSink;
use crate::MergeError;

/// Bytes a range's writer gathers before one positioned write.
const RANGE_BUFFER: usize = 1 << 20;

/// One range of a `--jobs` merge: its IDs and where its blocks start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// Its IDs (a part of `count` = J parts; may be empty).
    pub ids: Part,
    /// Its first block's offset and position in the whole list.
    pub start: RangeStart,
}

/// The ranges of a merge of `runs` with `jobs` threads, in order, tiling the ID space;
/// `None` when the runs may hold a record longer than a block (then one thread merges).
///
/// # Errors
/// Reading or checking the blocks around a cut, and the merge's own errors there (a
/// duplicate, a record out of order).
pub fn plan(runs: &[RunInput], jobs: u32) -> Result<Option<Vec<Range>>, MergeError> {
    let big = runs
        .iter()
        .flat_map(|r| r.meta.blocks.iter())
        .any(BlockEntry::may_hold_long_record);
    if big {
        return Ok(None);
    }
    let metas: Vec<_> = runs.iter().map(|r| &r.meta).collect();
    let parts = crate::split::split(&metas, jobs);
    let mut starts = vec![(0u64, RangeStart::FIRST)];
    for p in &parts[1..] {
        let prev = starts[starts.len() - 1].0;
        if p.first_id <= prev {
            continue;
        }
        if let Some(cut) = natural_cut(runs, p.first_id)? {
            if cut.0 > prev {
                starts.push(cut);
            }
        }
    }
    let count = starts.len() as u32;
    let ranges = (0..starts.len())
        .map(|i| Range {
            ids: Part {
                index: i as u32,
                count,
                first_id: starts[i].0,
                last_id: starts.get(i + 1).map_or(u64::MAX, |s| s.0 - 1),
            },
            start: starts[i].1,
        })
        .collect();
    Ok(Some(ranges))
}

/// The first block boundary of the whole list at or after the records below `x`: the
/// ID it starts at and where. `None` if no boundary follows (the list ends first).
fn natural_cut(runs: &[RunInput], x: u64) -> Result<Option<(u64, RangeStart)>, MergeError> {
    let mut position = 0u64;
    for run in runs {
        position += bytes_below(run, x)?;
    }
    if is_block_boundary(position) {
        return Ok(Some((x, RangeStart::at_position(position))));
    }
    let boundary = next_boundary(position);
    let rest = Part {
        index: 0,
        count: 1,
        first_id: x,
        last_id: u64::MAX,
    };
    let mut merger = Merger::new(run_inputs(runs, rest));
    while let Some(stretch) = merger.next_stretch()? {
        for r in stretch.iter() {
            position += r.encoded.len() as u64;
            if position >= boundary {
                let start = RangeStart::at_position(position);
                return Ok(r.id.checked_add(1).map(|next| (next, start)));
            }
        }
    }
    Ok(None)
}

/// Record bytes of `run` with IDs below `x`: the index's for whole blocks, the records'
/// own for the block that straddles `x` (read and checked).
fn bytes_below(run: &RunInput, x: u64) -> Result<u64, MergeError> {
    let blocks = &run.meta.blocks;
    let whole = blocks.partition_point(|b| b.last_id < x);
    let mut bytes: u64 = blocks[..whole].iter().map(BlockEntry::record_bytes).sum();
    if let Some(b) = blocks.get(whole).filter(|b| b.first_id < x) {
        let read = run.read_block(b)?;
        let body = check_block(&read, b, whole as u64).map_err(|error| MergeError::Run {
            name: run.name.clone(),
            error,
        })?;
        bytes += BlockRecords::new(body)
            .take_while(|r| r.id < x)
            .map(|r| r.encoded.len() as u64)
            .sum::<u64>();
    }
    Ok(bytes)
}

/// Writes at increasing offsets of a file, in pieces of [`RANGE_BUFFER`].
struct PositionedWriter<'f> {
    file: &'f File,
    /// Where `buf` goes.
    offset: u64,
    buf: Vec<u8>,
}

impl Write for PositionedWriter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= RANGE_BUFFER {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.write_all_at(&self.buf, self.offset)?;
        self.offset += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

/// Merges `range` of `inputs` into `file` at its offsets less `shift`.
fn merge_range(
    inputs: &Inputs,
    specs: Vec<ShardSpec>,
    range: Range,
    file: &File,
    shift: u64,
    name: &str,
) -> Result<RangeWritten, MergeError> {
    let run_err = |error| MergeError::Run {
        name: name.to_string(),
        error,
    };
    let out = PositionedWriter {
        file,
        offset: range.start.offset - shift,
        buf: Vec::with_capacity(RANGE_BUFFER + BLOCK_TARGET),
    };
    let writer = RunWriter::range(out, specs, range.ids, range.start);
    let mut sink = crate::sink::RunSink {
        writer,
        name: name.to_string(),
    };
    write_merged(
        &mut sink,
        run_inputs(&inputs.runs, range.ids),
        &mut |_, _| {},
    )?;
    let (_, written) = sink.writer.finish_range(range.start).map_err(run_err)?;
    Ok(written)
}

/// Where the ranges after the first are written: the output file itself (their blocks
/// are then in place), or a temporary file copied in after the first range.
pub enum RangeFile {
    /// The output's own (temporary) file.
    InPlace(File),
    /// A temporary file in this directory.
    Apart(std::path::PathBuf),
}

/// Merges `inputs` (runs only) with `jobs` threads into `writer`, a whole list (a run or
/// Parquet, made and finished by the caller), as [`plan`] splits it; one thread when the
/// plan says so.
///
/// # Errors
/// [`MergeError::SplitNeedsRuns`] for a sublist among the inputs, every error of the
/// merge, and [`MergeError::Run`] for a temporary file that cannot be written.
pub fn merge_jobs(
    inputs: &Inputs,
    jobs: u32,
    files: RangeFile,
    writer: &mut dyn ListSink,
    out: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), MergeError> {
    if let Some(s) = inputs.sublists.first() {
        return Err(MergeError::SplitNeedsRuns {
            path: s.reader.path().to_path_buf(),
        });
    }
    if let Some(p) = inputs.published.first() {
        return Err(MergeError::SplitPublished {
            name: p.name.clone(),
        });
    }
    let Some(ranges) = plan(&inputs.runs, jobs)? else {
        tracing::warn!(
            jobs,
            "--jobs: the runs may hold records longer than a block ({BLOCK_TARGET} bytes), \
             which the split into ranges cannot place in advance; merging with one thread"
        );
        return crate::inputs::merge_inputs(inputs, Part::WHOLE, writer, progress);
    };
    tracing::debug!(?ranges, "--jobs ranges");
    let target = match files {
        RangeFile::InPlace(file) => RangeTarget {
            file,
            shift: 0,
            in_place: true,
        },
        RangeFile::Apart(dir) => RangeTarget {
            file: temp_file(&dir, out)?,
            shift: ranges.get(1).map_or(0, |r| r.start.offset),
            in_place: false,
        },
    };
    let threads = merge_ranges(inputs, &ranges, &target, writer, out, progress)?;
    // Distinct threads, counted where the ranges were merged: the one figure that shows
    // the ranges did not run one after another on a single thread (merger/tests/runs.rs).
    tracing::info!(
        ranges = ranges.len(),
        threads,
        "--jobs: {} ranges merged by {threads} threads",
        ranges.len()
    );
    Ok(())
}

/// Where the ranges after the first are written ([`RangeFile`], opened): at their
/// offsets less `shift` in `file`, which is the output itself if `in_place`.
struct RangeTarget {
    file: File,
    shift: u64,
    in_place: bool,
}

/// Merges `ranges[0]` into `writer` on this thread while a thread each merges the
/// others into `target`, then joins those into `writer` in order: how many distinct
/// threads merged ranges.
fn merge_ranges(
    inputs: &Inputs,
    ranges: &[Range],
    target: &RangeTarget,
    writer: &mut dyn ListSink,
    out: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<usize, MergeError> {
    let run_err = |error| MergeError::Run {
        name: out.to_string(),
        error,
    };
    let (file, shift, specs) = (&target.file, target.shift, inputs.shard_specs());
    std::thread::scope(|scope| {
        let handles: Vec<_> = ranges[1..]
            .iter()
            .map(|&range| {
                let specs = specs.clone();
                scope.spawn(move || {
                    let merged = merge_range(inputs, specs, range, file, shift, out);
                    (std::thread::current().id(), merged)
                })
            })
            .collect();
        let mut threads = HashSet::from([std::thread::current().id()]);
        let merged = write_merged(writer, run_inputs(&inputs.runs, ranges[0].ids), progress);
        // Every thread is joined before an error is returned: none outlives the output.
        let mut written = Vec::with_capacity(handles.len());
        for handle in handles {
            written.push(handle.join().map_err(|_| {
                run_err(RunError::Io(std::io::Error::other(
                    "a merge thread panicked",
                )))
            }));
        }
        merged?;
        let mut apart = if target.in_place {
            None
        } else {
            let mut f = file.try_clone().map_err(|e| run_err(e.into()))?;
            f.seek(SeekFrom::Start(0)).map_err(|e| run_err(e.into()))?;
            Some(BufReader::with_capacity(RANGE_BUFFER, f))
        };
        for joined in written {
            let (thread, range) = joined?;
            threads.insert(thread);
            let bytes = apart.as_mut().map(|r| r as &mut dyn std::io::Read);
            writer.join_range(&range?, bytes)?;
            progress(writer.records(), writer.bytes());
        }
        progress(writer.records(), writer.bytes());
        Ok(threads.len())
    })
}

/// An anonymous temporary file in `dir` (gone when closed, even after kill -9).
fn temp_file(dir: &Path, out: &str) -> Result<File, MergeError> {
    tempfile::tempfile_in(dir).map_err(|e| MergeError::Run {
        name: format!("{out} (temporary file for --jobs in {})", dir.display()),
        error: e.into(),
    })
}

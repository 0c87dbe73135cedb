//! A merge's inputs, any mix of RocksDB sublists and runs: opening them, the checks that
//! span them (disjoint shards, `--expect-shards`), and the merge itself into a list
//! ([`ListSink`]: a run or Parquet).

use std::collections::BTreeMap;
use std::path::PathBuf;

use qformat::names::has_run_suffix;
use qformat::run::{Part, RunMeta, ShardSpec};
use qstore::{Location, Store};

use crate::kway::{Input, Merger, RecordBlocks};
use crate::runs::{open_run, RunInput};
use crate::sink::ListSink;
use crate::{open_shards, MergeError, OpenShard, PROGRESS_EVERY};

/// One input as named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeInput {
    /// A producer's RocksDB sublist (a directory).
    Sublist(PathBuf),
    /// A run: a file or an S3 object.
    Run(Location),
}

impl MergeInput {
    /// An `s3://` URL or a file is a run, a directory a sublist; a path that does not
    /// exist is a run if it ends in `.bin`, else a sublist (so the error says what is missing).
    ///
    /// # Errors
    /// A malformed `s3://` URL.
    pub fn classify(arg: &str) -> Result<MergeInput, MergeError> {
        let location = Location::parse(arg)?;
        Ok(match location {
            Location::Dir(path) if path.is_dir() => MergeInput::Sublist(path),
            Location::Dir(path) if !path.exists() && !has_run_suffix(arg) => {
                MergeInput::Sublist(path)
            }
            run => MergeInput::Run(run),
        })
    }
}

/// The opened inputs of one merge.
pub struct Inputs {
    /// RocksDB sublists, read-only.
    pub sublists: Vec<OpenShard>,
    /// Runs, their metadata read.
    pub runs: Vec<RunInput>,
}

/// Opens every input and checks what spans them: no shard in two inputs, no part of a
/// split merge among them.
///
/// # Errors
/// [`MergeError::NoInputs`], [`MergeError::SameShard`] naming both inputs,
/// [`MergeError::PartInput`], and every error of opening a sublist or a run.
pub fn open_inputs(
    store: &Store,
    specs: &[MergeInput],
    allow_unfinished: bool,
) -> Result<Inputs, MergeError> {
    if specs.is_empty() {
        return Err(MergeError::NoInputs);
    }
    let mut paths = Vec::new();
    let mut runs = Vec::new();
    for spec in specs {
        match spec {
            MergeInput::Sublist(p) => paths.push(p.clone()),
            MergeInput::Run(loc) => runs.push(open_run(store, loc)?),
        }
    }
    let sublists = if paths.is_empty() {
        Vec::new()
    } else {
        open_shards(&paths, allow_unfinished)?
    };
    let inputs = Inputs { sublists, runs };
    inputs.check_runs(allow_unfinished)?;
    inputs.check_disjoint()?;
    Ok(inputs)
}

impl Inputs {
    fn check_runs(&self, allow_unfinished: bool) -> Result<(), MergeError> {
        for run in &self.runs {
            let part = run.meta.part();
            if !part.is_whole() {
                return Err(MergeError::PartInput {
                    name: run.name.clone(),
                    part,
                });
            }
            if let Some(s) = run.meta.shards.iter().find(|s| !s.finished) {
                if !allow_unfinished {
                    return Err(MergeError::Unfinished {
                        path: PathBuf::from(format!("{} (shard {})", run.name, s.shard)),
                        written: s.total,
                    });
                }
            }
        }
        Ok(())
    }

    /// Every shard held, with the name of the input that holds it.
    fn shard_owners(&self) -> Vec<(u32, String)> {
        let mut owners: Vec<(u32, String)> = self
            .sublists
            .iter()
            .map(|s| (s.reader.shard(), s.reader.path().display().to_string()))
            .collect();
        for run in &self.runs {
            for s in &run.meta.shards {
                owners.push((s.shard, run.name.clone()));
            }
        }
        owners
    }

    fn check_disjoint(&self) -> Result<(), MergeError> {
        let mut seen: BTreeMap<u32, String> = BTreeMap::new();
        for (shard, name) in self.shard_owners() {
            if let Some(first) = seen.insert(shard, name.clone()) {
                return Err(MergeError::SameShard {
                    shard,
                    first,
                    second: name,
                });
            }
        }
        Ok(())
    }

    /// Every shard of every input, as the output's shard table will list it.
    pub fn shard_specs(&self) -> Vec<ShardSpec> {
        let mut specs: Vec<ShardSpec> = self
            .sublists
            .iter()
            .map(|s| ShardSpec {
                shard: s.reader.shard(),
                finished: s.finished,
                total: s.items,
            })
            .collect();
        for run in &self.runs {
            specs.extend(run.meta.shards.iter().map(|s| ShardSpec {
                shard: s.shard,
                finished: s.finished,
                total: s.total,
            }));
        }
        specs.sort_by_key(|s| s.shard);
        specs
    }

    /// `--expect-shards N`: every shard `0..N` present and complete, and no other.
    ///
    /// # Errors
    /// [`MergeError::MissingShards`] naming the missing and the incomplete ones.
    pub fn check_expected(&self, n: u32) -> Result<(), MergeError> {
        let mut found: BTreeMap<u32, (bool, String)> = BTreeMap::new();
        for s in &self.sublists {
            let name = s.reader.path().display().to_string();
            found.insert(s.reader.shard(), (s.finished, name));
        }
        for run in &self.runs {
            for s in &run.meta.shards {
                found.insert(s.shard, (s.complete(), run.name.clone()));
            }
        }
        let missing: Vec<u32> = (0..n).filter(|s| !found.contains_key(s)).collect();
        let incomplete: Vec<(u32, String)> = found
            .iter()
            .filter(|(s, (complete, _))| **s < n && !complete)
            .map(|(s, (_, name))| (*s, name.clone()))
            .collect();
        let extra: Vec<(u32, String)> = found
            .range(n..)
            .map(|(s, (_, name))| (*s, format!("{name}: beyond --expect-shards")))
            .collect();
        if missing.is_empty() && incomplete.is_empty() && extra.is_empty() {
            return Ok(());
        }
        Err(MergeError::MissingShards {
            expected: n,
            missing,
            incomplete: incomplete.into_iter().chain(extra).collect(),
        })
    }

    /// Records in all inputs (the progress bar's total).
    pub fn records(&self) -> u64 {
        let sublists: u64 = self.sublists.iter().map(|s| s.items).sum();
        sublists + self.runs.iter().map(|r| r.meta.records()).sum::<u64>()
    }

    /// The runs' metadata, for split points.
    pub fn metas(&self) -> Vec<&RunMeta> {
        self.runs.iter().map(|r| &r.meta).collect()
    }
}

/// The merge's inputs for the IDs of `part`: every run restricted to the part's range
/// (only its blocks are read), every sublist whole (`--part` refuses sublists).
fn merge_inputs_of(inputs: &Inputs, part: Part) -> Result<Vec<Input<'_>>, MergeError> {
    let mut out: Vec<Input<'_>> = Vec::new();
    for s in &inputs.sublists {
        if !part.is_whole() {
            return Err(MergeError::SplitNeedsRuns {
                path: s.reader.path().to_path_buf(),
            });
        }
        let name = s.reader.path().display().to_string();
        let records = s.reader.iter().map(|r| r.map_err(MergeError::from));
        let blocks = RecordBlocks::new(name.clone(), records);
        out.push(Input::new(name, vec![s.reader.shard()], Box::new(blocks)));
    }
    out.extend(run_inputs(&inputs.runs, part));
    Ok(out)
}

/// The merge's inputs of the runs alone, restricted to `part`'s range.
pub(crate) fn run_inputs(runs: &[RunInput], part: Part) -> Vec<Input<'_>> {
    runs.iter()
        .map(|run| {
            let shards = run.meta.shards.iter().map(|s| s.shard).collect();
            let blocks = run.blocks(part.first_id, part.last_id);
            Input::new(run.name.clone(), shards, Box::new(blocks))
        })
        .collect()
}

/// Merges the inputs' records of `part` into `writer` (a run or a Parquet list, which
/// the caller made for `part` and finishes). `progress(records, bytes)` is called every
/// [`PROGRESS_EVERY`] records or so and at the end.
///
/// # Errors
/// Every [`MergeError`] of the merge (duplicates, order, shards, reading) and of the
/// writer (a seq gap, a record outside the part, a write error).
pub fn merge_inputs(
    inputs: &Inputs,
    part: Part,
    writer: &mut dyn ListSink,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), MergeError> {
    write_merged(writer, merge_inputs_of(inputs, part)?, progress)?;
    progress(writer.records(), writer.bytes());
    Ok(())
}

/// The one merge loop: merges `inputs` into `writer` stretch by stretch, calling
/// `progress(records, bytes)` each time another [`PROGRESS_EVERY`] records are written.
pub(crate) fn write_merged(
    writer: &mut dyn ListSink,
    inputs: Vec<Input<'_>>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), MergeError> {
    let mut merger = Merger::new(inputs);
    let mut report_at = PROGRESS_EVERY;
    while let Some(stretch) = merger.next_stretch()? {
        writer.write_encoded(stretch.bytes)?;
        if writer.records() >= report_at {
            progress(writer.records(), writer.bytes());
            report_at = writer.records() + PROGRESS_EVERY;
        }
    }
    Ok(())
}

//! A merge's inputs, any mix of RocksDB sublists and runs: opening them, the checks that
//! span them (disjoint shards, `--expect-shards`), and the merge itself into a list
//! ([`ListSink`]: a run or Parquet).

use std::collections::BTreeMap;
use std::path::PathBuf;

use qformat::checkpoint::Checkpoint;
use qformat::names::{checkpoint_shard, has_run_suffix, CHECKPOINT_SUFFIX};
use qformat::run::{Part, RunMeta, ShardSpec};
use qstore::{Location, Store};

use crate::kway::{Input, Merger, RecordBlocks};
use crate::published::{read_checkpoint, CheckpointRead, SegmentBlocks, Segments};
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
    /// A shard's checkpoint (`shard-<n>.checkpoint`): its segments, chained, are the
    /// input (DESIGN.md, "The list while it grows").
    Checkpoint(Location),
}

impl MergeInput {
    /// A name ending in `.checkpoint` is a checkpoint; otherwise an `s3://` URL or a file
    /// is a run, a directory a sublist; a path that does not exist is a run if it ends in
    /// `.bin`, else a sublist (so the error says what is missing).
    ///
    /// # Errors
    /// A malformed `s3://` URL.
    pub fn classify(arg: &str) -> Result<MergeInput, MergeError> {
        let location = Location::parse(arg)?;
        if location.name().ends_with(CHECKPOINT_SUFFIX) {
            return Ok(MergeInput::Checkpoint(location));
        }
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
    /// Published shards: their checkpoints read (segments are opened as the merge reads them).
    pub published: Vec<Published>,
}

/// A shard published as it goes, as a merge input: its checkpoint, where its segments are.
pub struct Published {
    /// The checkpoint's location, as named to the user.
    pub name: String,
    /// What it says.
    pub checkpoint: Checkpoint,
    /// Where its segments are (the checkpoint's directory or prefix).
    pub src: Location,
    store: Store,
}

impl Published {
    /// The shard's records, its segments chained in seq order, as one input of the merge.
    fn input(&self, part: Part) -> Input<'static> {
        let chain = Segments::new(
            self.store.clone(),
            self.src.clone(),
            self.checkpoint.shard,
            &self.checkpoint.segments,
        );
        let blocks = SegmentBlocks::new(chain, part.first_id, part.last_id);
        Input::new(
            self.name.clone(),
            vec![self.checkpoint.shard],
            Box::new(blocks),
        )
    }
}

/// The directory or prefix a checkpoint (or any file) lies in.
fn parent_of(loc: &Location) -> Location {
    match loc {
        Location::Dir(p) => Location::Dir(
            p.parent()
                .filter(|d| !d.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("."), PathBuf::from),
        ),
        Location::S3 { bucket, prefix } => Location::S3 {
            bucket: bucket.clone(),
            prefix: prefix.rsplit_once('/').map_or("", |(p, _)| p).to_string(),
        },
    }
}

/// Reads the checkpoints `locs`, and keeps those no run supersedes: a run holding only
/// the same shard, complete, with as many items as the checkpoint, which is finished
/// (what compaction writes) is used instead; any other pair is an error naming both. A
/// checkpoint gone since it was listed is skipped when a run holds its shard (a
/// compaction finished meanwhile).
fn open_published(
    store: &Store,
    locs: &[Location],
    runs: &[RunInput],
) -> Result<Vec<Published>, MergeError> {
    let mut out = Vec::new();
    for loc in locs {
        let holder = |shard: u32| {
            runs.iter()
                .find(|r| r.meta.shards.iter().any(|s| s.shard == shard))
        };
        let checkpoint = match read_checkpoint(store, loc, None)? {
            CheckpointRead::Found(c, _) => c,
            CheckpointRead::Missing | CheckpointRead::Unchanged => {
                if checkpoint_shard(loc.name()).and_then(holder).is_some() {
                    continue;
                }
                return Err(MergeError::Store(qstore::StoreError::NotFound {
                    object: loc.to_string(),
                }));
            }
        };
        let shard = checkpoint.shard;
        if let Some(run) = holder(shard) {
            let whole = run.meta.shards.len() == 1 && run.meta.shards[0].complete();
            let why = if !whole {
                Some("the run does not hold that shard alone and complete".to_string())
            } else if !checkpoint.finished {
                Some("the checkpoint's shard is not finished".to_string())
            } else if run.meta.shards[0].total != checkpoint.count {
                Some(format!(
                    "the run holds {} items, the checkpoint {}",
                    run.meta.shards[0].total, checkpoint.count
                ))
            } else {
                None
            };
            match why {
                None => {
                    tracing::debug!(run = %run.name, checkpoint = %loc, "the run of a compacted shard supersedes its checkpoint");
                    continue;
                }
                Some(why) => {
                    return Err(MergeError::RunAndCheckpoint {
                        shard,
                        run: run.name.clone(),
                        checkpoint: loc.to_string(),
                        why,
                    })
                }
            }
        }
        out.push(Published {
            name: loc.to_string(),
            checkpoint,
            src: parent_of(loc),
            store: store.clone(),
        });
    }
    Ok(out)
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
    let mut checkpoints = Vec::new();
    for spec in specs {
        match spec {
            MergeInput::Sublist(p) => paths.push(p.clone()),
            MergeInput::Run(loc) => runs.push(open_run(store, loc)?),
            MergeInput::Checkpoint(loc) => checkpoints.push(loc.clone()),
        }
    }
    let sublists = if paths.is_empty() {
        Vec::new()
    } else {
        open_shards(&paths, allow_unfinished)?
    };
    let published = open_published(store, &checkpoints, &runs)?;
    let inputs = Inputs {
        sublists,
        runs,
        published,
    };
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
        for p in &self.published {
            if !p.checkpoint.finished && !allow_unfinished {
                return Err(MergeError::Unfinished {
                    path: PathBuf::from(&p.name),
                    written: p.checkpoint.count,
                });
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
        for p in &self.published {
            owners.push((p.checkpoint.shard, p.name.clone()));
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
        specs.extend(self.published.iter().map(|p| ShardSpec {
            shard: p.checkpoint.shard,
            finished: p.checkpoint.finished,
            total: p.checkpoint.count,
        }));
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
        for p in &self.published {
            let c = &p.checkpoint;
            found.insert(c.shard, (c.finished, p.name.clone()));
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
        let published: u64 = self.published.iter().map(|p| p.checkpoint.count).sum();
        sublists + published + self.runs.iter().map(|r| r.meta.records()).sum::<u64>()
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
    if let Some(p) = inputs.published.first().filter(|_| !part.is_whole()) {
        return Err(MergeError::SplitPublished {
            name: p.name.clone(),
        });
    }
    out.extend(inputs.published.iter().map(|p| p.input(part)));
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

//! `merger --out` as a library function over a plain config: the binary parses its flags
//! into a [`MergeConfig`], finds the inputs ([`crate::discover`]), checks the output, and
//! calls [`open_and_merge`], which opens and checks the inputs and merges them (the part
//! asked for, or the whole list with one thread or `--jobs`) into one atomic output.

use std::path::PathBuf;

use qformat::run::Part;
use qstore::{Location, Store, StoreOptions};

use crate::jobs::RangeFile;
use crate::output::{write_list, ListWritten, OutputFormat};
use crate::progress::{MergeProgress, Stall};
use crate::{MergeError, MergeInput};

/// What `merger --out` was asked to do.
#[derive(Debug, Clone)]
pub struct MergeConfig {
    /// Where the list goes.
    pub out: Location,
    /// What it is written as.
    pub format: OutputFormat,
    /// `--data-dir`: every `shard-<n>` sublist under it.
    pub data_dir: Option<PathBuf>,
    /// `--runs`: every run in these directories or under these prefixes.
    pub runs: Vec<Location>,
    /// Sublists, run files or objects named one by one.
    pub inputs: Vec<String>,
    /// `--expect-shards N`: every shard 0..N-1 present and complete, no other.
    pub expect_shards: Option<u32>,
    /// `--part I/K`.
    pub part: Option<(u32, u32)>,
    /// `--jobs J`: threads, each merging an ID range.
    pub jobs: u32,
    /// Merge sublists whose producer has not finished its input.
    pub allow_unfinished: bool,
    /// How the inputs and the output are read and written.
    pub store: StoreOptions,
    /// The crash tests' stall (feature `test-hooks`, [`crate::progress::Stall`]).
    pub stall: Stall,
}

/// Opens the inputs `specs` (found for `cfg`) from `store`, checks them, and merges them
/// (the part asked for, if any) into `cfg.out`, reporting to `progress`.
///
/// # Errors
/// Every error of opening, checking and merging the inputs, and of writing the output;
/// nothing is then left under `cfg.out`.
pub fn open_and_merge(
    cfg: &MergeConfig,
    store: &Store,
    specs: &[MergeInput],
    progress: &mut MergeProgress,
) -> Result<ListWritten, MergeError> {
    let inputs = crate::open_inputs(store, specs, cfg.allow_unfinished)?;
    if let Some(n) = cfg.expect_shards {
        inputs.check_expected(n)?;
    }
    let part = match cfg.part {
        Some((i, k)) => crate::split::split(&inputs.metas(), k)[i as usize],
        None => Part::WHOLE,
    };
    let total = if part.is_whole() { inputs.records() } else { 0 };
    tracing::info!(inputs = specs.len(), items = total, out = %cfg.out, %part, jobs = cfg.jobs, "merging");
    progress.set_total(total);
    let mut report = |records, bytes| progress.update(records, bytes);
    write_list(
        store,
        &cfg.out,
        cfg.format,
        inputs.shard_specs(),
        part,
        &mut |writer, own_file| {
            if cfg.jobs > 1 {
                let files = match (own_file, &cfg.out) {
                    (Some(file), _) => RangeFile::InPlace(file),
                    (None, Location::Dir(p)) => RangeFile::Apart(
                        p.parent()
                            .filter(|d| !d.as_os_str().is_empty())
                            .map_or_else(|| PathBuf::from("."), PathBuf::from),
                    ),
                    (None, Location::S3 { .. }) => RangeFile::Apart(std::env::temp_dir()),
                };
                let out = cfg.out.to_string();
                crate::merge_jobs(&inputs, cfg.jobs, files, writer, &out, &mut report)
            } else {
                crate::merge_inputs(&inputs, part, writer, &mut report)
            }
        },
    )
}

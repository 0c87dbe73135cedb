//! What a merge's command line names, found and checked: the inputs (a data dir's
//! sublists, every run under a `--runs` source, the inputs named one by one) and an
//! output that must not destroy or shadow any of them.

use std::path::{Path, PathBuf};

use qformat::names::{
    checkpoint_shard, has_run_suffix, is_run_name, CHECKPOINT_SUFFIX, SEGMENT_SUFFIX,
};
use qstore::{Location, Store};

use crate::{check_out_path, find_shards_to_merge, MergeError, MergeInput};

/// Every input the command line names: the data dir's sublists, the runs under each
/// `--runs`, and the positional inputs.
///
/// # Errors
/// Every error of [`find_shards_to_merge`] and of listing a `--runs` source,
/// [`MergeError::NoRuns`] for a source with no run, a malformed `s3://` input.
pub fn find_inputs(
    store: &Store,
    data_dir: Option<&Path>,
    runs: &[Location],
    inputs: &[String],
    allow_unfinished: bool,
) -> Result<Vec<MergeInput>, MergeError> {
    let mut specs = Vec::new();
    if let Some(dir) = data_dir {
        let shards = find_shards_to_merge(dir, allow_unfinished)?;
        specs.extend(shards.into_iter().map(MergeInput::Sublist));
    }
    for src in runs {
        // Runs, and the checkpoints of shards published as they go (DESIGN.md, "The list
        // while it grows"); a shard with both is sorted out when they are opened.
        let found = store
            .list_named(src, |n| is_run_name(n) || checkpoint_shard(n).is_some())
            .map_err(MergeError::Store)?;
        if found.is_empty() {
            return Err(MergeError::NoRuns {
                src: src.to_string(),
            });
        }
        specs.extend(found.into_iter().map(|loc| {
            if checkpoint_shard(loc.name()).is_some() {
                MergeInput::Checkpoint(loc)
            } else {
                MergeInput::Run(loc)
            }
        }));
    }
    for arg in inputs {
        specs.push(MergeInput::classify(arg)?);
    }
    Ok(specs)
}

/// Refuses an output that would destroy or shadow an input: a local output is checked
/// by [`check_out_path`] (sublists, run files, the data dir); any output that lands among
/// the runs of a `--runs` source would be read as an input by the next merge of that
/// source. (That a local output's directory exists is the caller's flag check.)
///
/// # Errors
/// [`MergeError::BadOut`] naming the input it would hit.
pub fn check_out(
    out: &Location,
    data_dir: Option<&Path>,
    runs: &[Location],
    specs: &[MergeInput],
) -> Result<(), MergeError> {
    let bad = |reason: String| MergeError::BadOut {
        out: PathBuf::from(out.to_string()),
        reason,
    };
    let name = out.name();
    if name.ends_with(CHECKPOINT_SUFFIX) || name.ends_with(SEGMENT_SUFFIX) {
        return Err(bad(
            "a checkpoint's or a segment's name: a producer publishes those, a merge writes runs"
                .into(),
        ));
    }
    for src in runs {
        if has_run_suffix(&out.to_string()) && same_place(out, src) {
            return Err(bad(format!("it lands among the runs of --runs {src}: the next merge of {src} would read it as an input (write it elsewhere)")));
        }
    }
    if let Some(run) = specs
        .iter()
        .find(|s| matches!(s, MergeInput::Run(l) if l.is_s3() && l == out))
    {
        return Err(bad(format!("it is the input {run:?}")));
    }
    let Location::Dir(out) = out else {
        return Ok(());
    };
    let paths: Vec<PathBuf> = specs
        .iter()
        .filter_map(|s| match s {
            MergeInput::Sublist(p) | MergeInput::Run(Location::Dir(p)) => Some(p.clone()),
            // A checkpoint's directory is its shard's publication place, where compaction
            // writes the shard's run (`shard-<n>.bin`): not guarded like a data dir.
            MergeInput::Run(_) | MergeInput::Checkpoint(_) => None,
        })
        .collect();
    check_out_path(out, data_dir, &paths)
}

/// Whether `out` is an object directly inside `src` (the same directory or prefix).
fn same_place(out: &Location, src: &Location) -> bool {
    match (out, src) {
        (Location::Dir(o), Location::Dir(s)) => {
            let parent = match o.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            match (std::fs::canonicalize(parent), std::fs::canonicalize(s)) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            }
        }
        (Location::S3 { .. }, Location::S3 { .. }) => {
            let o = out.to_string();
            let parent = o.rsplit_once('/').map_or("", |(p, _)| p);
            parent == src.to_string().trim_end_matches('/')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_place_is_directly_inside_the_source() {
        let loc = |s: &str| Location::parse(s).expect("location");
        assert!(same_place(&loc("s3://b/runs/x.bin"), &loc("s3://b/runs")));
        assert!(same_place(&loc("s3://b/runs/x.bin"), &loc("s3://b/runs/")));
        assert!(!same_place(
            &loc("s3://b/runs/sub/x.bin"),
            &loc("s3://b/runs")
        ));
        assert!(!same_place(&loc("s3://b/other/x.bin"), &loc("s3://b/runs")));
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = Location::Dir(tmp.path().to_path_buf());
        let inside = Location::Dir(tmp.path().join("x.bin"));
        assert!(same_place(&inside, &dir));
        assert!(!same_place(
            &Location::Dir(tmp.path().join("d/x.bin")),
            &dir
        ));
        assert!(!same_place(&inside, &loc("s3://b/runs")));
    }
}

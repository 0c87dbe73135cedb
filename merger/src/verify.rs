//! `merger verify` for runs: one list, or the parts of a split merge given in order,
//! checked as one list: every block's checksum, strict ID order within and across files,
//! the parts numbered 0..K with ranges that tile the ID space, and every shard's seqs
//! consecutive from 0 to its total.

use std::collections::BTreeMap;

use qformat::run::{holds_all, SeqCheck, ShardSpec};
use qstore::{Location, Store};

use crate::runs::{open_run, RunInput};
use crate::MergeError;

/// What a valid list (or set of parts) holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListSummary {
    /// Records in all files.
    pub records: u64,
    /// Bytes of all files.
    pub bytes: u64,
    /// Smallest and largest ID, if any record.
    pub ids: Option<(u64, u64)>,
    /// Shards listed.
    pub shards: usize,
    /// Files (parts) read.
    pub files: usize,
}

fn bad(run: &RunInput, what: String) -> MergeError {
    MergeError::ListCheck {
        name: run.name.clone(),
        what,
    }
}

/// Checks one list or the parts of one, in order.
///
/// # Errors
/// The first problem, naming the file (and the byte offset, for a format error).
pub fn verify_lists(store: &Store, files: &[Location]) -> Result<ListSummary, MergeError> {
    let runs = files
        .iter()
        .map(|f| open_run(store, f))
        .collect::<Result<Vec<_>, _>>()?;
    check_parts(&runs)?;
    let mut sum = ListSummary {
        files: runs.len(),
        shards: runs.first().map_or(0, |r| r.meta.shards.len()),
        ..ListSummary::default()
    };
    let mut next_seq: BTreeMap<u32, u64> = BTreeMap::new();
    for run in &runs {
        read_run(run, &mut sum)?;
        for s in &run.meta.shards {
            let next = next_seq.entry(s.shard).or_insert(0);
            if s.count > 0 && s.first_seq != *next {
                return Err(bad(run, format!("shard {}: its items here start at seq {}, but the files before end at seq {} (a part is missing or out of order)", s.shard, s.first_seq, *next)));
            }
            *next += s.count;
        }
    }
    if let Some(last) = runs.last() {
        for s in &last.meta.shards {
            let held = next_seq.get(&s.shard).copied().unwrap_or(0);
            let whole = qformat::run::ShardEntry {
                first_seq: 0,
                count: held,
                ..*s
            };
            if !holds_all(&whole) {
                return Err(bad(
                    last,
                    format!(
                        "shard {}: {held} of its {} items are in the list (a part is missing)",
                        s.shard, s.total
                    ),
                ));
            }
        }
    }
    Ok(sum)
}

/// The parts are 0..K of one split, in order, with ranges that tile the ID space and
/// the same shard table (shards, totals).
pub(crate) fn check_parts(runs: &[RunInput]) -> Result<(), MergeError> {
    let Some(first) = runs.first() else {
        return Ok(());
    };
    let count = first.meta.part().count;
    for (i, run) in runs.iter().enumerate() {
        let part = run.meta.part();
        if part.count != count || part.index as usize != i {
            return Err(bad(run, format!("is {part}, but it was given as file {} of {} (give the parts of one split, in order)", i + 1, runs.len())));
        }
        if i > 0 {
            let prev = runs[i - 1].meta.part();
            if prev.last_id.wrapping_add(1) != part.first_id {
                return Err(bad(run, format!("starts at id {}, but the part before ends at {}: not parts of the same split", part.first_id, prev.last_id)));
            }
            let same = |a: &qformat::run::ShardEntry, b: &qformat::run::ShardEntry| {
                (a.shard, a.finished, a.total) == (b.shard, b.finished, b.total)
            };
            let tables_match = run.meta.shards.len() == first.meta.shards.len()
                && run
                    .meta
                    .shards
                    .iter()
                    .zip(&first.meta.shards)
                    .all(|(a, b)| same(a, b));
            if !tables_match {
                return Err(bad(
                    run,
                    "lists other shards or totals than part 0: not parts of the same split".into(),
                ));
            }
        }
    }
    if runs.len() != count as usize {
        let last = &runs[runs.len() - 1];
        return Err(bad(
            last,
            format!(
                "is the last file given, but the split has {count} parts: part {} is missing",
                runs.len()
            ),
        ));
    }
    Ok(())
}

/// Reads every block of one run, checking order across files and each shard's seqs
/// against the run's own table.
fn read_run(run: &RunInput, sum: &mut ListSummary) -> Result<(), MergeError> {
    let specs = run
        .meta
        .shards
        .iter()
        .map(|s| ShardSpec {
            shard: s.shard,
            finished: s.finished,
            total: s.total,
        })
        .collect();
    let mut seqs = SeqCheck::new(specs);
    for record in run.records(0, u64::MAX) {
        let r = record?;
        if let Some((_, last)) = sum.ids.filter(|&(_, last)| r.id <= last) {
            return Err(bad(
                run,
                format!(
                    "record id {} is not above the previous file's last id {last}",
                    r.id
                ),
            ));
        }
        seqs.see(r.shard, r.seq)
            .map_err(|what| bad(run, format!("record id {}: {what}", r.id)))?;
        sum.ids = Some((sum.ids.map_or(r.id, |(f, _)| f), r.id));
        sum.records += 1;
    }
    for (seen, stored) in seqs.table().iter().zip(&run.meta.shards) {
        if seen.count != stored.count || (seen.count > 0 && seen.first_seq != stored.first_seq) {
            return Err(bad(run, format!("shard {}: the records hold {} items from seq {}, the shard table says {} from seq {}", stored.shard, seen.count, seen.first_seq, stored.count, stored.first_seq)));
        }
    }
    sum.bytes += run.meta.file_len;
    Ok(())
}

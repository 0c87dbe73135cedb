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
    /// The parts of a follow that has not finished: a prefix of the list, which grows.
    pub growing: bool,
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
    let Some(last) = runs.last() else {
        return Ok(sum);
    };
    if last.meta.part().is_follow() {
        if last.meta.part().last_id != u64::MAX {
            sum.growing = true;
            return Ok(sum);
        }
        if let Some(s) = last.meta.shards.iter().find(|s| !s.finished) {
            return Err(bad(last, format!("the follow's last part ends at the last id, but shard {} is not finished there", s.shard)));
        }
    }
    {
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
    if first.meta.part().is_follow() {
        return check_follow_parts(runs);
    }
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

/// The parts of a follow (docs/list-format.md, "Parts of a follow"): parts 0..n in order,
/// ranges that meet from id 0, the same shards in every table, totals that add each
/// part's items to the ones before, and a finished shard staying finished with no more.
fn check_follow_parts(runs: &[RunInput]) -> Result<(), MergeError> {
    for (i, run) in runs.iter().enumerate() {
        let part = run.meta.part();
        if !part.is_follow() || part.index as usize != i {
            return Err(bad(run, format!("is {part}, but it was given as file {} of {}: give the parts of one follow in order, from part 0 (a part is missing or misplaced)", i + 1, runs.len())));
        }
        let prev = i.checked_sub(1).map(|p| &runs[p].meta);
        let starts = prev.map_or(Some(0), |p| p.part().last_id.checked_add(1));
        if starts != Some(part.first_id) {
            return Err(bad(run, format!("starts at id {}, but {}: the parts of a follow tile the ids from 0 (a part is missing or misplaced)", part.first_id, prev.map_or("the first part starts at 0".to_string(), |p| format!("the part before ends at {}", p.part().last_id)))));
        }
        let shards: Vec<u32> = run.meta.shards.iter().map(|s| s.shard).collect();
        let first: Vec<u32> = runs[0].meta.shards.iter().map(|s| s.shard).collect();
        if shards != first {
            return Err(bad(
                run,
                format!("lists shards {shards:?}, part 0 {first:?}: not parts of the same follow"),
            ));
        }
        for (j, s) in run.meta.shards.iter().enumerate() {
            let before = prev.map(|p| p.shards[j]);
            let held = before.map_or(0, |b| b.total);
            if s.total != held + s.count
                || before.is_some_and(|b| b.finished && (!s.finished || s.count > 0))
            {
                return Err(bad(
                    run,
                    format!(
                        "shard {}: total {} with {} items here, but the parts before hold {held}{}",
                        s.shard,
                        s.total,
                        s.count,
                        if before.is_some_and(|b| b.finished) {
                            " and it had finished"
                        } else {
                            ""
                        }
                    ),
                ));
            }
        }
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

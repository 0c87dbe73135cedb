//! The record rules every run keeps, checked as records arrive: consecutive seqs per
//! shard ([`SeqCheck`]), and what a writer is told and checks ([`ShardSpec`],
//! [`WriteCheck`]).

use super::*;

/// Whether a shard entry holds every item its producer wrote (finished or not): what a
/// whole list must hold of each of its shards.
pub fn holds_all(s: &ShardEntry) -> bool {
    s.count == s.total && (s.count == 0 || s.first_seq == 0)
}

/// What a [`RunWriter`] is told about a shard before its records arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSpec {
    /// The shard number.
    pub shard: u32,
    /// Its producer finished its input.
    pub finished: bool,
    /// The shard's items in all (finished), or written so far (unfinished).
    pub total: u64,
}

/// Checks, shard by shard, that records come with consecutive seqs: the rule every run
/// keeps (a producer stores seqs 0, 1, 2, ... in ID order), so a gap or a repeat is an
/// item lost or stored twice. Used by the writer and by readers of several runs.
#[derive(Debug, Clone, Default)]
pub struct SeqCheck {
    /// By shard number: the spec and what was seen (first seq, count).
    shards: Vec<(ShardSpec, Option<u64>, u64)>,
    last: usize,
}

impl SeqCheck {
    /// Expects records of exactly these shards (any order; duplicates are the caller's
    /// to refuse).
    pub fn new(mut specs: Vec<ShardSpec>) -> SeqCheck {
        specs.sort_by_key(|s| s.shard);
        SeqCheck {
            shards: specs.into_iter().map(|s| (s, None, 0)).collect(),
            last: 0,
        }
    }

    /// Records `r`; errors if its shard is not expected or its seq does not follow.
    ///
    /// # Errors
    /// A message saying what is wrong (the caller adds where).
    pub fn see(&mut self, shard: u32, seq: u64) -> Result<(), String> {
        let i = if self
            .shards
            .get(self.last)
            .is_some_and(|s| s.0.shard == shard)
        {
            self.last
        } else {
            self.shards
                .binary_search_by_key(&shard, |s| s.0.shard)
                .map_err(|_| format!("shard {shard} is not among this list's shards"))?
        };
        self.last = i;
        let (spec, first, count) = &mut self.shards[i];
        if seq >= spec.total {
            return Err(format!(
                "shard {shard}: seq {seq} is beyond its {} items",
                spec.total
            ));
        }
        match first {
            None => *first = Some(seq),
            Some(f) if *f + *count == seq => {}
            Some(f) => {
                return Err(format!(
                    "shard {shard}: seq {seq} follows seq {} (an item is missing or repeated)",
                    *f + *count - 1
                ))
            }
        }
        *count += 1;
        Ok(())
    }

    /// Records `count` items of `shard` with seqs `first_seq..`, as [`SeqCheck::see`]
    /// would one by one (appending a run whose records were checked when it was written).
    ///
    /// # Errors
    /// As [`SeqCheck::see`].
    pub fn see_span(&mut self, shard: u32, first_seq: u64, count: u64) -> Result<(), String> {
        if count == 0 {
            return Ok(());
        }
        self.see(shard, first_seq)?;
        let i = self.last;
        let last = first_seq.saturating_add(count - 1);
        if last >= self.shards[i].0.total {
            return Err(format!(
                "shard {shard}: seq {last} is beyond its {} items",
                self.shards[i].0.total
            ));
        }
        self.shards[i].2 += count - 1;
        Ok(())
    }

    /// Replaces the specs (the same shards, in any order) by `specs`, whose totals must
    /// still hold every seq seen.
    ///
    /// # Errors
    /// A message saying which shard does not fit.
    pub fn restate(&mut self, mut specs: Vec<ShardSpec>) -> Result<(), String> {
        specs.sort_by_key(|s| s.shard);
        let same = specs.len() == self.shards.len()
            && specs
                .iter()
                .zip(&self.shards)
                .all(|(a, b)| a.shard == b.0.shard);
        if !same {
            return Err("the shards must stay the same".into());
        }
        for (spec, (old, first, count)) in specs.into_iter().zip(&mut self.shards) {
            let end = first.map_or(0, |f| f + *count);
            if end > spec.total {
                return Err(format!(
                    "shard {}: seqs up to {end} are written, above a total of {}",
                    spec.shard, spec.total
                ));
            }
            *old = spec;
        }
        Ok(())
    }

    /// The shard table of what was seen: every expected shard, in shard order.
    pub fn table(&self) -> Vec<ShardEntry> {
        self.shards
            .iter()
            .map(|(spec, first, count)| ShardEntry {
                shard: spec.shard,
                finished: spec.finished,
                first_seq: first.unwrap_or(0),
                count: *count,
                total: spec.total,
            })
            .collect()
    }
}

/// The rules every writer of a list keeps, record by record, whatever the format (a run
/// here, Parquet in the merger): IDs strictly increase and lie in the part's range, a
/// payload is at most [`MAX_PAYLOAD`], each shard is one of the expected ones
/// and its seqs follow on ([`SeqCheck`]); and, at the end, a whole list holds every item
/// of each of its shards.
#[derive(Debug, Clone)]
pub struct WriteCheck {
    part: Part,
    seqs: SeqCheck,
    first_id: Option<u64>,
    last_id: Option<u64>,
    records: u64,
    /// Where a whole list's shards start: 0, or a segment's first seq
    /// ([`WriteCheck::segment`]).
    from_seq: u64,
}

impl WriteCheck {
    /// Expects records of the shards in `specs` with IDs in `part`'s range.
    pub fn new(specs: Vec<ShardSpec>, part: Part) -> WriteCheck {
        WriteCheck {
            part,
            seqs: SeqCheck::new(specs),
            first_id: None,
            last_id: None,
            records: 0,
            from_seq: 0,
        }
    }

    /// Expects a *segment* (DESIGN.md, "The list while it grows"): a whole list holding
    /// exactly the seqs `first_seq..end_seq` of `shard` (its shard entry: not finished,
    /// total `end_seq`).
    pub fn segment(shard: u32, first_seq: u64, end_seq: u64) -> WriteCheck {
        let spec = ShardSpec {
            shard,
            finished: false,
            total: end_seq,
        };
        WriteCheck {
            from_seq: first_seq,
            ..WriteCheck::new(vec![spec], Part::WHOLE)
        }
    }

    /// Replaces the part and the shards' specs, for a list whose range and totals are
    /// learned while it is written (a follower's part grows as its producers publish):
    /// the records accepted so far must lie in the new part, the shards stay the same and
    /// their totals hold every seq accepted.
    ///
    /// # Errors
    /// [`RunError::Restate`] saying what no longer fits.
    pub fn restate(&mut self, part: Part, specs: Vec<ShardSpec>) -> Result<(), RunError> {
        let ids = self.first_id.zip(self.last_id);
        if let Some((first, last)) = ids.filter(|&(f, l)| !part.contains(f) || !part.contains(l)) {
            return Err(RunError::Restate {
                what: format!(
                    "ids {first}..={last} are written, outside {part}'s range {}..={}",
                    part.first_id, part.last_id
                ),
            });
        }
        self.seqs
            .restate(specs)
            .map_err(|what| RunError::Restate { what })?;
        self.part = part;
        Ok(())
    }

    /// The part this list holds.
    pub fn part(&self) -> Part {
        self.part
    }

    /// The last ID accepted, if any.
    pub fn last_id(&self) -> Option<u64> {
        self.last_id
    }

    /// Records accepted so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Accepts `r` if it keeps the rules.
    ///
    /// # Errors
    /// [`RunError::Write`] saying which rule it breaks.
    pub fn record(&mut self, r: &Record) -> Result<(), RunError> {
        self.record_fields(r.id, r.shard, r.seq, r.payload.len())
    }

    /// [`WriteCheck::record`] of a record's fields (its payload's length only).
    ///
    /// # Errors
    /// As [`WriteCheck::record`].
    pub fn record_fields(
        &mut self,
        id: u64,
        shard: u32,
        seq: u64,
        payload_len: usize,
    ) -> Result<(), RunError> {
        let refuse = |what: String| RunError::Write {
            id,
            shard,
            seq,
            what,
        };
        if let Some(prev) = self.last_id.filter(|&p| id <= p) {
            return Err(refuse(format!(
                "ids must strictly increase; the previous was {prev}"
            )));
        }
        if !self.part.contains(id) {
            return Err(refuse(format!(
                "outside {}'s range {}..={}",
                self.part, self.part.first_id, self.part.last_id
            )));
        }
        if payload_len > MAX_PAYLOAD {
            return Err(refuse(format!(
                "a {payload_len}-byte payload is above the limit"
            )));
        }
        self.seqs.see(shard, seq).map_err(refuse)?;
        self.first_id = self.first_id.or(Some(id));
        self.last_id = Some(id);
        self.records += 1;
        Ok(())
    }

    /// Accepts a whole run at once (its records were checked when it was written): its
    /// IDs must lie above the last accepted and in the part's range, its shards among the
    /// expected and its seqs follow on. An empty run is accepted as it is.
    ///
    /// # Errors
    /// [`RunError::Write`] saying which rule it breaks.
    pub fn run(&mut self, meta: &RunMeta) -> Result<(), RunError> {
        let (Some(first), Some(last)) = (meta.blocks.first(), meta.blocks.last()) else {
            return Ok(());
        };
        self.span(first.first_id, last.last_id, &meta.shards, meta.records())
    }

    /// Accepts `records` records with IDs `first_id..=last_id` checked elsewhere (a run,
    /// or a range of this list written apart) holding `shards`: as [`WriteCheck::run`].
    ///
    /// # Errors
    /// [`RunError::Write`] saying which rule it breaks.
    pub fn span(
        &mut self,
        first_id: u64,
        last_id: u64,
        shards: &[ShardEntry],
        records: u64,
    ) -> Result<(), RunError> {
        let refuse = |what: String| RunError::Write {
            id: first_id,
            shard: 0,
            seq: 0,
            what,
        };
        if self.last_id.is_some_and(|p| first_id <= p)
            || !self.part.contains(first_id)
            || !self.part.contains(last_id)
        {
            return Err(refuse(format!(
                "an appended run's ids {first_id}..={last_id} must lie above {:?} and in {}",
                self.last_id, self.part
            )));
        }
        for s in shards {
            self.seqs
                .see_span(s.shard, s.first_seq, s.count)
                .map_err(refuse)?;
        }
        self.first_id = self.first_id.or(Some(first_id));
        self.last_id = Some(last_id);
        self.records += records;
        Ok(())
    }

    /// What was accepted of each expected shard, in shard order (no completeness check:
    /// [`WriteCheck::finish`] makes that).
    pub fn table(&self) -> Vec<ShardEntry> {
        self.seqs.table()
    }

    /// The shard table of what was accepted, every expected shard in shard order.
    ///
    /// # Errors
    /// [`RunError::Incomplete`] when a whole list (not a part) lacks items of a shard.
    pub fn finish(&self) -> Result<Vec<ShardEntry>, RunError> {
        let shards = self.seqs.table();
        if self.part.is_whole() {
            // A segment holds its shard from its first seq on: no gap up to its total.
            let from = self.from_seq;
            let holds = |s: &ShardEntry| {
                s.count == s.total.saturating_sub(from) && (s.count == 0 || s.first_seq == from)
            };
            if let Some(s) = shards.iter().find(|s| !holds(s)) {
                return Err(RunError::Incomplete {
                    shard: s.shard,
                    first_seq: s.first_seq,
                    count: s.count,
                    total: s.total,
                });
            }
        }
        Ok(shards)
    }
}

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
    last_id: Option<u64>,
    records: u64,
    /// Shards whose items here start at a seq above 0 (a segment): (shard, first seq).
    starts: Vec<(u32, u64)>,
}

impl WriteCheck {
    /// Expects records of the shards in `specs` with IDs in `part`'s range.
    pub fn new(specs: Vec<ShardSpec>, part: Part) -> WriteCheck {
        WriteCheck {
            part,
            seqs: SeqCheck::new(specs),
            last_id: None,
            records: 0,
            starts: Vec::new(),
        }
    }

    /// The same check, expecting shard `shard`'s records to start at seq `first_seq`: a
    /// *segment* of it (DESIGN.md, "The list while it grows"), which holds exactly seqs
    /// `first_seq..total` of the shard. A whole list then holds every item from
    /// `first_seq` on, none before it.
    pub fn starting_at(mut self, shard: u32, first_seq: u64) -> WriteCheck {
        self.starts.retain(|s| s.0 != shard);
        self.starts.push((shard, first_seq));
        self
    }

    /// The seq this list's items of `shard` start at (0 but for a segment).
    fn start_of(&self, shard: u32) -> u64 {
        self.starts.iter().find(|s| s.0 == shard).map_or(0, |s| s.1)
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
            let holds_its_seqs = |s: &ShardEntry| match self.start_of(s.shard) {
                0 => holds_all(s),
                from => s.first_seq == from && s.count == s.total.saturating_sub(from),
            };
            if let Some(s) = shards.iter().find(|s| !holds_its_seqs(s)) {
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

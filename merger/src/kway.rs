//! The k-way merge: sorted inputs of encoded records (checked blocks, borrowed, never
//! copied record by record) into one stream of *stretches*, each a run of consecutive
//! records of one input that all lie below every other input's head.
//!
//! Producers stamp in batches, so the runs of a real merge interleave in chunks of about
//! a batch of consecutive IDs: a stretch is then hundreds of records that the writer
//! copies in one piece, and the tournament is replayed once per stretch, not once per
//! record. The inputs are a loser tree of their heads; the smallest head wins,
//! and the smallest of the losers on its path is the bound its stretch stays below.
//!
//! Every record is still checked: its shard is one of its input's, its ID above the one
//! before it in the input (so, within a stretch, above every ID before it in the merged
//! stream too), and not equal to another input's head (a duplicate is never yielded, even
//! once). [`merge`] is the same merge over iterators of owned [`Record`]s (sublists, tests).

use bytes::Bytes;
use qformat::run::record_at;
use qformat::{Record, RecordRef};

use crate::MergeError;

/// Records encoded into one block by [`merge`]'s adapter (a record iterator's
/// read-ahead): reading a run of records from one input at a time keeps that input's
/// iterator (for RocksDB: block, index, file state) warm in the CPU caches.
pub const READ_AHEAD_RECORDS: usize = 128;
/// Stop reading ahead once this many bytes are buffered for one input, so memory stays
/// bounded by inputs x this even with big payloads.
pub const READ_AHEAD_BYTES: usize = 64 << 10;

/// What the merge reads an input as: blocks of whole encoded records (list.bin's record
/// encoding, one after another), each checked ([`qformat::run::check_block`]) and
/// ascending by ID within itself, in the input's order. An empty block is skipped.
pub trait Blocks {
    /// The next block, `Ok(None)` at the end.
    ///
    /// # Errors
    /// Whatever reading the input met, naming where.
    fn next_block(&mut self) -> Result<Option<Bytes>, MergeError>;
}

/// One input of the merge: a name for error messages (the run's or sublist's path), the
/// shard numbers its records may carry, and its blocks.
pub struct Input<'a> {
    /// Names the input in errors.
    pub name: String,
    /// The shard numbers a record of this input may carry, ascending.
    pub shards: Vec<u32>,
    /// Its records.
    pub blocks: Box<dyn Blocks + 'a>,
}

impl<'a> Input<'a> {
    /// An input holding records of `shards` (any order).
    pub fn new(
        name: impl Into<String>,
        mut shards: Vec<u32>,
        blocks: Box<dyn Blocks + 'a>,
    ) -> Input<'a> {
        shards.sort_unstable();
        Input {
            name: name.into(),
            shards,
            blocks,
        }
    }
}

/// A run of consecutive records of one input, all below every other input's head:
/// `bytes` holds `records` whole encoded records.
pub struct Stretch<'m> {
    /// The records' bytes, as encoded in the input.
    pub bytes: &'m [u8],
    /// How many records.
    pub records: u64,
    /// The input they come from.
    pub input: usize,
}

impl<'m> Stretch<'m> {
    /// The stretch's records, borrowed.
    pub fn iter(&self) -> impl Iterator<Item = RecordRef<'m>> {
        qformat::run::BlockRecords::new(self.bytes)
    }
}

/// One input's place in the merge: its current block and the record at the head.
struct Cursor<'a> {
    input: Input<'a>,
    block: Bytes,
    /// Where the head record starts in `block` (== `block.len()`: a new block is needed).
    pos: usize,
    /// The head's ID (valid while `!done`).
    id: u64,
    last_id: Option<u64>,
    done: bool,
    /// A stretch was taken: the head at `pos` is not read yet.
    stale: bool,
}

impl Cursor<'_> {
    /// Makes the record at `pos` the head (loading blocks as needed) and checks it
    /// against the input's promises; `done` at the end.
    fn settle(&mut self) -> Result<(), MergeError> {
        while self.pos >= self.block.len() {
            match self.input.blocks.next_block()? {
                Some(b) => {
                    self.block = b;
                    self.pos = 0;
                }
                None => {
                    self.done = true;
                    self.stale = false;
                    self.block = Bytes::new();
                    self.pos = 0;
                    return Ok(());
                }
            }
        }
        let (r, _) = self.record_here()?;
        self.check(&r)?;
        self.id = r.id;
        self.stale = false;
        Ok(())
    }

    fn record_here(&self) -> Result<(RecordRef<'_>, usize), MergeError> {
        self.record_in(&self.block, self.pos)
    }

    /// The record at `pos` of `block` (one of this input's), or an error naming the input.
    fn record_in<'b>(
        &self,
        block: &'b [u8],
        pos: usize,
    ) -> Result<(RecordRef<'b>, usize), MergeError> {
        record_at(block, pos).map_err(|what| MergeError::Read {
            input: self.input.name.clone(),
            error: what.into(),
        })
    }

    /// The checks every record gets: its shard is the input's, its ID above the last.
    fn check(&self, r: &RecordRef<'_>) -> Result<(), MergeError> {
        let listed = match self.input.shards.as_slice() {
            [one] => *one == r.shard,
            many => many.binary_search(&r.shard).is_ok(),
        };
        if !listed {
            return Err(MergeError::WrongShard {
                input: self.input.name.clone(),
                expected: self.input.shards.clone(),
                found: r.shard,
                id: r.id,
            });
        }
        if let Some(prev) = self.last_id.filter(|&p| r.id <= p) {
            return Err(MergeError::OutOfOrder {
                input: self.input.name.clone(),
                prev,
                id: r.id,
            });
        }
        Ok(())
    }

    /// The records from the head on that lie below `bound` (all, for `None`), within the
    /// current block: `(start, end, count)` of `block`. The head moves past them, and is
    /// read by the next [`Cursor::settle`] (which loads the next block if needed).
    fn take_below(&mut self, bound: Option<u64>) -> Result<(usize, usize, u64), MergeError> {
        let start = self.pos;
        let mut pos = self.pos;
        let mut count = 0u64;
        let block = self.block.clone();
        while pos < block.len() {
            let (r, end) = self.record_in(&block, pos)?;
            if bound.is_some_and(|b| r.id >= b) {
                break;
            }
            if pos != start {
                self.check(&r)?;
            }
            self.last_id = Some(r.id);
            count += 1;
            pos = end;
        }
        self.pos = pos;
        self.stale = true;
        Ok((start, pos, count))
    }
}

/// A loser tree over the inputs' heads: `losers[0]` is the winner (the smallest head),
/// `losers[p]` for `p` in `1..n` the loser of the match at internal node `p`; leaves are
/// `n + i` for input `i`, padded with inputs that are always done.
struct Tree {
    n: usize,
    losers: Vec<usize>,
    /// The key of each leaf: `(id << 32) | input`, `u128::MAX` once done (padding too),
    /// so ties between equal IDs break by input number and every key is distinct.
    keys: Vec<u128>,
}

impl Tree {
    fn new(inputs: usize) -> Tree {
        let n = inputs.max(1).next_power_of_two();
        Tree {
            n,
            losers: vec![0; n],
            keys: vec![u128::MAX; n],
        }
    }

    fn key_of(c: &Cursor<'_>, i: usize) -> u128 {
        if c.done {
            u128::MAX
        } else {
            (u128::from(c.id) << 32) | i as u128
        }
    }

    fn build(&mut self) {
        let n = self.n;
        let mut winners = vec![0usize; 2 * n];
        for (i, w) in winners[n..].iter_mut().enumerate() {
            *w = i;
        }
        for p in (1..n).rev() {
            let (a, b) = (winners[2 * p], winners[2 * p + 1]);
            let (w, l) = if self.keys[a] <= self.keys[b] {
                (a, b)
            } else {
                (b, a)
            };
            winners[p] = w;
            self.losers[p] = l;
        }
        self.losers[0] = if n == 1 { 0 } else { winners[1] };
    }

    /// Input `i`'s key changed (it was the winner): replays its path to the root.
    fn replay(&mut self, i: usize, key: u128) {
        self.keys[i] = key;
        let mut w = i;
        let mut p = (self.n + i) / 2;
        while p >= 1 {
            if self.keys[self.losers[p]] < self.keys[w] {
                std::mem::swap(&mut self.losers[p], &mut w);
            }
            p /= 2;
        }
        self.losers[0] = w;
    }

    fn winner(&self) -> usize {
        self.losers[0]
    }

    /// The smallest key but the winner's: the least loser on the winner's path.
    fn runner_up(&self) -> u128 {
        let mut p = (self.n + self.winner()) / 2;
        let mut best = u128::MAX;
        while p >= 1 {
            best = best.min(self.keys[self.losers[p]]);
            p /= 2;
        }
        best
    }
}

/// The merged stream of [`Merger::new`]: [`Merger::next_stretch`] until `None`.
pub struct Merger<'a> {
    cursors: Vec<Cursor<'a>>,
    tree: Tree,
    started: bool,
    failed: bool,
}

impl<'a> Merger<'a> {
    /// Merges `inputs` into one stream in strictly increasing ID order.
    ///
    /// Holds each input's current block (and whatever read-ahead its [`Blocks`] keeps), so
    /// memory is bounded by the number of inputs, not the number of records. Fails, then
    /// ends, when:
    /// - two inputs hold the same ID ([`MergeError::Duplicate`], naming both, the one
    ///   listed first as `first`; the duplicated record is not yielded even once),
    /// - an input's IDs do not strictly increase ([`MergeError::OutOfOrder`]),
    /// - a record's shard is not its input's ([`MergeError::WrongShard`]),
    /// - an input fails to read ([`MergeError::Read`], or the input's own error).
    ///
    /// These are safety violations of the whole pipeline: the caller must discard the output.
    pub fn new(inputs: Vec<Input<'a>>) -> Merger<'a> {
        let tree = Tree::new(inputs.len());
        let cursors = inputs
            .into_iter()
            .map(|input| Cursor {
                input,
                block: Bytes::new(),
                pos: 0,
                id: 0,
                last_id: None,
                done: false,
                stale: false,
            })
            .collect();
        Merger {
            cursors,
            tree,
            started: false,
            failed: false,
        }
    }

    fn start(&mut self) -> Result<(), MergeError> {
        for (i, c) in self.cursors.iter_mut().enumerate() {
            c.settle()?;
            self.tree.keys[i] = Tree::key_of(c, i);
        }
        self.tree.build();
        Ok(())
    }

    /// The next stretch, `Ok(None)` at the end. After an error it returns `Ok(None)`.
    ///
    /// # Errors
    /// As [`Merger::new`] says.
    pub fn next_stretch(&mut self) -> Result<Option<Stretch<'_>>, MergeError> {
        if self.failed {
            return Ok(None);
        }
        match self.step() {
            Ok(Some((input, start, end, records))) => Ok(Some(Stretch {
                bytes: &self.cursors[input].block[start..end],
                records,
                input,
            })),
            Ok(None) => Ok(None),
            Err(e) => {
                self.failed = true;
                Err(e)
            }
        }
    }

    fn step(&mut self) -> Result<Option<(usize, usize, usize, u64)>, MergeError> {
        if !self.started {
            self.started = true;
            self.start()?;
        }
        if self.cursors.is_empty() {
            return Ok(None);
        }
        loop {
            let w = self.tree.winner();
            let c = &mut self.cursors[w];
            // The winner's last stretch moved its head: read the new one and replay.
            if c.stale {
                c.settle()?;
                let key = Tree::key_of(c, w);
                self.tree.replay(w, key);
                continue;
            }
            if c.done {
                return Ok(None);
            }
            let runner_up = self.tree.runner_up();
            let taken = if runner_up == u128::MAX {
                c.take_below(None)?
            } else {
                let bound = (runner_up >> 32) as u64;
                if c.id == bound {
                    let other = (runner_up & u128::from(u32::MAX)) as usize;
                    let (first, second) = (w.min(other), w.max(other));
                    return Err(MergeError::Duplicate {
                        id: bound,
                        first: self.cursors[first].input.name.clone(),
                        second: self.cursors[second].input.name.clone(),
                    });
                }
                c.take_below(Some(bound))?
            };
            return Ok(Some((w, taken.0, taken.1, taken.2)));
        }
    }
}

/// One sorted input of [`merge`]: a name for error messages, the shard numbers its
/// records may carry, and the records in strictly increasing ID order.
pub struct SortedRecords<I> {
    /// Names the input in errors.
    pub name: String,
    /// The shard numbers a record of this input may carry, ascending (one for a
    /// sublist, the shard table's for a run).
    pub shards: Vec<u32>,
    /// The records, ascending by ID.
    pub records: I,
}

impl<I> SortedRecords<I> {
    /// An input of one shard (a sublist).
    pub fn new(name: impl Into<String>, shard: u32, records: I) -> SortedRecords<I> {
        SortedRecords::with_shards(name, vec![shard], records)
    }

    /// An input of several shards (a run: a merge of merges).
    pub fn with_shards(
        name: impl Into<String>,
        mut shards: Vec<u32>,
        records: I,
    ) -> SortedRecords<I> {
        shards.sort_unstable();
        SortedRecords {
            name: name.into(),
            shards,
            records,
        }
    }
}

/// A record iterator as [`Blocks`]: up to [`READ_AHEAD_RECORDS`] records (or about
/// [`READ_AHEAD_BYTES`]) encoded into each block; an error after the records before it.
pub struct RecordBlocks<I> {
    name: String,
    records: I,
    pending: Option<MergeError>,
    exhausted: bool,
}

impl<I> RecordBlocks<I> {
    /// The blocks of `records`; `name` names the input in its errors.
    pub fn new(name: impl Into<String>, records: I) -> RecordBlocks<I> {
        RecordBlocks {
            name: name.into(),
            records,
            pending: None,
            exhausted: false,
        }
    }
}

impl<I, E> Blocks for RecordBlocks<I>
where
    I: Iterator<Item = Result<Record, E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn next_block(&mut self) -> Result<Option<Bytes>, MergeError> {
        let mut block = Vec::new();
        let mut n = 0;
        while !self.exhausted
            && self.pending.is_none()
            && n < READ_AHEAD_RECORDS
            && block.len() < READ_AHEAD_BYTES
        {
            match self.records.next() {
                None => self.exhausted = true,
                Some(Ok(r)) => {
                    qformat::record::encode_record(&r, &mut block);
                    n += 1;
                }
                Some(Err(e)) => {
                    // An input that already says where (a run names its object and offset).
                    let error: Box<dyn std::error::Error + Send + Sync> = e.into();
                    self.pending = Some(match error.downcast::<MergeError>() {
                        Ok(e) => *e,
                        Err(error) => MergeError::Read {
                            input: self.name.clone(),
                            error,
                        },
                    });
                }
            }
        }
        if n > 0 {
            return Ok(Some(Bytes::from(block)));
        }
        match self.pending.take() {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }
}

/// The merged stream returned by [`merge`]: owned records, in order.
pub struct Merge<'a> {
    merger: Merger<'a>,
    out: std::collections::VecDeque<Record>,
    failed: bool,
}

/// Merges sorted record iterators into one stream in strictly increasing ID order: the
/// merge of [`Merger`] over [`RecordBlocks`], its records copied out (for tests, tools
/// and sublists read record by record). Errors as [`Merger::new`] says.
pub fn merge<'a, I, E>(sources: Vec<SortedRecords<I>>) -> Merge<'a>
where
    I: Iterator<Item = Result<Record, E>> + 'a,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + 'a,
{
    let inputs = sources
        .into_iter()
        .map(|s| {
            let blocks = RecordBlocks::new(s.name.clone(), s.records);
            Input::new(s.name, s.shards, Box::new(blocks))
        })
        .collect();
    Merge {
        merger: Merger::new(inputs),
        out: std::collections::VecDeque::new(),
        failed: false,
    }
}

impl Iterator for Merge<'_> {
    type Item = Result<Record, MergeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(r) = self.out.pop_front() {
            return Some(Ok(r));
        }
        if self.failed {
            return None;
        }
        match self.merger.next_stretch() {
            Ok(Some(s)) => {
                self.out.extend(s.iter().map(|r| r.to_record()));
                self.out.pop_front().map(Ok)
            }
            Ok(None) => None,
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    fn rec(id: u64, shard: u32) -> Record {
        Record {
            id,
            shard,
            seq: id,
            payload: vec![],
        }
    }

    fn src(
        name: &str,
        shard: u32,
        ids: &[u64],
    ) -> SortedRecords<std::vec::IntoIter<Result<Record, Infallible>>> {
        SortedRecords::new(
            name,
            shard,
            ids.iter()
                .map(|&id| Ok(rec(id, shard)))
                .collect::<Vec<_>>()
                .into_iter(),
        )
    }

    fn ids(m: impl Iterator<Item = Result<Record, MergeError>>) -> Result<Vec<u64>, MergeError> {
        m.map(|r| r.map(|r| r.id)).collect()
    }

    #[test]
    fn merges_in_order() {
        let m = merge(vec![
            src("a", 0, &[1, 4, 9]),
            src("b", 1, &[2, 3, 10]),
            src("c", 2, &[]),
        ]);
        assert_eq!(ids(m).expect("merge"), vec![1, 2, 3, 4, 9, 10]);
        assert_eq!(
            ids(merge(Vec::<
                SortedRecords<std::vec::IntoIter<Result<Record, Infallible>>>,
            >::new()))
            .expect("empty"),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn duplicate_names_both_sources_and_is_never_yielded() {
        let mut m = merge(vec![src("a", 0, &[1, 5]), src("b", 1, &[2, 5, 6])]);
        assert_eq!(m.next().map(|r| r.map(|r| r.id).ok()), Some(Some(1)));
        assert_eq!(m.next().map(|r| r.map(|r| r.id).ok()), Some(Some(2)));
        let err = m.next().expect("item").expect_err("duplicate");
        assert!(
            matches!(&err, MergeError::Duplicate { id: 5, first, second } if first == "a" && second == "b"),
            "{err}"
        );
        assert!(
            err.to_string().contains("id 5")
                && err.to_string().contains("a")
                && err.to_string().contains("b"),
            "{err}"
        );
        assert!(m.next().is_none(), "fused after an error");
    }

    #[test]
    fn out_of_order_and_wrong_shard() {
        let err = ids(merge(vec![src("a", 0, &[1, 3]), src("b", 1, &[2, 2])])).expect_err("order");
        assert!(
            matches!(&err, MergeError::OutOfOrder { input, prev: 2, id: 2 } if input == "b"),
            "{err}"
        );
        let bad = SortedRecords::new("c", 7, vec![Ok::<_, Infallible>(rec(1, 8))].into_iter());
        let err = ids(merge(vec![bad])).expect_err("shard");
        assert!(
            matches!(
                &err,
                MergeError::WrongShard {
                    expected,
                    found: 8,
                    id: 1,
                    ..
                } if expected == &[7]
            ),
            "{err}"
        );
    }

    #[test]
    fn source_error_is_passed_on() {
        let items: Vec<Result<Record, std::io::Error>> =
            vec![Ok(rec(1, 0)), Err(std::io::Error::other("disk on fire"))];
        let err = ids(merge(vec![SortedRecords::new("x", 0, items.into_iter())]))
            .expect_err("source error");
        assert!(
            err.to_string().contains("disk on fire") && err.to_string().contains('x'),
            "{err}"
        );
    }

    #[test]
    fn a_source_error_is_printed_once() {
        let items: Vec<Result<Record, std::io::Error>> =
            vec![Ok(rec(1, 0)), Err(std::io::Error::from_raw_os_error(28))];
        let err = ids(merge(vec![SortedRecords::new("x", 0, items.into_iter())]))
            .expect_err("source error");
        // What `{:#}` prints: the message, then every source in the chain.
        let mut printed = err.to_string();
        let mut cause = std::error::Error::source(&err);
        while let Some(c) = cause {
            printed = format!("{printed}: {c}");
            cause = c.source();
        }
        assert_eq!(
            printed.matches("No space left on device").count(),
            1,
            "{printed}"
        );
    }

    /// A source that counts how many records were taken from it.
    struct Counted {
        next: u64,
        end: u64,
        shard: u32,
        payload: usize,
        taken: std::rc::Rc<std::cell::Cell<usize>>,
    }

    impl Iterator for Counted {
        type Item = Result<Record, Infallible>;
        fn next(&mut self) -> Option<Self::Item> {
            if self.next >= self.end {
                return None;
            }
            self.taken.set(self.taken.get() + 1);
            let id = self.next;
            self.next += 2;
            Some(Ok(Record {
                id,
                shard: self.shard,
                seq: id / 2,
                payload: vec![b'p'; self.payload],
            }))
        }
    }

    /// Memory is bounded by the read-ahead: whatever the merge has yielded, no source has
    /// been read more than READ_AHEAD_RECORDS records (or READ_AHEAD_BYTES bytes, plus the
    /// record that crossed it) beyond what was yielded from it.
    #[test]
    fn read_ahead_is_bounded_in_records_and_bytes() {
        for payload in [0usize, 1000, 40_000, 200_000] {
            let taken: Vec<_> = (0..2).map(|_| std::rc::Rc::default()).collect();
            let sources = (0..2u32)
                .map(|s| {
                    SortedRecords::new(
                        format!("s{s}"),
                        s,
                        Counted {
                            next: u64::from(s),
                            end: 10_000,
                            shard: s,
                            payload,
                            taken: std::rc::Rc::clone(&taken[s as usize]),
                        },
                    )
                })
                .collect();
            let per_record = qformat::record::encoded_len(payload);
            // Records buffered at most: the cap in records, or the byte cap plus the one
            // record that crossed it, whichever comes first.
            let cap = READ_AHEAD_RECORDS.min(READ_AHEAD_BYTES.div_ceil(per_record).max(1));
            let mut yielded = [0usize; 2];
            let mut max_ahead = 0;
            for r in merge(sources) {
                let r = r.expect("merge");
                yielded[r.shard as usize] += 1;
                for s in 0..2 {
                    let ahead = taken[s].get() - yielded[s];
                    assert!(
                        ahead <= cap,
                        "payload {payload}: source {s} read {ahead} records ahead, cap {cap}"
                    );
                    max_ahead = max_ahead.max(ahead);
                }
            }
            assert_eq!(yielded, [5000, 5000]);
            // The bound is reached, so the test would notice a looser one.
            assert_eq!(max_ahead, cap, "payload {payload}");
        }
    }
}

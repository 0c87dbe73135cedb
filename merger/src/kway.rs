//! The k-way merge as a pure function over iterators: no RocksDB, no files, so it can be
//! property-tested against "concatenate, sort, compare".

use std::cmp::Ordering;
use std::collections::binary_heap::PeekMut;
use std::collections::{BinaryHeap, VecDeque};

use sublist::Record;

use crate::MergeError;

/// Records read ahead from a source in one go: reading a run from one source at a time
/// keeps that source's iterator (for RocksDB: block, index, file state) warm in the CPU
/// caches, instead of switching sources on nearly every record when IDs interleave.
pub const READ_AHEAD_RECORDS: usize = 128;
/// Stop reading ahead once this many bytes are buffered for one source, so memory stays
/// bounded by sources x this even with big payloads.
pub const READ_AHEAD_BYTES: usize = 64 << 10;

/// One sorted input of the merge: a name for error messages (e.g. the shard's path), the
/// shard numbers its records may carry, and the records in strictly increasing ID order.
pub struct Source<I> {
    /// Names the source in errors.
    pub name: String,
    /// The shard numbers a record of this source may carry, ascending (one for a
    /// sublist, the shard table's for a run).
    pub shards: Vec<u32>,
    /// The records, ascending by ID.
    pub records: I,
}

impl<I> Source<I> {
    /// A source of one shard (a sublist).
    pub fn new(name: impl Into<String>, shard: u32, records: I) -> Source<I> {
        Source::with_shards(name, vec![shard], records)
    }

    /// A source of several shards (a run: a merge of merges).
    pub fn with_shards(name: impl Into<String>, mut shards: Vec<u32>, records: I) -> Source<I> {
        shards.sort_unstable();
        Source {
            name: name.into(),
            shards,
            records,
        }
    }
}

struct State<I> {
    name: String,
    shards: Vec<u32>,
    records: I,
    last_id: Option<u64>,
    /// Checked records read ahead, in order.
    ahead: VecDeque<Record>,
    /// An error met while reading ahead: reported after the records before it.
    pending: Option<MergeError>,
    exhausted: bool,
}

/// A source's current head. Ordered so that `BinaryHeap` (a max-heap) pops the smallest
/// ID first; ties (duplicates) break by source index so errors are deterministic.
struct Head {
    record: Record,
    source: usize,
}

impl Head {
    fn key(&self) -> (u64, usize) {
        (self.record.id, self.source)
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Head {
    fn cmp(&self, other: &Self) -> Ordering {
        other.key().cmp(&self.key())
    }
}

/// The merged stream returned by [`merge`].
pub struct Merge<I> {
    sources: Vec<State<I>>,
    heap: BinaryHeap<Head>,
    started: bool,
    failed: bool,
}

/// Merges sorted sources into one stream in strictly increasing ID order.
///
/// Holds a heap of one head per source plus a small read-ahead buffer per source
/// ([`READ_AHEAD_RECORDS`], at most about [`READ_AHEAD_BYTES`]), so memory is bounded by the
/// number of sources, not the number of records. Yields an error, then ends, when:
/// - two sources hold the same ID ([`MergeError::Duplicate`], naming both; the duplicated
///   record is not yielded even once),
/// - a source's IDs do not strictly increase ([`MergeError::OutOfOrder`]),
/// - a record's shard is not its source's shard ([`MergeError::WrongShard`]),
/// - a source yields an error ([`MergeError::Source`]).
///
/// These are safety violations of the whole pipeline: the caller must discard the output.
pub fn merge<I, E>(sources: Vec<Source<I>>) -> Merge<I>
where
    I: Iterator<Item = Result<Record, E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let heap = BinaryHeap::with_capacity(sources.len());
    let sources = sources
        .into_iter()
        .map(|s| State {
            name: s.name,
            shards: s.shards,
            records: s.records,
            last_id: None,
            ahead: VecDeque::new(),
            pending: None,
            exhausted: false,
        })
        .collect();
    Merge {
        sources,
        heap,
        started: false,
        failed: false,
    }
}

/// The next record of a source, from its read-ahead buffer (refilled when empty).
fn pull<I, E>(src: &mut State<I>) -> Result<Option<Record>, MergeError>
where
    I: Iterator<Item = Result<Record, E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if src.ahead.is_empty() && src.pending.is_none() && !src.exhausted {
        let mut bytes = 0;
        while src.ahead.len() < READ_AHEAD_RECORDS && bytes < READ_AHEAD_BYTES {
            match read_checked(src) {
                Ok(Some(r)) => {
                    bytes += r.payload.len() + sublist::listbin::RECORD_HEAD_LEN;
                    src.ahead.push_back(r);
                }
                Ok(None) => {
                    src.exhausted = true;
                    break;
                }
                Err(e) => {
                    src.pending = Some(e);
                    break;
                }
            }
        }
    }
    match src.ahead.pop_front() {
        Some(r) => Ok(Some(r)),
        None => src.pending.take().map_or(Ok(None), Err),
    }
}

/// Reads the next record of a source, checking it against the source's promises.
fn read_checked<I, E>(src: &mut State<I>) -> Result<Option<Record>, MergeError>
where
    I: Iterator<Item = Result<Record, E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let record = match src.records.next() {
        None => return Ok(None),
        Some(Err(e)) => {
            // A source that already says where (a run names its object and offset).
            let error: Box<dyn std::error::Error + Send + Sync> = e.into();
            return Err(match error.downcast::<MergeError>() {
                Ok(e) => *e,
                Err(error) => MergeError::Source {
                    source_name: src.name.clone(),
                    error,
                },
            });
        }
        Some(Ok(r)) => r,
    };
    let listed = match src.shards.as_slice() {
        [one] => *one == record.shard,
        many => many.binary_search(&record.shard).is_ok(),
    };
    if !listed {
        return Err(MergeError::WrongShard {
            source_name: src.name.clone(),
            expected: src.shards.clone(),
            found: record.shard,
            id: record.id,
        });
    }
    if let Some(prev) = src.last_id {
        if record.id <= prev {
            return Err(MergeError::OutOfOrder {
                source_name: src.name.clone(),
                prev,
                id: record.id,
            });
        }
    }
    src.last_id = Some(record.id);
    Ok(Some(record))
}

impl<I, E> Merge<I>
where
    I: Iterator<Item = Result<Record, E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn start(&mut self) -> Result<(), MergeError> {
        for (i, src) in self.sources.iter_mut().enumerate() {
            if let Some(record) = pull(src)? {
                self.heap.push(Head { record, source: i });
            }
        }
        Ok(())
    }

    fn step(&mut self) -> Result<Option<Record>, MergeError> {
        if !self.started {
            self.started = true;
            self.start()?;
        }
        let Some(mut top) = self.heap.peek_mut() else {
            return Ok(None);
        };
        let source = top.source;
        let id = top.record.id;
        // Replace the head in place (one sift-down) rather than pop + push (two).
        let record = match pull(&mut self.sources[source])? {
            Some(next) => {
                let record = std::mem::replace(&mut top.record, next);
                drop(top); // sifts the new head down
                record
            }
            None => PeekMut::pop(top).record,
        };
        // The source's own next ID is above `id` (checked by `pull`), so an equal new top
        // comes from another source: a duplicate.
        if let Some(next) = self.heap.peek() {
            if next.record.id == id {
                return Err(MergeError::Duplicate {
                    id,
                    first: self.sources[source].name.clone(),
                    second: self.sources[next.source].name.clone(),
                });
            }
        }
        Ok(Some(record))
    }
}

impl<I, E> Iterator for Merge<I>
where
    I: Iterator<Item = Result<Record, E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Item = Result<Record, MergeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(r) => r.map(Ok),
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
    ) -> Source<std::vec::IntoIter<Result<Record, Infallible>>> {
        Source::new(
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
                Source<std::vec::IntoIter<Result<Record, Infallible>>>,
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
            matches!(&err, MergeError::OutOfOrder { source_name, prev: 2, id: 2 } if source_name == "b"),
            "{err}"
        );
        let bad = Source::new("c", 7, vec![Ok::<_, Infallible>(rec(1, 8))].into_iter());
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
        let err =
            ids(merge(vec![Source::new("x", 0, items.into_iter())])).expect_err("source error");
        assert!(
            err.to_string().contains("disk on fire") && err.to_string().contains('x'),
            "{err}"
        );
    }

    #[test]
    fn a_source_error_is_printed_once() {
        let items: Vec<Result<Record, std::io::Error>> =
            vec![Ok(rec(1, 0)), Err(std::io::Error::from_raw_os_error(28))];
        let err =
            ids(merge(vec![Source::new("x", 0, items.into_iter())])).expect_err("source error");
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
                    Source::new(
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
            let per_record = payload + sublist::listbin::RECORD_HEAD_LEN;
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

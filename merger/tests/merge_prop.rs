//! Property tests of the pure k-way merge against "concatenate, sort, compare".

use std::convert::Infallible;

use merger::{merge, MergeError, SortedRecords};
use proptest::prelude::*;
use qformat::Record;

type Src = SortedRecords<std::vec::IntoIter<Result<Record, Infallible>>>;

/// Splits sorted unique IDs among `shards` sources by the given assignment; each source's
/// records get consecutive seqs, like a producer's.
fn split(ids: &[u64], assign: &[usize], shards: usize) -> Vec<Vec<Record>> {
    let mut out: Vec<Vec<Record>> = vec![Vec::new(); shards];
    for (i, &id) in ids.iter().enumerate() {
        let s = assign[i % assign.len().max(1)] % shards;
        let seq = out[s].len() as u64;
        out[s].push(Record {
            id,
            shard: s as u32,
            seq,
            payload: id.to_le_bytes()[..(id % 9) as usize].to_vec(),
        });
    }
    out
}

fn sources(parts: &[Vec<Record>]) -> Vec<Src> {
    parts
        .iter()
        .enumerate()
        .map(|(s, recs)| {
            SortedRecords::new(
                format!("shard-{s}"),
                s as u32,
                recs.iter().cloned().map(Ok).collect::<Vec<_>>().into_iter(),
            )
        })
        .collect()
}

fn sorted(parts: &[Vec<Record>]) -> Vec<Record> {
    let mut all: Vec<Record> = parts.iter().flatten().cloned().collect();
    all.sort_by_key(|r| r.id);
    all
}

/// IDs just below and above 2^63 (where a signed comparison flips) and up to u64::MAX
/// (where an off-by-one overflows): a uniform u64 almost never lands there.
const EDGES: [u64; 3] = [0, 1 << 63, u64::MAX];

fn near_edges() -> impl Strategy<Value = u64> {
    (0..EDGES.len(), 0u64..1000).prop_map(|(e, d)| match EDGES[e] {
        0 => d,
        u64::MAX => u64::MAX - d,
        mid => {
            if d % 2 == 0 {
                mid - d / 2 - 1
            } else {
                mid + d / 2
            }
        }
    })
}

fn id_sets() -> impl Strategy<Value = Vec<u64>> {
    prop_oneof![
        proptest::collection::btree_set(0u64..2000, 0..300),
        proptest::collection::btree_set(any::<u64>(), 0..300),
        proptest::collection::btree_set(near_edges(), 0..300),
        proptest::collection::btree_set(
            prop_oneof![any::<u64>(), near_edges(), (u64::MAX - 5)..=u64::MAX],
            0..300
        ),
    ]
    .prop_map(|s| s.into_iter().collect())
}

#[test]
fn edge_ids_are_reached() {
    // The strategy above must produce what the docs claim it covers.
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut above_2_63, mut max) = (false, false);
    for _ in 0..200 {
        let ids = id_sets().new_tree(&mut runner).expect("tree").current();
        above_2_63 |= ids.iter().any(|i| (1 << 63..(1 << 63) + 1000).contains(i));
        max |= ids.contains(&u64::MAX);
    }
    assert!(above_2_63 && max, "2^63: {above_2_63}, u64::MAX: {max}");
}

#[test]
fn ids_around_2_63_and_u64_max_merge_in_order() {
    let ids: Vec<u64> = vec![
        0,
        1,
        (1 << 63) - 2,
        (1 << 63) - 1,
        1 << 63,
        (1 << 63) + 1,
        u64::MAX - 2,
        u64::MAX - 1,
        u64::MAX,
    ];
    for shards in [1, 2, 3, 9] {
        let parts = split(&ids, &[0, 1, 2, 3, 4, 5, 6, 7, 8], shards);
        let merged: Vec<u64> = merge(sources(&parts))
            .map(|r| r.expect("valid inputs merge").id)
            .collect();
        assert_eq!(merged, ids, "{shards} shards");
    }
}

proptest! {
    #[test]
    fn merge_equals_sort(ids in id_sets(), shards in 1usize..=64, assign in proptest::collection::vec(any::<usize>(), 1..50)) {
        let parts = split(&ids, &assign, shards);
        let merged: Vec<Record> = merge(sources(&parts)).collect::<Result<_, _>>().expect("valid inputs merge");
        prop_assert_eq!(merged, sorted(&parts));
    }

    #[test]
    fn duplicate_across_sources_errors(ids in proptest::collection::btree_set(0u64..10_000, 1..200),
                                       shards in 2usize..=64,
                                       assign in proptest::collection::vec(any::<usize>(), 1..50),
                                       pick in any::<usize>(), to in any::<usize>()) {
        let ids: Vec<u64> = ids.into_iter().collect();
        let mut parts = split(&ids, &assign, shards);
        let dup = ids[pick % ids.len()];
        let from = parts.iter().position(|p| p.iter().any(|r| r.id == dup)).expect("dup is somewhere");
        let target = (from + 1 + to % (shards - 1)) % shards;
        let pos = parts[target].partition_point(|r| r.id < dup);
        parts[target].insert(pos, Record { id: dup, shard: target as u32, seq: 0, payload: vec![] });
        let result: Result<Vec<Record>, MergeError> = merge(sources(&parts)).collect();
        match result {
            Err(MergeError::Duplicate { id, first, second }) => {
                prop_assert_eq!(id, dup);
                let mut named = [first, second];
                named.sort();
                let mut expected = [format!("shard-{from}"), format!("shard-{target}")];
                expected.sort();
                prop_assert_eq!(named, expected);
            }
            other => prop_assert!(false, "expected a duplicate error, got {:?}", other.map(|v| v.len())),
        }
    }

    #[test]
    fn out_of_order_source_errors(ids in proptest::collection::btree_set(0u64..10_000, 2..200), swap in any::<usize>()) {
        let ids: Vec<u64> = ids.into_iter().collect();
        let mut parts = split(&ids, &[0], 1);
        let i = swap % (ids.len() - 1);
        parts[0].swap(i, i + 1);
        let result: Result<Vec<Record>, MergeError> = merge(sources(&parts)).collect();
        prop_assert!(
            matches!(&result, Err(MergeError::OutOfOrder { input, prev, id }) if input == "shard-0" && *prev == ids[i + 1] && *id == ids[i]),
            "{:?}", result.map(|v| v.len())
        );
    }
}

#[test]
fn edge_cases_empty_one_and_64_shards() {
    let none: Vec<Src> = Vec::new();
    assert_eq!(merge(none).count(), 0);
    let empty64 = sources(&vec![Vec::new(); 64]);
    assert_eq!(merge(empty64).count(), 0);
    let ids: Vec<u64> = (0..10_000).map(|i| i * 3 + 1).collect();
    let one = split(&ids, &[0], 1);
    let merged: Vec<Record> = merge(sources(&one))
        .collect::<Result<_, _>>()
        .expect("one shard");
    assert_eq!(merged, one[0]);
    let assign: Vec<usize> = (0..997).map(|i| (i * 7919) % 64).collect();
    let many = split(&ids, &assign, 64);
    assert!(many.iter().all(|p| !p.is_empty()));
    let merged: Vec<Record> = merge(sources(&many))
        .collect::<Result<_, _>>()
        .expect("64 shards");
    assert_eq!(merged, sorted(&many));
}

#[test]
fn wrong_shard_number_errors() {
    let recs = vec![Ok::<_, Infallible>(Record {
        id: 1,
        shard: 3,
        seq: 0,
        payload: vec![],
    })];
    let err = merge(vec![SortedRecords::new("db-a", 2, recs.into_iter())])
        .find_map(Result::err)
        .expect("error");
    assert!(
        matches!(
            &err,
            MergeError::WrongShard {
                expected,
                found: 3,
                id: 1,
                ..
            } if expected == &[2]
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "db-a: record id 1 says shard 3, but this input is shard 2"
    );
}

/// Streaming: the merge never holds more than a heap head plus one read-ahead run per
/// source, however many records flow through (here 1 million, generated lazily).
#[test]
fn buffering_is_bounded_by_sources_not_records() {
    use std::cell::Cell;
    use std::rc::Rc;
    const SHARDS: u64 = 16;
    const PER_SHARD: u64 = 62_500;
    let pulled = Rc::new(Cell::new(0u64));
    let sources: Vec<_> = (0..SHARDS)
        .map(|s| {
            let pulled = Rc::clone(&pulled);
            let records = (0..PER_SHARD).map(move |i| {
                pulled.set(pulled.get() + 1);
                Ok::<_, Infallible>(Record {
                    id: i * SHARDS + s,
                    shard: s as u32,
                    seq: i,
                    payload: vec![0; 8],
                })
            });
            SortedRecords::new(format!("shard-{s}"), s as u32, records)
        })
        .collect();
    let bound = SHARDS * (merger::READ_AHEAD_RECORDS as u64 + 1);
    let mut emitted = 0u64;
    let mut max_held = 0u64;
    for r in merge(sources) {
        let r = r.expect("valid inputs merge");
        assert_eq!(r.id, emitted);
        emitted += 1;
        max_held = max_held.max(pulled.get() - emitted);
    }
    assert_eq!(emitted, SHARDS * PER_SHARD);
    assert!(
        max_held <= bound,
        "held {max_held} records at once, bound {bound}"
    );
}

//! Split points: the K ID ranges of a split merge (`--part I/K`, `--jobs J`), computed
//! from the inputs' indexes alone, so K processes started independently agree on them.
//!
//! The rule (docs/merger.md): sort every block of every input by its first ID (ties by
//! length, then offset: a total order), and let B be their total bytes. Boundary `i`, for
//! `i` in `1..K`, is the first ID of the first block in that order before which at least
//! `B * i / K` bytes lie (or one past the largest ID when no block is left), never below
//! one. Part `i` holds the IDs from boundary `i` to boundary `i + 1` minus one; part 0
//! starts at 0 and part K-1 ends at `u64::MAX`. So the parts tile the ID space with no gap
//! and no overlap, a part may be empty (two equal boundaries), and each part's blocks add
//! up to about `B / K` bytes, give or take one block per input (a block that straddles a
//! boundary is read by both parts, each keeping its own IDs).

use qformat::run::{Part, RunMeta};

/// The `count` parts of the inputs with these indexes, in order.
///
/// # Panics
/// Never for `count >= 1`; `count == 0` is a caller bug (the command line refuses it).
pub fn split(metas: &[&RunMeta], count: u32) -> Vec<Part> {
    debug_assert!(count >= 1, "a split into 0 parts");
    let count = count.max(1);
    let mut blocks: Vec<(u64, u32, u64)> = metas
        .iter()
        .flat_map(|m| m.blocks.iter().map(|b| (b.first_id, b.len, b.offset)))
        .collect();
    blocks.sort_unstable();
    let total: u128 = blocks.iter().map(|b| u128::from(b.1)).sum();
    let past_end = metas
        .iter()
        .filter_map(|m| m.blocks.last().map(|b| b.last_id))
        .max()
        .map_or(1, |m| m.saturating_add(1));
    let mut bounds = Vec::with_capacity(count as usize + 1);
    bounds.push(0u64);
    let (mut j, mut before) = (0usize, 0u128);
    for i in 1..count {
        let target = total * u128::from(i) / u128::from(count);
        while j < blocks.len() && before < target {
            before += u128::from(blocks[j].1);
            j += 1;
        }
        let bound = blocks.get(j).map_or(past_end, |b| b.0).max(1);
        bounds.push(bound.max(bounds[bounds.len() - 1]));
    }
    (0..count)
        .map(|i| {
            let first_id = bounds[i as usize];
            let last_id = match bounds.get(i as usize + 1) {
                Some(&next) => next - 1,
                None => u64::MAX,
            };
            Part {
                index: i,
                count,
                first_id,
                last_id,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use qformat::run::{RunWriter, ShardSpec};
    use qformat::Record;

    fn run(ids: &[u64], shard: u32, payload: usize) -> RunMeta {
        let spec = ShardSpec {
            shard,
            finished: true,
            total: ids.len() as u64,
        };
        let mut w = RunWriter::new(Vec::new(), vec![spec], Part::WHOLE).expect("new");
        for (seq, &id) in ids.iter().enumerate() {
            let r = Record {
                id,
                shard,
                seq: seq as u64,
                payload: vec![0; payload],
            };
            w.write(&r).expect("write");
        }
        w.finish().expect("finish").1
    }

    #[track_caller]
    fn assert_tiles(parts: &[Part]) {
        assert_eq!(parts[0].first_id, 0);
        assert_eq!(parts[parts.len() - 1].last_id, u64::MAX);
        for w in parts.windows(2) {
            assert_eq!(w[0].last_id.wrapping_add(1), w[1].first_id, "{parts:?}");
        }
        for (i, p) in parts.iter().enumerate() {
            assert_eq!((p.index as usize, p.count as usize), (i, parts.len()));
        }
    }

    #[test]
    fn parts_tile_the_id_space_and_are_even_in_bytes() {
        let a = run(&(1..40_000).map(|i| i * 2).collect::<Vec<_>>(), 0, 100);
        let b = run(&(1..20_000).map(|i| i * 4 + 1).collect::<Vec<_>>(), 1, 100);
        let metas = [&a, &b];
        let total: u64 = metas
            .iter()
            .flat_map(|m| &m.blocks)
            .map(|b| u64::from(b.len))
            .sum();
        // Even to within one block per input at each of a part's two ends: the largest
        // block as the index says, not as the writer's target would have it.
        let largest = metas
            .iter()
            .flat_map(|m| &m.blocks)
            .map(|b| u64::from(b.len))
            .max()
            .expect("blocks");
        for k in 1..=8 {
            let parts = split(&metas, k);
            assert_tiles(&parts);
            for p in &parts {
                let bytes: u64 = metas
                    .iter()
                    .flat_map(|m| m.blocks_in(p.first_id, p.last_id))
                    .map(|b| u64::from(b.len))
                    .sum();
                let slack = 2 * metas.len() as u64 * largest;
                assert!(
                    bytes.abs_diff(total / u64::from(k)) <= slack,
                    "k={k} {p:?}: {bytes} of {total}"
                );
            }
            assert_eq!(split(&metas, k), parts, "deterministic");
        }
    }

    #[test]
    fn more_parts_than_blocks_leaves_empty_parts() {
        let a = run(&[5, 6, 7], 0, 1);
        let parts = split(&[&a], 8);
        assert_tiles(&parts);
        let nonempty = parts.iter().filter(|p| p.first_id <= p.last_id).count();
        assert!(nonempty >= 2, "{parts:?}");
        assert!(parts.iter().any(|p| p.first_id > p.last_id), "{parts:?}");
        let none = split(&[], 3);
        assert_tiles(&none);
    }

    #[test]
    fn ids_at_the_top_of_the_space() {
        let a = run(&[u64::MAX - 2, u64::MAX - 1, u64::MAX], 0, 300_000);
        let parts = split(&[&a], 3);
        assert_tiles(&parts);
    }
}

use super::*;
use crate::record::rec;

fn spec(shard: u32, total: u64) -> ShardSpec {
    ShardSpec {
        shard,
        finished: true,
        total,
    }
}

fn write_run(records: &[Record], specs: Vec<ShardSpec>, part: Part) -> Vec<u8> {
    let mut w = RunWriter::new(Vec::new(), specs, part).expect("new");
    for r in records {
        w.write(r).expect("write");
    }
    let (bytes, meta) = w.finish().expect("finish");
    assert_eq!(meta.file_len, bytes.len() as u64);
    bytes
}

/// Everything a reader checks: metadata from the tail, then every block.
fn read_run(bytes: &[u8]) -> Result<(RunMeta, Vec<Record>), RunError> {
    let meta = RunMeta::decode(bytes.len() as u64, bytes)?;
    let mut out = Vec::new();
    for (i, b) in meta.blocks.iter().enumerate() {
        let r = b.range();
        out.extend(decode_block(
            &bytes[r.start as usize..r.end as usize],
            b,
            i as u64,
        )?);
    }
    Ok((meta, out))
}

#[test]
fn exact_bytes_of_a_one_record_run() {
    let bytes = write_run(&[rec(5, 1, 0, b"ab")], vec![spec(1, 1)], Part::WHOLE);
    let record: Vec<u8> = [
        &5u64.to_le_bytes()[..],
        &1u32.to_le_bytes(),
        &0u64.to_le_bytes(),
        &2u64.to_le_bytes(),
        b"ab",
    ]
    .concat();
    let block_crc = crc32fast::hash(&record);
    let index: Vec<u8> = [
        &5u64.to_le_bytes()[..], // first id
        &5u64.to_le_bytes(),     // last id
        &8u64.to_le_bytes(),     // offset
        &1u32.to_le_bytes(),     // records
        &34u32.to_le_bytes(),    // length: 30 record bytes + CRC
    ]
    .concat();
    let shards: Vec<u8> = [
        &1u32.to_le_bytes()[..], // shard
        &1u32.to_le_bytes(),     // flags: finished
        &0u64.to_le_bytes(),     // first seq
        &1u64.to_le_bytes(),     // count
        &1u64.to_le_bytes(),     // total
    ]
    .concat();
    let footer_fields: Vec<u8> = [
        &42u64.to_le_bytes()[..], // index offset: 8 + 34
        &1u64.to_le_bytes(),      // blocks
        &1u64.to_le_bytes(),      // shards
        &1u64.to_le_bytes(),      // records
        &0u32.to_le_bytes(),      // part index
        &1u32.to_le_bytes(),      // part count
        &0u64.to_le_bytes(),      // first id of the range
        &u64::MAX.to_le_bytes(),  // last id of the range
        &0u32.to_le_bytes(),      // flags
    ]
    .concat();
    let meta_crc = crc32fast::hash(&[&index[..], &shards, &footer_fields].concat());
    let expected: Vec<u8> = [
        &b"QLIST002"[..],
        &record,
        &block_crc.to_le_bytes(),
        &index,
        &shards,
        &footer_fields,
        &meta_crc.to_le_bytes(),
        b"QLIST002",
    ]
    .concat();
    assert_eq!(bytes, expected);
    assert_eq!(bytes.len(), 8 + 34 + 32 + 32 + 72);
}

#[test]
fn empty_run_bytes() {
    let bytes = write_run(&[], vec![], Part::WHOLE);
    assert_eq!(bytes.len() as u64, HEADER_LEN + FOOTER_LEN);
    let (meta, records) = read_run(&bytes).expect("read");
    assert!(records.is_empty() && meta.blocks.is_empty() && meta.shards.is_empty());
    assert_eq!(meta.part(), Part::WHOLE);
}

fn sample(n: u64, payload: usize) -> Vec<Record> {
    (0..n)
        .map(|i| rec(10 + i * 3, (i % 3) as u32, i / 3, &vec![i as u8; payload]))
        .collect()
}

fn sample_specs(n: u64) -> Vec<ShardSpec> {
    (0..3)
        .map(|s| spec(s, (n + 2 - u64::from(s)) / 3))
        .collect()
}

#[test]
fn round_trip_many_blocks_and_ranges() {
    let n = 20_000;
    let records = sample(n, 100);
    let bytes = write_run(&records, sample_specs(n), Part::WHOLE);
    let (meta, back) = read_run(&bytes).expect("read");
    assert_eq!(back, records);
    assert!(meta.blocks.len() > 5, "{} blocks", meta.blocks.len());
    assert!(
        meta.shards.iter().all(|s| s.complete()),
        "{:?}",
        meta.shards
    );
    // A range finds exactly the blocks that may hold it.
    let (lo, hi) = (records[5000].id, records[5001].id);
    let blocks = meta.blocks_in(lo, hi);
    assert!(!blocks.is_empty() && blocks.len() <= 2);
    assert!(blocks[0].first_id <= lo && blocks[blocks.len() - 1].last_id >= hi);
    assert!(meta.blocks_in(0, 9).is_empty());
    assert!(meta.blocks_in(u64::MAX, u64::MAX).is_empty());
    assert_eq!(meta.blocks_in(0, u64::MAX).len(), meta.blocks.len());
}

#[test]
fn sealing_twice_gives_the_same_bytes() {
    let records = sample(3000, 50);
    let a = write_run(&records, sample_specs(3000), Part::WHOLE);
    let b = write_run(&records, sample_specs(3000), Part::WHOLE);
    assert_eq!(a, b);
}

#[test]
fn writer_refuses_what_breaks_the_rules() {
    let part = Part {
        index: 1,
        count: 2,
        first_id: 100,
        last_id: 199,
    };
    let mut w = RunWriter::new(Vec::new(), vec![spec(0, 10)], part).expect("new");
    let e = w.write(&rec(99, 0, 0, b"")).expect_err("below the range");
    assert!(e.to_string().contains("outside part 1/2"), "{e}");
    w.write(&rec(100, 0, 3, b""))
        .expect("a part may start mid-shard");
    let e = w.write(&rec(100, 0, 4, b"")).expect_err("repeat id");
    assert!(e.to_string().contains("strictly increase"), "{e}");
    let e = w.write(&rec(101, 0, 5, b"")).expect_err("seq gap");
    assert!(e.to_string().contains("missing or repeated"), "{e}");
    let e = w.write(&rec(102, 7, 0, b"")).expect_err("unknown shard");
    assert!(e.to_string().contains("shard 7 is not among"), "{e}");
    let e = w
        .write(&rec(103, 0, 10, b""))
        .expect_err("seq beyond total");
    assert!(e.to_string().contains("beyond its 10 items"), "{e}");
    // A whole list must hold all of each shard.
    let mut w = RunWriter::new(Vec::new(), vec![spec(0, 2)], Part::WHOLE).expect("new");
    w.write(&rec(1, 0, 0, b"")).expect("write");
    let e = w.finish().expect_err("incomplete");
    assert!(
        matches!(
            e,
            RunError::Incomplete {
                shard: 0,
                count: 1,
                total: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_part_records_its_range_and_partial_shards() {
    let part = Part {
        index: 2,
        count: 4,
        first_id: 50,
        last_id: 60,
    };
    let bytes = write_run(&[rec(55, 1, 7, b"x")], vec![spec(0, 3), spec(1, 9)], part);
    let (meta, _) = read_run(&bytes).expect("read");
    assert_eq!(meta.part(), part);
    assert_eq!(
        meta.shards,
        vec![
            ShardEntry {
                shard: 0,
                finished: true,
                first_seq: 0,
                count: 0,
                total: 3
            },
            ShardEntry {
                shard: 1,
                finished: true,
                first_seq: 7,
                count: 1,
                total: 9
            },
        ]
    );
    assert!(!meta.shards[1].complete());
}

/// Every single-bit flip of a small run is caught by the metadata or a block check.
#[test]
fn every_single_bit_flip_is_detected() {
    let records = [rec(1, 0, 0, b"a"), rec(2, 1, 0, b""), rec(9, 0, 1, b"xyz")];
    let good = write_run(&records, vec![spec(0, 2), spec(1, 1)], Part::WHOLE);
    assert!(read_run(&good).is_ok());
    for pos in 0..good.len() {
        for bit in 0..8 {
            let mut b = good.clone();
            b[pos] ^= 1 << bit;
            // The leading magic is not read by a tail reader; the merger checks it
            // when it sniffs the version, so count it here too.
            let caught = read_run(&b).is_err() || b[..8] != MAGIC;
            assert!(caught, "flip of bit {bit} of byte {pos} went unnoticed");
        }
    }
}

#[test]
fn truncation_and_a_lying_footer_are_caught() {
    let good = write_run(&sample(500, 10), sample_specs(500), Part::WHOLE);
    for cut in [1usize, 12, 72, 100, good.len() - 79, good.len() - 1] {
        let t = &good[..good.len() - cut];
        assert!(read_run(t).is_err(), "cutting {cut} bytes went unnoticed");
    }
    let e = read_run(&good[..40]).expect_err("short");
    assert!(matches!(e, RunError::TooShort { len: 40, .. }), "{e}");
    // A block count that does not fit the file is refused before anything is allocated.
    let mut b = good.clone();
    let at = b.len() - 72 + 8;
    b[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let e = read_run(&b).expect_err("huge count");
    assert!(e.to_string().contains("does not fit"), "{e}");
}

#[test]
fn a_bad_block_names_its_offset() {
    let good = write_run(&sample(5000, 100), sample_specs(5000), Part::WHOLE);
    let meta = RunMeta::decode(good.len() as u64, &good).expect("meta");
    let b = meta.blocks[1];
    let mut bytes = good[b.range().start as usize..b.range().end as usize].to_vec();
    bytes[100] ^= 4;
    let e = decode_block(&bytes, &b, 1).expect_err("flip");
    assert!(
        matches!(e, RunError::BlockChecksum { block: 1, offset, .. } if offset == b.offset + u64::from(b.len) - 4),
        "{e}"
    );
}

#[test]
fn seq_check_across_runs() {
    let mut c = SeqCheck::new(vec![spec(3, 4), spec(1, 2)]);
    c.see(1, 0).expect("first");
    c.see(3, 0).expect("first");
    c.see(3, 1).expect("next");
    let e = c.see(3, 3).expect_err("gap");
    assert!(e.contains("seq 3 follows seq 1"), "{e}");
    let t = c.table();
    assert_eq!(t.iter().map(|s| s.shard).collect::<Vec<_>>(), vec![1, 3]);
    assert_eq!((t[1].first_seq, t[1].count), (0, 2));
}

/// Blocks end where the list's record bytes reach a multiple of the target: so a range
/// written apart from its boundary on, and joined, gives the bytes of the whole list.
#[test]
fn a_range_written_apart_joins_into_the_same_bytes() {
    let n = 20_000;
    // Payloads of mixed sizes, so no block holds a round number of records.
    let records: Vec<Record> = (0..n)
        .map(|i| {
            let len = 50 + (i * 7919 % 300) as usize;
            rec(10 + i * 3, (i % 3) as u32, i / 3, &vec![i as u8; len])
        })
        .collect();
    let whole = write_run(&records, sample_specs(n), Part::WHOLE);
    let (meta, _) = read_run(&whole).expect("read");
    assert!(meta.blocks.len() > 10, "{} blocks", meta.blocks.len());
    let target = BLOCK_TARGET as u64;
    let mut position = 0u64;
    for b in &meta.blocks {
        let body = u64::from(b.len) - BLOCK_CRC_LEN;
        position += body;
        if b.offset + u64::from(b.len) < meta.footer.index_offset {
            // Every block but the last ends at the first record that reaches a multiple.
            assert!(position / target > (position - body) / target, "{b:?}");
        }
    }
    // Cut after block 4: the second range starts at its boundary.
    let cut = &meta.blocks[5];
    let start = RangeStart {
        offset: cut.offset,
        position: meta.blocks[..5]
            .iter()
            .map(|b| u64::from(b.len) - BLOCK_CRC_LEN)
            .sum(),
    };
    assert_eq!(
        start.offset,
        HEADER_LEN + start.position + BLOCK_CRC_LEN * (start.position / target),
        "a boundary's offset follows from its position alone"
    );
    let split = records
        .iter()
        .position(|r| r.id == cut.first_id)
        .expect("cut");
    let range = Part {
        index: 1,
        count: 2,
        first_id: cut.first_id,
        last_id: u64::MAX,
    };
    let mut tail = RunWriter::range(Vec::new(), sample_specs(n), range, start);
    for r in &records[split..] {
        tail.write(r).expect("write");
    }
    let (tail_bytes, written) = tail.finish_range(start).expect("finish range");
    let mut head = RunWriter::new(Vec::new(), sample_specs(n), Part::WHOLE).expect("new");
    for r in &records[..split] {
        head.write(r).expect("write");
    }
    head.join_range(&written, Some(&mut &tail_bytes[..]))
        .expect("join");
    let (joined, _) = head.finish().expect("finish");
    assert!(joined == whole, "a joined range changed the bytes");
    // A range that does not start where the list before it ends is refused.
    let mut early = RunWriter::new(Vec::new(), sample_specs(n), Part::WHOLE).expect("new");
    for r in &records[..split - 1] {
        early.write(r).expect("write");
    }
    let err = early
        .join_range(&written, Some(&mut &tail_bytes[..]))
        .expect_err("misplaced range");
    assert!(err.to_string().contains("starts at"), "{err}");
}

/// Records written as encoded stretches, through borrowed records, or one by one: the
/// same bytes, and the same refusals.
#[test]
fn stretches_and_borrowed_records_write_what_records_write() {
    let n = 5_000;
    let records = sample(n, 90);
    let whole = write_run(&records, sample_specs(n), Part::WHOLE);
    let mut encoded = Vec::new();
    for r in &records {
        crate::record::encode_record(r, &mut encoded);
    }
    let mut w = RunWriter::new(Vec::new(), sample_specs(n), Part::WHOLE).expect("new");
    // Uneven stretches, crossing block boundaries.
    let mut rest = &encoded[..];
    let mut k = 1;
    while !rest.is_empty() {
        let len: usize = BlockRecords::new(rest)
            .take(k)
            .map(|r| r.encoded.len())
            .sum();
        w.write_encoded(&rest[..len]).expect("stretch");
        rest = &rest[len..];
        k = k * 3 % 997 + 1;
    }
    assert!(w.finish().expect("finish").0 == whole);
    let mut w = RunWriter::new(Vec::new(), sample_specs(n), Part::WHOLE).expect("new");
    for r in BlockRecords::new(&encoded) {
        w.write_ref(&r).expect("write_ref");
    }
    assert!(w.finish().expect("finish").0 == whole);
    // A seq gap inside a stretch is refused, naming the record.
    let mut gap = Vec::new();
    for r in [rec(1, 0, 0, b"a"), rec(2, 0, 2, b"b")] {
        crate::record::encode_record(&r, &mut gap);
    }
    let mut w = RunWriter::new(Vec::new(), vec![spec(0, 3)], Part::WHOLE).expect("new");
    let err = w.write_encoded(&gap).expect_err("gap");
    assert!(err.to_string().contains("seq 2 follows seq 0"), "{err}");
}

/// `check_block` finds what `decode_block` finds, without copying a record.
#[test]
fn check_block_refuses_what_decode_block_refuses() {
    let records = sample(20_000, 40);
    let bytes = write_run(&records, sample_specs(20_000), Part::WHOLE);
    let (meta, _) = read_run(&bytes).expect("read");
    let b = meta.blocks[1];
    let r = b.range();
    let mut block = bytes[r.start as usize..r.end as usize].to_vec();
    let body = check_block(&block, &b, 1).expect("good block");
    assert_eq!(
        BlockRecords::new(body).count() as u32,
        b.records,
        "the body walks to every record"
    );
    block[30] ^= 1;
    let a = check_block(&block, &b, 1).expect_err("flip").to_string();
    let d = decode_block(&block, &b, 1).expect_err("flip").to_string();
    assert_eq!(a, d);
    assert!(a.contains("checksum mismatch"), "{a}");
}

/// A segment holds seqs a..b of one shard: its entry says so, and nothing else passes.
#[test]
fn a_segment_holds_exactly_its_seq_range() {
    let records: Vec<Record> = (5..9).map(|s| rec(100 + s, 3, s, b"x")).collect();
    let mut w = RunWriter::segment(Vec::new(), 3, 5, 9).expect("new");
    for r in &records {
        w.write(r).expect("write");
    }
    let (bytes, _) = w.finish().expect("finish");
    let (meta, back) = read_run(&bytes).expect("read");
    assert_eq!(back, records);
    assert!(meta.part().is_whole());
    assert_eq!(
        meta.shards,
        vec![ShardEntry {
            shard: 3,
            finished: false,
            first_seq: 5,
            count: 4,
            total: 9,
        }]
    );
    // A seq missing at either end, or one beyond, is refused.
    for (from, to) in [(5u64, 8u64), (6, 9)] {
        let mut w = RunWriter::segment(Vec::new(), 3, 5, 9).expect("new");
        for r in records.iter().filter(|r| (from..to).contains(&r.seq)) {
            w.write(r).expect("write");
        }
        let e = w.finish().expect_err("incomplete segment refused");
        assert!(matches!(e, RunError::Incomplete { shard: 3, .. }), "{e}");
    }
    let mut w = RunWriter::segment(Vec::new(), 3, 5, 9).expect("new");
    let e = w
        .write(&rec(200, 3, 9, b"x"))
        .expect_err("beyond the segment");
    assert!(e.to_string().contains("beyond its 9 items"), "{e}");
}

/// A follower's part learns its range and totals as it grows: restated before finish.
#[test]
fn restate_narrows_the_part_and_sets_totals() {
    let open = Part::follow(2, 10, u64::MAX);
    let unknown = |total| vec![spec(0, total), spec(1, total)];
    let mut w = RunWriter::new(Vec::new(), unknown(u64::MAX), open).expect("new");
    for r in [
        rec(11, 0, 4, b"a"),
        rec(12, 1, 0, b"b"),
        rec(15, 0, 5, b"c"),
    ] {
        w.write(&r).expect("write");
    }
    assert_eq!(w.last_id(), Some(15));
    let e = w
        .restate(Part::follow(2, 10, 14), unknown(6))
        .expect_err("a record above the new range");
    assert!(matches!(e, RunError::Restate { .. }), "{e}");
    let e = w
        .restate(Part::follow(2, 10, 20), unknown(5))
        .expect_err("a total below a seq written");
    assert!(e.to_string().contains("shard 0: seqs up to 6"), "{e}");
    let e = w
        .restate(Part::follow(2, 10, 20), vec![spec(0, 6)])
        .expect_err("a shard dropped");
    assert!(e.to_string().contains("the same"), "{e}");
    let specs = vec![
        spec(0, 6),
        ShardSpec {
            shard: 1,
            finished: false,
            total: 1,
        },
    ];
    w.restate(Part::follow(2, 10, 20), specs).expect("fits");
    let (bytes, _) = w.finish().expect("finish");
    let (meta, _) = read_run(&bytes).expect("read");
    assert_eq!(meta.part(), Part::follow(2, 10, 20));
    assert!(meta.part().is_follow() && !meta.part().is_whole());
    assert_eq!(meta.part().to_string(), "follow part 2");
    assert_eq!((meta.shards[0].first_seq, meta.shards[0].count), (4, 2));
    assert_eq!((meta.shards[1].total, meta.shards[1].finished), (1, false));
}

#[test]
fn a_segment_holds_exactly_its_seqs() {
    let recs: Vec<Record> = (5..9).map(|seq| rec(100 + seq, 2, seq, b"p")).collect();
    let mut w = RunWriter::segment(Vec::new(), 2, 5, 9).expect("new");
    for r in &recs {
        w.write(r).expect("write");
    }
    let (bytes, meta) = w.finish().expect("finish");
    let entry = *meta.shard(2).expect("entry");
    assert_eq!(
        (entry.first_seq, entry.count, entry.total, entry.finished),
        (5, 4, 9, false)
    );
    let (read, got) = read_run(&bytes).expect("read");
    assert_eq!(read.shards, meta.shards);
    assert_eq!(got, recs);
    // A segment from 0 is a run of the shard's first items.
    let mut w = RunWriter::segment(Vec::new(), 2, 0, 1).expect("new");
    w.write(&rec(7, 2, 0, b"p")).expect("write");
    assert!(w.finish().is_ok());
    // Too few, a late start, or a seq beyond its end are refused.
    for (first, end, seqs) in [(5u64, 9u64, 5..8u64), (5, 9, 6..9), (5, 9, 4..9)] {
        let mut w = RunWriter::segment(Vec::new(), 2, first, end).expect("new");
        let wrote = seqs
            .map(|seq| w.write(&rec(100 + seq, 2, seq, b"p")))
            .collect::<Result<Vec<_>, _>>();
        assert!(wrote.is_err() || w.finish().is_err(), "{first}..{end}");
    }
}

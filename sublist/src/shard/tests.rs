use super::*;

/// The tests' shorthand for a record holding a copy of `payload`.
fn rec(id: u64, shard: u32, seq: u64, payload: &[u8]) -> Record {
    Record {
        id,
        shard,
        seq,
        payload: payload.to_vec(),
    }
}

fn prog(next_seq: u64, last_id: u64, finished: bool) -> ProgressMarker {
    ProgressMarker {
        next_seq,
        finished,
        last_id,
        fingerprint: b"fp".to_vec(),
    }
}

#[test]
fn write_then_read_in_id_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut w = ShardWriter::open(dir.path(), 3).expect("open writer");
        assert_eq!(w.progress().expect("progress"), None);
        // IDs whose little-endian order differs from numeric order.
        let batch1 = vec![rec(255, 3, 0, b"a"), rec(256, 3, 1, b"")];
        w.write_batch(&batch1, &prog(2, 256, false))
            .expect("batch 1");
        let batch2 = vec![rec(1 << 40, 3, 2, &[0, 10, 255])];
        w.write_batch(&batch2, &prog(3, 1 << 40, false))
            .expect("batch 2");
        w.write_batch(&[], &prog(3, 1 << 40, true)).expect("finish");
    }
    let r = ShardReader::open(&shard_db_path(dir.path(), 3)).expect("open reader");
    assert_eq!(r.shard(), 3);
    let all: Vec<Record> = r.iter().collect::<Result<_, _>>().expect("iterate");
    assert_eq!(
        all,
        vec![
            rec(255, 3, 0, b"a"),
            rec(256, 3, 1, b""),
            rec(1 << 40, 3, 2, &[0, 10, 255])
        ]
    );
    assert_eq!(
        r.progress().expect("progress"),
        Some(prog(3, 1 << 40, true))
    );
    drop(r);
    // Reopening for writing keeps the progress.
    let w = ShardWriter::open(dir.path(), 3).expect("reopen");
    assert_eq!(
        w.progress().expect("progress"),
        Some(prog(3, 1 << 40, true))
    );
    // The writer reads from an ID on: the first item at or above it, then the rest.
    let from = |id: u64| -> Vec<u64> {
        w.items_from(id)
            .map(|r| r.expect("item").seq)
            .collect::<Vec<_>>()
    };
    assert_eq!(from(0), [0, 1, 2]);
    assert_eq!(from(256), [1, 2]);
    assert_eq!(from(257), [2]);
    assert_eq!(from(u64::MAX), Vec::<u64>::new());
}

/// Shard 0 in `dir`, finished with IDs 10, 11 and 12 (seqs 0 to 2), then the items
/// `lost` deleted behind the writer's back; opened for reading.
fn finished_then_lost(dir: &Path, lost: &[u64]) -> ShardReader {
    {
        let mut w = ShardWriter::open(dir, 0).expect("open writer");
        let batch = vec![
            rec(10, 0, 0, b"a"),
            rec(11, 0, 1, b"b"),
            rec(12, 0, 2, b"c"),
        ];
        w.write_batch(&batch, &prog(3, 12, true)).expect("batch");
        for &id in lost {
            w.db.delete(encode_key(id)).expect("delete");
        }
    }
    ShardReader::open(&shard_db_path(dir, 0)).expect("open reader")
}

#[test]
fn a_lost_item_is_a_seq_gap_the_reader_reports() {
    let dir = tempfile::tempdir().expect("tempdir");
    // What a lost write would leave: item 1 gone.
    let r = finished_then_lost(dir.path(), &[11]);
    let err = r.iter().collect::<Result<Vec<_>, _>>().expect_err("a gap");
    assert!(
        err.to_string().contains("item 12 has seq 2, 1 expected"),
        "{err}"
    );
}

#[test]
fn a_lost_tail_is_reported_after_the_last_item() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The last items gone: no gap in what is left, only fewer than promised.
    let r = finished_then_lost(dir.path(), &[12, 11]);
    let items: Vec<_> = r.iter().collect();
    assert_eq!(items.len(), 2, "the item that is there, then the error");
    assert_eq!(items[0].as_ref().expect("item 0").id, 10);
    let err = items[1].as_ref().expect_err("a lost tail");
    assert!(
        err.to_string()
            .contains("1 items, the progress marker says 3"),
        "{err}"
    );
}

#[test]
fn an_item_beyond_the_marker_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut w = ShardWriter::open(dir.path(), 0).expect("open writer");
        w.write_batch(&[rec(10, 0, 0, b"a")], &prog(1, 10, true))
            .expect("batch");
        // An item the marker does not cover (written behind the writer's back).
        w.db.put(encode_key(11), encode_value(0, 1, b"x"))
            .expect("put");
    }
    let r = ShardReader::open(&shard_db_path(dir.path(), 0)).expect("open reader");
    let err = r
        .iter()
        .collect::<Result<Vec<_>, _>>()
        .expect_err("beyond the marker");
    assert!(
        err.to_string()
            .contains("item 11 has seq 1, beyond the progress marker's 1 items"),
        "{err}"
    );
}

#[test]
fn a_creation_killed_halfway_is_completed() {
    let dir = tempfile::tempdir().expect("tempdir");
    // What a kill between RocksDB's creation of `default` and of `meta` leaves behind.
    drop(DB::open_default(dir.path().join(".creating-shard-4")).expect("half-made db"));
    let mut w = ShardWriter::open(dir.path(), 4).expect("open completes the creation");
    w.write_batch(&[rec(1, 4, 0, b"p")], &prog(1, 1, false))
        .expect("write");
    drop(w);
    assert!(!dir.path().join(".creating-shard-4").exists());
    let r = ShardReader::open(&shard_db_path(dir.path(), 4)).expect("reader");
    assert_eq!((r.shard(), r.iter().count()), (4, 1));
}

#[test]
fn invalid_batches_write_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = ShardWriter::open(dir.path(), 0).expect("open");
    w.write_batch(&[rec(10, 0, 0, b"x")], &prog(1, 10, false))
        .expect("first");
    let bad: Vec<(Vec<Record>, ProgressMarker)> = vec![
        (vec![rec(10, 0, 1, b"")], prog(2, 10, false)), // id not above last
        (vec![rec(11, 1, 1, b"")], prog(2, 11, false)), // wrong shard
        (vec![rec(11, 0, 2, b"")], prog(3, 11, false)), // seq gap
        (
            vec![rec(12, 0, 1, b""), rec(11, 0, 2, b"")],
            prog(3, 11, false),
        ), // descending
        (vec![rec(11, 0, 1, b"")], prog(5, 11, false)), // progress lies
    ];
    for (records, p) in bad {
        let e = w.write_batch(&records, &p).expect_err("must refuse");
        assert!(matches!(e, ShardError::InvalidBatch { .. }), "{e}");
        assert!(e.to_string().contains("shard-0"), "{e}");
    }
    w.write_batch(&[], &prog(1, 10, true)).expect("finish");
    assert!(w
        .write_batch(&[rec(11, 0, 1, b"")], &prog(2, 11, false))
        .is_err());
    drop(w);
    let r = ShardReader::open(&shard_db_path(dir.path(), 0)).expect("reader");
    assert_eq!(r.iter().count(), 1);
}

#[test]
fn wrong_shard_lock_and_non_shards_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let w = ShardWriter::open(dir.path(), 1).expect("open");
    // Second writer on the same db: the lock.
    let e = ShardWriter::open(dir.path(), 1).err().expect("locked");
    assert!(matches!(e, ShardError::InUse { .. }), "{e}");
    assert!(e.to_string().contains("in use by another producer"), "{e}");
    // The reader works while the writer holds the lock.
    assert_eq!(
        ShardReader::open(w.path())
            .expect("reader while writing")
            .iter()
            .count(),
        0
    );
    drop(w);

    // A shard-1 database renamed to shard-2.
    std::fs::rename(shard_db_path(dir.path(), 1), shard_db_path(dir.path(), 2)).expect("rename");
    let e = ShardWriter::open(dir.path(), 2).err().expect("wrong shard");
    assert!(
        matches!(
            e,
            ShardError::WrongShard {
                expected: 2,
                found: 1,
                ..
            }
        ),
        "{e}"
    );

    // A file where the db should be.
    std::fs::write(shard_db_path(dir.path(), 5), b"hello").expect("write file");
    let e = ShardWriter::open(dir.path(), 5).err().expect("file");
    assert!(matches!(e, ShardError::NotAShard { .. }), "{e}");
    assert!(matches!(
        ShardReader::open(&shard_db_path(dir.path(), 5)),
        Err(ShardError::NotAShard { .. })
    ));

    // A foreign non-empty directory.
    std::fs::create_dir(shard_db_path(dir.path(), 6)).expect("mkdir");
    std::fs::write(shard_db_path(dir.path(), 6).join("x"), b"x").expect("write");
    assert!(matches!(
        ShardWriter::open(dir.path(), 6),
        Err(ShardError::NotAShard { .. })
    ));

    // A plain RocksDB database without our metadata.
    let plain = dir.path().join("plain");
    drop(DB::open_default(&plain).expect("plain db"));
    let e = ShardReader::open(&plain).err().expect("plain");
    assert!(matches!(e, ShardError::NotAShard { .. }), "{e}");

    // Missing path: the reader never creates.
    assert!(matches!(
        ShardReader::open(&dir.path().join("nope")),
        Err(ShardError::Missing { .. })
    ));
    assert!(!dir.path().join("nope").exists());

    // The data dir is a file.
    let f = dir.path().join("afile");
    std::fs::write(&f, b"x").expect("write");
    let e = ShardWriter::open(&f, 0).err().expect("data dir is a file");
    assert!(e.to_string().contains("afile"), "{e}");
}

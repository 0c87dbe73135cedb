use super::*;
use crate::record::rec;
use std::io::Cursor;

fn write_file(dir: &Path, records: &[Record]) -> PathBuf {
    let path = dir.join("list.bin");
    let mut w = ListWriter::create(&path).expect("create");
    for r in records {
        w.write(r).expect("write");
    }
    w.finish().expect("finish");
    path
}

fn sample() -> Vec<Record> {
    vec![
        rec(1, 0, 0, b"a"),
        rec(2, 1, 0, b""),
        rec(0x0102_0304_0506_0708, 7, 9, b"xyz"),
    ]
}

fn read_all(bytes: &[u8]) -> Result<Vec<Record>, ListError> {
    ListReader::new(Cursor::new(bytes), bytes.len() as u64)?.collect()
}

/// The message chain as `anyhow`'s `{:#}` prints it: each error, then its sources.
fn printed_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

#[test]
fn each_cause_is_printed_once() {
    let enospc = "No space left on device (os error 28)";
    let errors = [
        io_err(Path::new("/out/.list.bin.x.tmp"), "write record")(io::Error::from_raw_os_error(28)),
        ListError::NotDurable {
            path: PathBuf::from("/out/list.bin"),
            dir: PathBuf::from("/out"),
            error: io::Error::from_raw_os_error(28),
        },
    ];
    for e in errors {
        let printed = printed_chain(&e);
        assert_eq!(printed.matches(enospc).count(), 1, "{printed}");
        assert!(printed.contains("/out"), "{printed}");
    }
}

#[test]
fn a_failed_directory_fsync_says_the_list_is_there() {
    let e = ListError::NotDurable {
        path: PathBuf::from("/out/list.bin"),
        dir: PathBuf::from("/out"),
        error: io::Error::other("EIO"),
    };
    let msg = e.to_string();
    assert!(
        msg.contains("/out/list.bin is complete")
            && msg.contains("directory /out")
            && msg.contains("EIO"),
        "{msg}"
    );
}

#[test]
fn exact_file_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_file(dir.path(), &[rec(5, 1, 0, b"ab")]);
    let bytes = std::fs::read(&path).expect("read");
    let record: Vec<u8> = [
        &5u64.to_le_bytes()[..],
        &1u32.to_le_bytes(),
        &0u64.to_le_bytes(),
        &2u64.to_le_bytes(),
        b"ab",
    ]
    .concat();
    let crc = crc32fast::hash(&record);
    let expected: Vec<u8> = [
        &b"QLIST001"[..],
        &1u64.to_le_bytes(),
        &record,
        &crc.to_le_bytes(),
    ]
    .concat();
    assert_eq!(bytes, expected);
    // zlib's crc32 of "123456789" is the standard check value: the footer uses IEEE CRC-32.
    assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
}

#[test]
fn empty_list_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_file(dir.path(), &[]);
    let bytes = std::fs::read(&path).expect("read");
    assert_eq!(bytes, [&b"QLIST001"[..], &[0u8; 8], &[0u8; 4]].concat());
    let s = verify(&path).expect("verify");
    assert_eq!(
        s,
        Summary {
            records: 0,
            file_bytes: 20,
            payload_bytes: 0,
            first_id: None,
            last_id: None,
            checksum: 0
        }
    );
}

#[test]
fn round_trip_and_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let records = sample();
    let path = write_file(dir.path(), &records);
    let back: Vec<Record> = ListReader::open(&path)
        .expect("open")
        .collect::<Result<_, _>>()
        .expect("read");
    assert_eq!(back, records);
    let s = verify(&path).expect("verify");
    assert_eq!(s.records, 3);
    assert_eq!(s.payload_bytes, 4);
    assert_eq!(s.file_bytes, std::fs::metadata(&path).expect("stat").len());
    assert_eq!(s.first_id, Some(1));
    assert_eq!(s.last_id, Some(0x0102_0304_0506_0708));
    // Only list.bin remains: the temporary file was renamed, not copied.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("list.bin")]);
}

#[test]
fn writer_refuses_out_of_order_and_cleans_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("list.bin");
    let mut w = ListWriter::create(&path).expect("create");
    w.write(&rec(2, 0, 0, b"")).expect("write");
    let err = w
        .write(&rec(2, 1, 0, b""))
        .expect_err("duplicate id must fail");
    assert!(
        matches!(err, ListError::WriteOrder { prev: 2, id: 2 }),
        "{err}"
    );
    drop(w);
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("ls").count(),
        0,
        "temporary file left behind"
    );
}

#[test]
fn writer_missing_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = ListWriter::create(&dir.path().join("nope/list.bin"))
        .err()
        .expect("must fail");
    assert!(matches!(err, ListError::MissingDir { .. }));
    assert!(err.to_string().contains("does not exist"), "{err}");
}

fn good_bytes() -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::read(write_file(dir.path(), &sample())).expect("read")
}

// Offsets in `good_bytes`: header 0..16, record 0 at 16 (29 bytes), record 1 at 45
// (28 bytes), record 2 at 73 (31 bytes), footer at 104, length 108.
#[test]
fn corruption_flip_payload_is_checksum_error() {
    let mut b = good_bytes();
    assert_eq!(b.len(), 108);
    b[16 + 28] ^= 0x01;
    let err = read_all(&b).expect_err("corrupt");
    assert!(
        matches!(err, ListError::Checksum { offset: 104, .. }),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("byte 104: checksum mismatch"),
        "{err}"
    );
}

#[test]
fn corruption_flip_checksum() {
    let mut b = good_bytes();
    b[105] ^= 0x80;
    assert!(matches!(
        read_all(&b),
        Err(ListError::Checksum { offset: 104, .. })
    ));
}

#[test]
fn corruption_id_out_of_order() {
    let mut b = good_bytes();
    b[45] = 0; // record 1's id becomes 0, below record 0's id 1
    let err = read_all(&b).expect_err("corrupt");
    assert!(
        matches!(
            err,
            ListError::OutOfOrder {
                offset: 45,
                index: 1,
                prev: 1,
                id: 0
            }
        ),
        "{err}"
    );
}

#[test]
fn corruption_lying_payload_length_does_not_allocate() {
    let mut b = good_bytes();
    // Longer than what is left of the file, within the format's limit.
    b[16 + 20..16 + 28].copy_from_slice(&1000u64.to_le_bytes());
    let err = read_all(&b).expect_err("corrupt");
    assert!(
        matches!(
            err,
            ListError::Truncated {
                offset: 16,
                index: 0,
                what: "payload",
                need: 1000,
                have: 60
            }
        ),
        "{err}"
    );
    // Above the format's limit: refused before looking at the file size, so even a
    // multi-GB list.bin cannot make a reader allocate it.
    b[16 + 20..16 + 28].copy_from_slice(&u64::MAX.to_le_bytes());
    let err = read_all(&b).expect_err("corrupt");
    assert!(
        matches!(
            err,
            ListError::PayloadTooLong {
                offset: 16,
                index: 0,
                len: u64::MAX,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("corrupt length"), "{err}");
}

#[test]
fn corruption_truncated() {
    let b = good_bytes();
    for cut in [1usize, 4, 5, 40, 88] {
        let t = &b[..b.len() - cut];
        assert!(
            read_all(t).is_err(),
            "truncating {cut} bytes went unnoticed"
        );
    }
    let err = read_all(&b[..107]).expect_err("corrupt");
    assert!(
        matches!(
            err,
            ListError::Truncated {
                offset: 73,
                index: 2,
                what: "payload",
                need: 3,
                have: 2
            }
        ),
        "{err}"
    );
    let err = read_all(&b[..10]).expect_err("corrupt");
    assert!(
        matches!(err, ListError::TooShort { len: 10, min: 20 }),
        "{err}"
    );
}

#[test]
fn corruption_bad_magic() {
    let mut b = good_bytes();
    b[7] = b'2';
    let err = read_all(&b).expect_err("corrupt");
    assert!(matches!(err, ListError::BadMagic { .. }), "{err}");
    assert!(err.to_string().contains("QLIST002"), "{err}");
}

#[test]
fn corruption_count_lies() {
    let mut b = good_bytes();
    b[8] = 4;
    let err = read_all(&b).expect_err("corrupt");
    assert!(
        matches!(
            err,
            ListError::CountMismatch {
                offset: 104,
                header: 4,
                found: 3,
                extra: 0
            }
        ),
        "{err}"
    );
    b[8] = 2;
    let err = read_all(&b).expect_err("corrupt");
    assert!(
        matches!(
            err,
            ListError::CountMismatch {
                offset: 73,
                header: 2,
                found: 2,
                extra: 31
            }
        ),
        "{err}"
    );
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(read_all(&b), Err(ListError::CountMismatch { .. })));
}

#[test]
fn verify_reports_path_on_io_error() {
    let err = verify(Path::new("/definitely/not/here/list.bin")).expect_err("missing");
    assert!(
        err.to_string().contains("/definitely/not/here/list.bin"),
        "{err}"
    );
}

proptest::proptest! {
    #[test]
    fn prop_round_trip(ids in proptest::collection::btree_set(proptest::num::u64::ANY, 0..50),
                       payload in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
        let records: Vec<Record> = ids.iter().enumerate()
            .map(|(i, &id)| rec(id, i as u32 % 3, i as u64, &payload[..i % (payload.len() + 1)]))
            .collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_file(dir.path(), &records);
        let back: Vec<Record> = ListReader::open(&path).expect("open").collect::<Result<_, _>>().expect("read");
        proptest::prop_assert_eq!(back, records);
    }
}

/// Every one of the 108 * 8 = 864 single-bit flips of a small valid file, not a sample.
#[test]
fn every_single_bit_flip_is_detected() {
    let good = good_bytes();
    assert!(read_all(&good).is_ok());
    let mut checked = 0;
    for pos in 0..good.len() {
        for bit in 0..8 {
            let mut b = good.clone();
            b[pos] ^= 1 << bit;
            assert!(
                read_all(&b).is_err(),
                "flip of bit {bit} of byte {pos} went unnoticed"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 864, "the file is {} bytes", good.len());
}

#[test]
fn version_one_is_told_by_its_magic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v1 = write_file(dir.path(), &[rec(5, 1, 0, b"ab")]);
    assert!(is_version_one(&v1));
    let other = dir.path().join("run.bin");
    std::fs::write(&other, b"QLIST002 and more").expect("write");
    assert!(!is_version_one(&other));
    std::fs::write(&other, b"QLIST00").expect("write");
    assert!(!is_version_one(&other), "shorter than the magic");
    assert!(!is_version_one(&dir.path().join("missing.bin")));
}

//! The S3 paths against a real SeaweedFS server (`testkit::s3`; needs `weed`, see
//! `scripts/deps.sh`).

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use crate::{Location, S3Config, Store, StoreError, StoreOptions, S3_MIN_PART_SIZE};
use testkit::s3::TestS3;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8 ^ seed).collect()
}

fn store_for(s3: &TestS3, opts: StoreOptions) -> Store {
    let env: HashMap<String, String> = s3.env().into_iter().collect();
    let config = S3Config::from_vars(|k| env.get(k).cloned()).unwrap();
    Store::with_s3_config(opts, config)
}

fn small_opts() -> StoreOptions {
    StoreOptions {
        deadline: Duration::from_secs(20),
        read_chunk: 1000,
        in_flight: 2,
        max_gets: 4,
        part_size: S3_MIN_PART_SIZE,
    }
}

fn write_run(store: &Store, loc: &Location, data: &[u8]) {
    let mut up = store.create(loc).unwrap();
    up.write_all(data).unwrap();
    assert_eq!(up.finish().unwrap(), data.len() as u64);
}

#[test]
fn small_and_multipart_round_trips() {
    let s3 = TestS3::start("qstore-rt");
    let store = store_for(&s3, small_opts());
    let dir = Location::parse(&s3.url("runs")).unwrap();

    let small = pattern(10_000, 1);
    write_run(&store, &dir.join("a.bin"), &small);
    let big = pattern(2 * S3_MIN_PART_SIZE + 12_345, 2);
    write_run(&store, &dir.join("b.bin"), &big);
    assert_eq!(s3.multipart_uploads(), Vec::<String>::new());
    assert_eq!(s3.get("runs/b.bin").as_deref(), Some(&big[..]));
    // Not runs: hidden, other suffix, deeper.
    s3.put("runs/.a.bin.tmp.bin", b"x");
    s3.put("runs/notes.txt", b"x");
    s3.put("runs/sub/c.bin", b"x");

    let runs = store.list_runs(&dir).unwrap();
    assert_eq!(runs, vec![dir.join("a.bin"), dir.join("b.bin")]);
    assert!(store.list_runs(&dir.join("nothing")).unwrap().is_empty());

    let a = store.open(&dir.join("a.bin")).unwrap();
    assert_eq!(a.len(), 10_000);
    assert_eq!(a.read_range(10..20).unwrap(), &small[10..20]);
    let got: Vec<_> = a
        .read_ranges(vec![0..2500, 9000..10_000])
        .collect::<Result<_, _>>()
        .unwrap();
    let offsets: Vec<(u64, usize)> = got.iter().map(|(o, b)| (*o, b.len())).collect();
    assert_eq!(
        offsets,
        [(0, 1000), (1000, 1000), (2000, 500), (9000, 1000)]
    );
    // A range that starts between multiples of the read size: its first GET ends at the
    // next multiple, so every later one is aligned (as the server keeps the object).
    let got: Vec<_> = a
        .read_ranges(std::iter::once(1250..3600).collect())
        .collect::<Result<_, _>>()
        .unwrap();
    let offsets: Vec<(u64, usize)> = got.iter().map(|(o, b)| (*o, b.len())).collect();
    assert_eq!(offsets, [(1250, 750), (2000, 1000), (3000, 600)]);
    assert_eq!(got[1].1, &small[2000..3000]);

    let b = store.open(&dir.join("b.bin")).unwrap();
    let mut at = 0u64;
    let whole = 0..b.len();
    let reader = b.read_ranges(vec![whole]);
    for item in reader.take(50) {
        let (off, bytes) = item.unwrap();
        assert_eq!(off, at);
        assert_eq!(bytes, &big[off as usize..off as usize + bytes.len()]);
        at += bytes.len() as u64;
    }
    assert_eq!(at, 50_000, "dropping the reader early is fine");
}

#[test]
fn unfinished_multipart_upload_is_aborted() {
    let s3 = TestS3::start("qstore-abort");
    let store = store_for(&s3, small_opts());
    let loc = Location::parse(&s3.url("runs/x.bin")).unwrap();
    let mut up = store.create(&loc).unwrap();
    up.write_all(&pattern(S3_MIN_PART_SIZE + 10, 3)).unwrap();
    assert_eq!(s3.multipart_uploads().len(), 1, "a part was sent");
    drop(up);
    assert_eq!(s3.multipart_uploads(), Vec::<String>::new());
    assert_eq!(s3.keys("runs/"), Vec::<String>::new());
    assert!(!store.exists(&loc).unwrap());
}

#[test]
fn replaced_object_is_reported_as_changed() {
    let s3 = TestS3::start("qstore-changed");
    let store = store_for(&s3, small_opts());
    let loc = Location::parse(&s3.url("r.bin")).unwrap();
    write_run(&store, &loc, &pattern(5000, 4));
    let obj = store.open(&loc).unwrap();
    assert!(obj.etag().is_some());
    s3.put("r.bin", &pattern(5000, 5));
    let e = obj.read_range(0..100).unwrap_err();
    assert!(matches!(e, StoreError::Changed { .. }), "{e}");
    assert!(e.to_string().contains("s3://qstore-changed/r.bin"), "{e}");
}

#[test]
fn missing_and_refused() {
    let s3 = TestS3::start("qstore-refused");
    let store = store_for(&s3, small_opts());
    let loc = Location::parse(&s3.url("none.bin")).unwrap();
    assert!(!store.exists(&loc).unwrap());
    let e = store.open(&loc).unwrap_err();
    assert!(
        e.is_not_found() && e.to_string().contains("none.bin"),
        "{e}"
    );

    let secret = "SECRET-sentinel-123";
    let config = S3Config::new(testkit::s3::ACCESS_KEY, secret)
        .with_endpoint(&s3.endpoint())
        .with_allow_http(true);
    let bad = Store::with_s3_config(small_opts(), config);
    let t = Instant::now();
    let e = bad
        .list_runs(&Location::parse(&s3.url("")).unwrap())
        .unwrap_err();
    assert!(matches!(e, StoreError::Denied { .. }), "{e}");
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains(secret), "{shown}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "refusals are not retried"
    );
}

#[test]
fn reads_survive_a_server_restart() {
    let mut s3 = TestS3::start("qstore-restart");
    let store = store_for(&s3, small_opts());
    let loc = Location::parse(&s3.url("r.bin")).unwrap();
    let data = pattern(5000, 6);
    write_run(&store, &loc, &data);
    let obj = store.open(&loc).unwrap();
    s3.kill();
    let reader = std::thread::spawn(move || obj.read_range(100..4100));
    std::thread::sleep(Duration::from_secs(1));
    s3.restart();
    let got = reader.join().unwrap().unwrap();
    assert_eq!(got, &data[100..4100]);
}

#[test]
fn readers_with_more_reads_in_flight_than_the_store_allows_all_finish() {
    let s3 = TestS3::start("qstore-turns");
    // One GET at a time for the whole store, two in flight per reader, three readers.
    let store = store_for(
        &s3,
        StoreOptions {
            max_gets: 1,
            ..small_opts()
        },
    );
    let dir = Location::parse(&s3.url("runs")).unwrap();
    let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(7_000, 10 + i)).collect();
    for (i, d) in data.iter().enumerate() {
        write_run(&store, &dir.join(&format!("{i}.bin")), d);
    }
    let mut readers: Vec<_> = (0..3)
        .map(|i| {
            let object = store.open(&dir.join(&format!("{i}.bin"))).unwrap();
            object.read_ranges(std::iter::once(0..7_000).collect())
        })
        .collect();
    // Interleaved, as a merge consumes its inputs: each reader's next piece in turn.
    let mut got = vec![Vec::new(); 3];
    for _ in 0..7 {
        for (i, reader) in readers.iter_mut().enumerate() {
            let (off, bytes) = reader.next().unwrap().unwrap();
            assert_eq!(off as usize, got[i].len());
            got[i].extend_from_slice(&bytes);
        }
    }
    assert_eq!(got, data);
    assert!(readers.iter_mut().all(|r| r.next().is_none()));
}

#[test]
fn get_bodies_are_read_into_again_only_once_every_slice_is_dropped() {
    let s3 = TestS3::start("qstore-bodies");
    let store = store_for(&s3, small_opts());
    let loc = Location::parse(&s3.url("r.bin")).unwrap();
    let data = pattern(20_000, 7);
    write_run(&store, &loc, &data);
    let obj = store.open(&loc).unwrap();

    // Each piece dropped once checked: later GETs are read into its buffer.
    let mut seen = Vec::new();
    let mut reused = 0;
    for item in obj.read_ranges(std::iter::once(0..20_000).collect()) {
        let (off, bytes) = item.unwrap();
        assert_eq!(bytes, &data[off as usize..off as usize + bytes.len()]);
        reused += usize::from(seen.contains(&bytes.as_ptr()));
        seen.push(bytes.as_ptr());
    }
    assert_eq!(seen.len(), 20);
    assert!(
        reused >= 10,
        "only {reused} of 20 GETs were read into a used buffer"
    );

    // Every piece kept, and slices of them outliving the pieces: none is overwritten.
    let kept: Vec<_> = obj
        .read_ranges(std::iter::once(0..20_000).collect())
        .map(|item| {
            let (off, bytes) = item.unwrap();
            (off, bytes.slice(10..20))
        })
        .collect();
    let again: Vec<_> = obj
        .read_ranges(std::iter::once(0..20_000).collect())
        .collect::<Result<_, _>>()
        .unwrap();
    for (off, slice) in &kept {
        assert_eq!(slice, &data[*off as usize + 10..*off as usize + 20]);
    }
    assert_eq!(again.len(), 20);
}

/// The same small-object calls against a real server: names under a nested prefix, a
/// small object read whole with a cap, deletes (of a missing object too), and a
/// checkpoint-sized upload that is one PUT (no multipart upload left or made).
#[test]
fn small_objects_listing_and_removal() {
    let s3 = TestS3::start("qstore-small");
    let store = store_for(&s3, small_opts());
    let dest = Location::parse(&s3.url("pub")).unwrap();
    let segs = dest.join("segments/shard-3");
    assert!(store.list_names(&segs).unwrap().is_empty());
    store.make_dirs(&segs).unwrap();
    write_run(&store, &segs.join("b.seg"), b"bb");
    write_run(&store, &segs.join("a.seg"), b"a");
    s3.put("pub/segments/shard-3/.hidden", b"x");
    s3.put("pub/segments/shard-3/deeper/c.seg", b"x");
    assert_eq!(store.list_names(&segs).unwrap(), ["a.seg", "b.seg"]);

    let cp = dest.join("shard-3.checkpoint");
    let bytes = pattern(5000, 3);
    write_run(&store, &cp, &bytes);
    assert_eq!(s3.multipart_uploads(), Vec::<String>::new());
    assert_eq!(store.read_small(&cp, 5000).unwrap(), bytes);
    match store.read_small(&cp, 4999) {
        Err(StoreError::TooLarge {
            len: 5000,
            max: 4999,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(store
        .read_small(&dest.join("none"), 10)
        .unwrap_err()
        .is_not_found());

    store.delete(&segs.join("a.seg")).unwrap();
    store.delete(&segs.join("a.seg")).unwrap();
    assert_eq!(store.list_names(&segs).unwrap(), ["b.seg"]);
    assert_eq!(s3.get("pub/segments/shard-3/a.seg"), None);
}

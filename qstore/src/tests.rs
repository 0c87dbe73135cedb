//! Directory round trips, and S3 failures without a server (the happy S3 paths are tested
//! against a real SeaweedFS through `testkit::s3`).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::{Location, S3Config, Store, StoreError, StoreOptions};

const SECRET: &str = "SECRET-sentinel-123";
const TOKEN: &str = "TOKEN-sentinel-456";

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn write_run(store: &Store, loc: &Location, data: &[u8]) {
    let mut up = store.create(loc).unwrap();
    up.write_all(data).unwrap();
    assert_eq!(up.finish().unwrap(), data.len() as u64);
}

#[test]
fn dir_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        read_chunk: 1000,
        ..StoreOptions::default()
    };
    let store = Store::new(opts);
    let dir = Location::Dir(tmp.path().to_path_buf());
    let loc = dir.join("shard-0.bin");
    let data = pattern(10_000);
    write_run(&store, &loc, &data);
    assert_eq!(names(tmp.path()), ["shard-0.bin"], "no temporary file left");
    assert_eq!(store.list_runs(&dir).unwrap(), vec![loc.clone()]);
    assert!(store.exists(&loc).unwrap());

    let obj = store.open(&loc).unwrap();
    assert_eq!(obj.len(), 10_000);
    assert_eq!(obj.location(), &loc);
    assert_eq!(obj.read_range(100..200).unwrap(), &data[100..200]);
    assert_eq!(obj.read_range(0..0).unwrap().len(), 0);

    let got: Vec<(u64, bytes::Bytes)> = obj
        .read_ranges(vec![0..2500, 5000..5000, 7000..7100, 9999..10_000])
        .collect::<Result<_, _>>()
        .unwrap();
    let offsets: Vec<(u64, usize)> = got.iter().map(|(o, b)| (*o, b.len())).collect();
    assert_eq!(
        offsets,
        [(0, 1000), (1000, 1000), (2000, 500), (7000, 100), (9999, 1)]
    );
    for (off, bytes) in &got {
        assert_eq!(bytes, &data[*off as usize..*off as usize + bytes.len()]);
    }
}

/// A local read goes into a buffer handed out before only once its user has dropped every
/// copy: a buffer still held is never written again.
#[test]
fn local_reads_reuse_only_dropped_buffers() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(StoreOptions {
        read_chunk: 1000,
        ..StoreOptions::default()
    });
    let loc = Location::Dir(tmp.path().join("r.bin"));
    let data = pattern(10_000);
    write_run(&store, &loc, &data);
    let obj = store.open(&loc).unwrap();
    let check = |(off, bytes): &(u64, bytes::Bytes)| {
        assert_eq!(bytes, &data[*off as usize..*off as usize + bytes.len()]);
    };

    let mut reads = obj.read_ranges(vec![0..5000, 5000..10_000]);
    let first = reads.next().unwrap().unwrap();
    let first_at = first.1.as_ptr();
    drop(first);
    let second = reads.next().unwrap().unwrap();
    check(&second);
    assert_eq!(
        second.1.as_ptr(),
        first_at,
        "the dropped buffer is read into again"
    );
    let held = second.clone();
    drop(second);
    // Held: every later read goes elsewhere, and what it holds stays as read.
    let mut later = Vec::new();
    for read in reads {
        let read = read.unwrap();
        assert_ne!(
            read.1.as_ptr(),
            held.1.as_ptr(),
            "a held buffer is not reused"
        );
        check(&read);
        later.push(read.0);
        check(&held);
    }
    assert_eq!(later, (2..10).map(|i| i * 1000).collect::<Vec<u64>>());
}

#[test]
fn bad_ranges_are_errors_naming_the_object() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(StoreOptions::default());
    let loc = Location::Dir(tmp.path().join("r.bin"));
    write_run(&store, &loc, &pattern(100));
    let obj = store.open(&loc).unwrap();
    let e = obj.read_range(50..101).unwrap_err();
    assert!(matches!(e, StoreError::BadRange { .. }), "{e}");
    assert!(e.to_string().contains("r.bin"), "{e}");
    #[allow(clippy::reversed_empty_ranges)]
    let mut it = obj.read_ranges(vec![0..10, 20..10]);
    assert!(matches!(it.next(), Some(Err(StoreError::BadRange { .. }))));
    assert!(it.next().is_none(), "one error, then the end");
}

#[test]
fn list_skips_hidden_and_other_names() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(StoreOptions::default());
    let dir = Location::Dir(tmp.path().to_path_buf());
    assert_eq!(
        store.list_runs(&dir).unwrap(),
        vec![],
        "empty is not an error"
    );
    for name in [
        "b.bin",
        "a.bin",
        ".a.bin.x1y2z3.tmp",
        ".hidden.bin",
        "notes.txt",
        ".bin",
    ] {
        std::fs::write(tmp.path().join(name), b"x").unwrap();
    }
    std::fs::create_dir(tmp.path().join("c.bin")).unwrap();
    let runs = store.list_runs(&dir).unwrap();
    assert_eq!(runs, vec![dir.join("a.bin"), dir.join("b.bin")]);
}

#[test]
fn missing_directory_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(StoreOptions::default());
    let missing = Location::Dir(tmp.path().join("nope"));
    let e = store.list_runs(&missing).unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(e.to_string().contains("nope"), "{e}");
    let e = store.create(&missing.join("x.bin")).unwrap_err();
    assert!(e.is_not_found() && e.to_string().contains("nope"), "{e}");
    let e = store.open(&missing.join("x.bin")).unwrap_err();
    assert!(e.is_not_found() && e.to_string().contains("x.bin"), "{e}");
    assert!(!store.exists(&missing).unwrap());
}

#[test]
fn unfinished_upload_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(StoreOptions::default());
    let dir = Location::Dir(tmp.path().to_path_buf());
    let loc = dir.join("r.bin");

    let mut up = store.create(&loc).unwrap();
    up.write_all(&pattern(3 << 20)).unwrap();
    let during = names(tmp.path());
    assert_eq!(during.len(), 1, "{during:?}");
    assert!(
        during[0].starts_with(".r.bin.") && during[0].ends_with(".tmp"),
        "{during:?}"
    );
    assert!(!store.exists(&loc).unwrap(), "not visible before finish");
    assert_eq!(
        store.list_runs(&dir).unwrap(),
        vec![],
        "temp files are not runs"
    );
    drop(up);
    assert_eq!(
        names(tmp.path()),
        Vec::<String>::new(),
        "drop removes the temp file"
    );

    let mut up = store.create(&loc).unwrap();
    up.write_all(b"abc").unwrap();
    up.abort();
    assert_eq!(
        names(tmp.path()),
        Vec::<String>::new(),
        "abort removes the temp file"
    );
}

#[test]
fn open_file_keeps_reading_the_original_when_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(StoreOptions::default());
    let loc = Location::Dir(tmp.path().join("r.bin"));
    write_run(&store, &loc, b"old old old");
    let obj = store.open(&loc).unwrap();
    write_run(&store, &loc, b"new new new new");
    assert_eq!(obj.read_range(0..11).unwrap(), &b"old old old"[..]);
    assert_eq!(store.open(&loc).unwrap().len(), 15);
}

/// An endpoint that refuses connections: a port that was just free.
fn refused_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

#[track_caller]
fn assert_clean(e: &StoreError, object: &str, started: Instant, deadline: Duration) {
    let shown = format!("{e} | {e:?} | {e:#?}");
    assert!(!shown.contains(SECRET) && !shown.contains(TOKEN), "{shown}");
    assert!(e.to_string().contains(object), "{e}");
    // The deadline plus one request's connect timeout and some scheduling slack.
    let limit = deadline + Duration::from_secs(7);
    assert!(
        started.elapsed() < limit,
        "took {:?}: {e}",
        started.elapsed()
    );
}

#[test]
fn unreachable_s3_fails_within_the_deadline_without_secrets() {
    let deadline = Duration::from_secs(2);
    let opts = StoreOptions {
        deadline,
        ..StoreOptions::default()
    };
    let config = S3Config::new("AKID-test", SECRET)
        .with_session_token(TOKEN)
        .with_endpoint(&refused_endpoint())
        .with_allow_http(true);
    let store = Store::with_s3_config(opts, config);
    assert!(!format!("{store:?}").contains(SECRET));
    let run = Location::parse("s3://bucket/runs/shard-3.bin").unwrap();

    let t = Instant::now();
    let e = store.open(&run).unwrap_err();
    assert!(matches!(e, StoreError::GaveUp { .. }), "{e}");
    assert_clean(&e, "s3://bucket/runs/shard-3.bin", t, deadline);

    let t = Instant::now();
    let e = store
        .list_runs(&Location::parse("s3://bucket/runs/").unwrap())
        .unwrap_err();
    assert_clean(&e, "s3://bucket/runs", t, deadline);

    let t = Instant::now();
    let e = store.exists(&run).unwrap_err();
    assert_clean(&e, "s3://bucket/runs/shard-3.bin", t, deadline);

    // Small: one PUT at finish.
    let t = Instant::now();
    let mut up = store.create(&run).unwrap();
    up.write_all(b"hello").unwrap();
    let e = up.finish().unwrap_err();
    assert_clean(&e, "s3://bucket/runs/shard-3.bin", t, deadline);

    // Large: the multipart upload cannot start.
    let t = Instant::now();
    let mut up = store.create(&run).unwrap();
    let e = up
        .write_all(&pattern(store.options().part_size))
        .unwrap_err();
    let shown = format!("{e} {e:?}");
    assert!(
        !shown.contains(SECRET) && shown.contains("shard-3.bin"),
        "{shown}"
    );
    assert!(
        up.write_all(b"more").is_err(),
        "a failed upload stays failed"
    );
    let e = up.finish().unwrap_err();
    assert_clean(&e, "s3://bucket/runs/shard-3.bin", t, deadline * 2);
}

#[test]
fn s3_calls_work_from_inside_another_runtime() {
    let deadline = Duration::from_millis(500);
    let opts = StoreOptions {
        deadline,
        ..StoreOptions::default()
    };
    let config = S3Config::new("AKID-test", SECRET)
        .with_endpoint(&refused_endpoint())
        .with_allow_http(true);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let store = Store::with_s3_config(opts, config);
        let run = Location::parse("s3://bucket/x.bin").unwrap();
        let e = store.open(&run).unwrap_err();
        assert!(e.to_string().contains("s3://bucket/x.bin"), "{e}");
        drop(store); // Must not panic inside a runtime.
    });
}

#[test]
fn s3_config_errors_are_clear() {
    let config = S3Config::new("AKID-test", SECRET).with_endpoint("http://127.0.0.1:1");
    let store = Store::with_s3_config(StoreOptions::default(), config);
    let e = store
        .open(&Location::parse("s3://b/x.bin").unwrap())
        .unwrap_err();
    assert!(matches!(e, StoreError::Config { .. }), "{e}");
    assert!(e.to_string().contains("AWS_ALLOW_HTTP"), "{e}");
    let e = store
        .create(&Location::parse("s3://b/").unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("not an object"), "{e}");
}

/// What a producer publishing as it goes needs of a directory: nested directories made
/// durably, names listed whatever they end with, small files read whole with a cap, files
/// removed (twice is no error).
#[test]
fn dir_small_objects_listing_and_removal() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(StoreOptions::default());
    let dest = Location::Dir(tmp.path().to_path_buf());
    let segs = dest.join("segments/shard-3");
    assert!(store.list_names(&segs).unwrap().is_empty(), "missing: none");
    assert!(
        store.create(&segs.join("a.seg")).is_err(),
        "no directory yet"
    );
    store.make_dirs(&segs).unwrap();
    store.make_dirs(&segs).unwrap();
    write_run(&store, &segs.join("b.seg"), b"bb");
    write_run(&store, &segs.join("a.seg"), b"a");
    std::fs::write(tmp.path().join("segments/shard-3/.hidden.tmp"), b"x").unwrap();
    std::fs::create_dir(tmp.path().join("segments/shard-3/sub")).unwrap();
    assert_eq!(store.list_names(&segs).unwrap(), ["a.seg", "b.seg"]);

    let cp = dest.join("shard-3.checkpoint");
    write_run(&store, &cp, &pattern(100));
    assert_eq!(store.read_small(&cp, 100).unwrap(), pattern(100));
    match store.read_small(&cp, 99) {
        Err(StoreError::TooLarge {
            len: 100, max: 99, ..
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
}

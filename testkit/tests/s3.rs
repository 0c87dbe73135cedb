//! The SeaweedFS harness itself (`testkit::s3`): a real `weed` process per test.

use std::time::{Duration, Instant};

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use testkit::s3::{TestS3, ACCESS_KEY, REGION, SECRET_KEY};

/// A client of `s3`'s bucket with the given secret (the right one is [`SECRET_KEY`]).
fn client(s3: &TestS3, secret: &str) -> AmazonS3 {
    AmazonS3Builder::new()
        .with_endpoint(s3.endpoint())
        .with_allow_http(true)
        .with_region(REGION)
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(secret)
        .with_bucket_name(s3.bucket())
        .build()
        .expect("S3 client")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Whether process `pid` exists (a zombie counts: it has not been reaped).
fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn objects_put_through_the_filer_are_the_s3_objects_and_back() {
    let s3 = TestS3::start("qlist-harness");
    assert_eq!(s3.url("runs/x"), "s3://qlist-harness/runs/x");
    let env = s3.env();
    assert!(
        env.contains(&("AWS_ENDPOINT_URL".to_string(), s3.endpoint())),
        "{env:?}"
    );

    s3.put("runs/shard-1.bin", b"one\0bytes");
    s3.put("runs/deep/shard 2.bin", b"");
    s3.put("other/x", b"x");
    assert_eq!(
        s3.get("runs/shard-1.bin").as_deref(),
        Some(&b"one\0bytes"[..])
    );
    assert_eq!(s3.get("runs/deep/shard 2.bin").as_deref(), Some(&b""[..]));
    assert_eq!(s3.get("runs/missing"), None);
    assert_eq!(
        s3.keys("runs/"),
        ["runs/deep/shard 2.bin", "runs/shard-1.bin"]
    );
    assert_eq!(s3.keys("runs/sh"), ["runs/shard-1.bin"]);
    assert_eq!(
        s3.keys(""),
        ["other/x", "runs/deep/shard 2.bin", "runs/shard-1.bin"]
    );

    // Overwrite, then read through the S3 API with the test credentials.
    s3.put("runs/shard-1.bin", b"replaced");
    let rt = runtime();
    let store = client(&s3, SECRET_KEY);
    let got = rt.block_on(async {
        store
            .get(&Path::from("runs/shard-1.bin"))
            .await?
            .bytes()
            .await
    });
    assert_eq!(got.expect("S3 GET").as_ref(), b"replaced");
    // And the other way: written through S3, seen by the filer.
    rt.block_on(store.put(
        &Path::from("runs/s3.bin"),
        PutPayload::from_static(b"via s3"),
    ))
    .expect("S3 PUT");
    assert_eq!(s3.get("runs/s3.bin").as_deref(), Some(&b"via s3"[..]));

    s3.delete("runs/shard-1.bin");
    s3.delete("runs/never-was");
    assert_eq!(s3.get("runs/shard-1.bin"), None);
    assert_eq!(s3.keys("runs/"), ["runs/deep/shard 2.bin", "runs/s3.bin"]);
}

#[test]
fn wrong_credentials_are_refused() {
    let s3 = TestS3::start("qlist-creds");
    let rt = runtime();
    let bad = client(&s3, "not-the-secret");
    let put = rt.block_on(bad.put(&Path::from("k"), PutPayload::from_static(b"v")));
    assert!(put.is_err(), "a wrong secret was accepted");
    assert_eq!(s3.get("k"), None);
    let good = client(&s3, SECRET_KEY);
    rt.block_on(good.put(&Path::from("k"), PutPayload::from_static(b"v")))
        .expect("right secret");
    assert_eq!(s3.get("k").as_deref(), Some(&b"v"[..]));
}

#[test]
fn in_progress_multipart_uploads_are_listed_until_aborted() {
    let s3 = TestS3::start("qlist-multipart");
    let rt = runtime();
    let store = client(&s3, SECRET_KEY);
    assert!(s3.multipart_uploads().is_empty());
    let mut upload = rt
        .block_on(store.put_multipart(&Path::from("big/run.bin")))
        .expect("start");
    rt.block_on(upload.put_part(PutPayload::from(vec![7u8; 5 << 20])))
        .expect("part");
    assert_eq!(s3.multipart_uploads(), ["big/run.bin"]);
    assert!(
        s3.keys("").is_empty(),
        "an upload is no object: {:?}",
        s3.keys("")
    );
    rt.block_on(upload.abort()).expect("abort");
    assert!(
        s3.multipart_uploads().is_empty(),
        "{:?}",
        s3.multipart_uploads()
    );
}

#[test]
fn kill_and_restart_keep_the_objects() {
    let mut s3 = TestS3::start("qlist-restart");
    s3.put("runs/a", b"before the crash");
    let endpoint = s3.endpoint();
    let old = s3.pid().expect("running");
    s3.kill();
    assert!(!process_exists(old), "pid {old} still there after kill");
    assert_eq!(s3.pid(), None);
    let t = Instant::now();
    s3.restart();
    eprintln!("weed restarted in {:?}", t.elapsed());
    assert_eq!(s3.endpoint(), endpoint);
    assert_eq!(s3.get("runs/a").as_deref(), Some(&b"before the crash"[..]));
    assert_eq!(s3.keys(""), ["runs/a"]);
}

#[test]
fn a_paused_server_answers_again_after_resume() {
    let s3 = TestS3::start("qlist-pause");
    s3.put("k", b"v");
    s3.pause();
    let addr = s3.filer_addr();
    let stalled = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(addr).expect("connect: the kernel still accepts");
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        c.write_all(b"GET /buckets/qlist-pause/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        c.read(&mut [0u8; 16])
    });
    let read = stalled.join().expect("reader thread");
    assert!(read.is_err(), "a stopped server answered: {read:?}");
    s3.resume();
    assert_eq!(s3.get("k").as_deref(), Some(&b"v"[..]));
}

#[test]
fn drop_leaves_no_process() {
    let t = Instant::now();
    let s3 = TestS3::start("qlist-drop");
    eprintln!("weed started in {:?}", t.elapsed());
    let pid = s3.pid().expect("running");
    let s3_addr = s3.endpoint().trim_start_matches("http://").to_string();
    drop(s3);
    assert!(!process_exists(pid), "weed pid {pid} survived the drop");
    assert!(
        std::net::TcpStream::connect(&s3_addr).is_err(),
        "something still on {s3_addr}"
    );
}

#[test]
fn starting_without_weed_says_what_to_install() {
    // In a child process: setting QLIST_WEED here would race the other tests.
    let child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "missing_weed_child",
            "--include-ignored",
            "--nocapture",
        ])
        .env("QLIST_WEED", "/nonexistent/weed")
        .output()
        .expect("run the test binary");
    let out = String::from_utf8_lossy(&child.stdout).into_owned()
        + &String::from_utf8_lossy(&child.stderr);
    assert!(!child.status.success(), "{out}");
    assert!(out.contains("bash scripts/deps.sh"), "{out}");
}

/// Run by `starting_without_weed_says_what_to_install` in a child with a bad QLIST_WEED.
#[test]
#[ignore = "run as a child of starting_without_weed_says_what_to_install"]
fn missing_weed_child() {
    let _ = TestS3::start("qlist-missing");
}

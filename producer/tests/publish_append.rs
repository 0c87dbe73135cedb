//! `Appender` publishing as it goes (`AppendConfig::publish`), with a real Redis quorum and
//! real RocksDB into a directory: publication at the next call after the interval, and
//! `Appender::publish` now; an idle appender's claim moves up; the claim rule; reopened
//! after a crash, it removes an orphan segment and publishes the rest exactly once.

mod common;

use common::publish::{check_claim, Published};
use common::{durable_items, quorum};
use idclient::{ClientConfig, QuorumClient};
use producer::{AppendConfig, Appender};
use qformat::names::segment_name;
use std::time::{Duration, Instant};
use testkit::wait_for;

const EVERY: Duration = Duration::from_millis(200);

fn item(i: u64) -> Vec<u8> {
    format!("item {i}").into_bytes()
}

async fn connect(q: &idtools::cluster::LocalQuorum) -> QuorumClient {
    QuorumClient::connect(ClientConfig::new(q.urls()))
        .await
        .expect("connect to the quorum")
}

/// Waits until a publication interval has passed since `since`.
fn wait_interval(since: Instant) {
    wait_for("the interval to pass", Duration::from_secs(5), || {
        since.elapsed() > EVERY + Duration::from_millis(20)
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_appender_publishes_as_it_goes_and_an_idle_one_moves_its_claim_up() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, dest) = (tmp.path().join("data"), tmp.path().join("pub"));
    std::fs::create_dir_all(&dest).expect("mkdir dest");
    let dest_arg = dest.to_str().expect("utf-8");
    let published = Published::Dir(&dest);
    let mut cfg = AppendConfig::new(2, &data)
        .publish_every(dest_arg, EVERY)
        .expect("config");
    cfg.batch = 10;
    let mut a = Appender::open(cfg, connect(&q).await).expect("open");
    assert_eq!(a.published(), Some((0, 0)));

    // publish(): everything appended so far, now.
    a.append_batch((0..25).map(item)).await.expect("append");
    assert_eq!(a.publish().await.expect("publish"), 25);
    let c1 = published.checkpoint(2).expect("checkpoint");
    assert_eq!((c1.count, c1.finished), (25, false));
    assert_eq!(a.published(), Some((25, c1.claim)));
    assert_eq!(published.records(&c1), durable_items(&data, 2));

    // Idle: each publication takes one fresh ID, so the claim moves up.
    a.publish().await.expect("publish idle");
    let c2 = published.checkpoint(2).expect("checkpoint");
    assert_eq!(c2.count, 25);
    assert!(c2.claim > c1.claim, "{c1:?} {c2:?}");
    // A flush after the interval publishes (nothing new: a fresh claim again).
    let since = Instant::now();
    a.flush().await.expect("flush");
    wait_interval(since);
    a.flush().await.expect("flush after the interval");
    let c3 = published.checkpoint(2).expect("checkpoint");
    assert!(c3.claim > c2.claim && c3.count == 25, "{c2:?} {c3:?}");

    // Appends after the interval: what is durable is published before the next batch.
    a.append_batch((25..47).map(item)).await.expect("append"); // 20 stamped, 2 buffered
    let since = Instant::now();
    a.flush().await.expect("flush");
    wait_interval(since);
    a.append(&item(47))
        .await
        .expect("append after the interval");
    let c4 = published.checkpoint(2).expect("checkpoint");
    assert_eq!(c4.count, 47, "{c4:?}");
    let summary = a.finish().await.expect("finish");
    assert_eq!(summary.published.map(|p| (p.0, p.1)), Some((48, true)));
    let items = durable_items(&data, 2);
    assert_eq!(items.len(), 48);
    published.check_finished(2, &items);
    for c in [&c1, &c2, &c3, &c4] {
        check_claim(c, &items);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopened_appender_removes_an_orphan_and_publishes_the_rest_once() {
    let q = quorum(3);
    let tmp = tempfile::tempdir().expect("tempdir");
    let (data, dest) = (tmp.path().join("data"), tmp.path().join("pub"));
    std::fs::create_dir_all(&dest).expect("mkdir dest");
    let published = Published::Dir(&dest);
    // An interval no step of the test reaches: only publish() publishes.
    let mut cfg = AppendConfig::new(4, &data)
        .publish_every(dest.to_str().expect("utf-8"), Duration::from_secs(3600))
        .expect("config");
    cfg.batch = 7;
    {
        let mut a = Appender::open(cfg.clone(), connect(&q).await).expect("open");
        a.append_batch((0..50).map(item)).await.expect("append");
        a.publish().await.expect("publish");
        a.append_batch((50..70).map(item)).await.expect("append");
        a.flush().await.expect("flush");
        // Dropped unfinished, as if killed: 70 durable, 50 published.
    }
    let c = published.checkpoint(4).expect("checkpoint");
    assert_eq!(c.count, 50);
    // A segment a producer killed before its checkpoint left behind.
    let orphan = dest.join(segment_name(4, 50, 60));
    std::fs::write(&orphan, b"not a segment anyone named").expect("write orphan");

    let mut a = Appender::open(cfg, connect(&q).await).expect("reopen");
    assert!(!orphan.exists(), "the orphan segment was not removed");
    assert_eq!((a.resume_at(), a.published()), (70, Some((50, c.claim))));
    a.append_batch((70..80).map(item)).await.expect("append");
    a.finish().await.expect("finish");
    let items = durable_items(&data, 4);
    assert_eq!(items.len(), 80);
    for (i, r) in items.iter().enumerate() {
        assert_eq!(r.payload, item(i as u64));
    }
    published.check_finished(4, &items);
    check_claim(&c, &items);
}

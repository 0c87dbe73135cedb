use super::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// An in-process ID source for unit tests (the integration tests use a real quorum).
struct Counter(AtomicU64);

impl IdSource for Counter {
    async fn next_ids(&self, n: u64) -> Result<IdRange, IdError> {
        let lo = self.0.fetch_add(n, Ordering::SeqCst) + 1;
        Ok(IdRange { lo, hi: lo + n - 1 })
    }
}

/// Fails after `ok` requests.
struct Failing(Counter, AtomicU64);

impl IdSource for Failing {
    async fn next_ids(&self, n: u64) -> Result<IdRange, IdError> {
        if self.1.fetch_sub(1, Ordering::SeqCst) == 0 {
            return Err(IdError::NoQuorum {
                needed: 3,
                reachable: 0,
                accepted: None,
                total: 5,
                failures: vec![],
            });
        }
        self.0.next_ids(n).await
    }
}

fn read_all(dir: &std::path::Path, shard: u32) -> Vec<Record> {
    let r = sublist::shard::ShardReader::open(&qformat::names::shard_db_path(dir, shard))
        .expect("reader");
    r.iter().collect::<Result<_, _>>().expect("items")
}

#[tokio::test]
async fn generate_stamps_in_order_and_finishes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = Config::new(
        2,
        dir.path(),
        ItemInput::Generate {
            count: 25,
            payload_size: 7,
        },
    );
    cfg.batch = 10;
    let src = Counter(AtomicU64::new(100));
    let s = run(cfg.clone(), &src).await.expect("run");
    assert_eq!((s.written, s.batches, s.id_span), (25, 3, Some((101, 125))));
    let items = read_all(dir.path(), 2);
    assert_eq!(items.len(), 25);
    for (i, r) in items.iter().enumerate() {
        assert_eq!((r.id, r.shard, r.seq), (101 + i as u64, 2, i as u64));
        assert_eq!(r.payload, generate_payload(2, i as u64, 7));
    }
    let again = run(cfg.clone(), &src).await.expect("rerun");
    assert!(again.already_finished, "{again}");
    assert!(again.to_string().contains("nothing to do"));
    cfg.input = ItemInput::Generate {
        count: 26,
        payload_size: 7,
    };
    assert!(matches!(
        run(cfg, &src).await,
        Err(ProducerError::DifferentInput { .. })
    ));
}

#[tokio::test]
async fn id_failure_keeps_durable_batches_and_resumes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = Config::new(
        0,
        dir.path(),
        ItemInput::Generate {
            count: 50,
            payload_size: 3,
        },
    );
    cfg.batch = 10;
    let src = Failing(Counter(AtomicU64::new(0)), AtomicU64::new(2));
    let e = run(cfg.clone(), &src).await.expect_err("no quorum");
    assert!(matches!(e, ProducerError::Ids { next_seq: 20, .. }), "{e}");
    assert_eq!(e.exit_code(), 5);
    assert_eq!(read_all(dir.path(), 0).len(), 20);
    let s = run(cfg, &Counter(AtomicU64::new(1000)))
        .await
        .expect("resume");
    assert_eq!((s.resumed_at, s.written), (20, 30));
    let items = read_all(dir.path(), 0);
    assert_eq!(
        items.iter().map(|r| r.seq).collect::<Vec<_>>(),
        (0..50).collect::<Vec<_>>()
    );
    assert_eq!(items[19].id, 20);
    assert_eq!(items[20].id, 1001);
}

#[tokio::test]
async fn ids_below_the_last_durable_id_are_refused_and_nothing_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = Config::new(
        0,
        dir.path(),
        ItemInput::Generate {
            count: 30,
            payload_size: 3,
        },
    );
    cfg.batch = 10;
    let src = Failing(Counter(AtomicU64::new(0)), AtomicU64::new(1));
    run(cfg.clone(), &src).await.expect_err("no quorum");
    assert_eq!(read_all(dir.path(), 0).len(), 10);
    // A wiped generator starts again at 1, below the sublist's last ID 10.
    let e = run(cfg, &Counter(AtomicU64::new(0)))
        .await
        .expect_err("went backwards");
    assert!(
        matches!(
            e,
            ProducerError::IdsWentBackwards {
                last_id: 10,
                next_seq: 10,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.exit_code(), 5);
    let msg = e.to_string();
    assert!(
        msg.contains("IDs 1..=10, not above 10")
            && msg.contains("went backwards")
            && msg.contains("nothing was written")
            && !msg.contains("IdRange"),
        "{msg}"
    );
    assert_eq!(read_all(dir.path(), 0).len(), 10);
}

/// What `{:#}` (anyhow, the binary) prints: the message, then every source in turn.
fn printed_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out = format!("{out}: {c}");
        cause = c.source();
    }
    out
}

#[test]
fn each_cause_is_printed_once() {
    let enospc = "No space left on device (os error 28)";
    let errors = [
        ProducerError::Input {
            input: "items.txt".into(),
            error: std::io::Error::from_raw_os_error(28),
        },
        ProducerError::Shard(ShardError::Io {
            path: PathBuf::from("/data/shard-0"),
            error: std::io::Error::from_raw_os_error(28),
        }),
        ProducerError::Connect(IdError::Protocol {
            addr: "127.0.0.1:1".into(),
            reason: enospc.into(),
        }),
        ProducerError::Ids {
            next_seq: 7,
            error: IdError::Protocol {
                addr: "127.0.0.1:1".into(),
                reason: enospc.into(),
            },
        },
    ];
    for e in errors {
        let printed = printed_chain(&e);
        assert_eq!(printed.matches(enospc).count(), 1, "{printed}");
    }
}

#[tokio::test]
async fn bad_config_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = Config::new(
        0,
        dir.path(),
        ItemInput::Generate {
            count: 1,
            payload_size: MAX_ITEM_BYTES + 1,
        },
    );
    assert!(matches!(
        Producer::open(cfg.clone()),
        Err(ProducerError::Config(_))
    ));
    cfg.input = ItemInput::Generate {
        count: 1,
        payload_size: 1,
    };
    cfg.batch = 0;
    assert!(matches!(Producer::open(cfg), Err(ProducerError::Config(_))));
}

/// An appender borrows its test counter, so the test can hand the same one to the next.
impl IdSource for &Counter {
    async fn next_ids(&self, n: u64) -> Result<IdRange, IdError> {
        (**self).next_ids(n).await
    }
}

impl IdSource for &Failing {
    async fn next_ids(&self, n: u64) -> Result<IdRange, IdError> {
        (**self).next_ids(n).await
    }
}

/// Item `i` of the appender tests: any bytes, newlines and NUL included, some empty.
fn item(i: u64) -> Vec<u8> {
    match i % 4 {
        0 => Vec::new(),
        1 => format!("line {i}\nand more").into_bytes(),
        2 => vec![0, 0xff, i as u8, b'\n'],
        _ => i.to_le_bytes().to_vec(),
    }
}

#[track_caller]
fn assert_items_exactly_once(dir: &std::path::Path, shard: u32, count: u64) {
    let items = read_all(dir, shard);
    assert_eq!(items.len() as u64, count, "item count");
    let mut last = 0;
    for (i, r) in items.iter().enumerate() {
        assert_eq!((r.shard, r.seq), (shard, i as u64));
        assert_eq!(r.payload, item(i as u64), "payload of item {i}");
        assert!(r.id > last, "IDs increase with seq");
        last = r.id;
    }
}

#[tokio::test]
async fn appender_appends_flushes_finishes_and_reopens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ids = Counter(AtomicU64::new(0));
    let mut cfg = AppendConfig::new(4, dir.path());
    cfg.batch = 3;
    let mut a = Appender::open(cfg.clone(), &ids).expect("open");
    assert_eq!((a.resume_at(), a.next_seq(), a.durable()), (0, 0, 0));
    assert_eq!(a.append(&item(0)).await.expect("append"), 0);
    assert_eq!(a.append_batch((1..5).map(item)).await.expect("batch"), 1..5);
    assert_eq!(a.flush().await.expect("flush"), 5);
    assert_eq!(a.durable(), 5);
    assert_items_exactly_once(dir.path(), 4, 5);
    drop(a);

    let mut a = Appender::open(cfg.clone(), &ids).expect("reopen");
    assert_eq!(a.resume_at(), 5);
    for i in a.resume_at()..11 {
        assert_eq!(a.append(&item(i)).await.expect("append"), i);
    }
    let s = a.finish().await.expect("finish");
    assert_eq!((s.resumed_at, s.written, s.already_finished), (5, 6, false));
    assert!(a.is_finished());
    assert!(matches!(
        a.append(b"late").await,
        Err(ProducerError::Finished { items: 11, .. })
    ));
    drop(a);
    assert_items_exactly_once(dir.path(), 4, 11);

    // Finished: reopening says so, takes nothing, and finish does nothing.
    let mut a = Appender::open(cfg.clone(), &ids).expect("reopen finished");
    assert!(a.is_finished());
    assert_eq!(a.resume_at(), 11);
    let e = a.append(b"x").await.expect_err("finished");
    assert_eq!(e.exit_code(), 4, "{e}");
    let s = a.finish().await.expect("finish again");
    assert!(s.already_finished && s.written == 0, "{s}");
    let sealed = a
        .seal_to(dir.path().to_str().expect("utf-8 path"))
        .await
        .expect("seal");
    assert_eq!(sealed.records, 11);
    assert!(dir.path().join("shard-4.bin").is_file());
    drop(a);

    // Another name, or a sublist the binary wrote from an input, is refused.
    cfg.name = "another job".into();
    assert!(matches!(
        Appender::open(cfg, &ids),
        Err(ProducerError::DifferentInput { .. })
    ));
    let gen = Config::new(
        5,
        dir.path(),
        ItemInput::Generate {
            count: 2,
            payload_size: 1,
        },
    );
    run(gen, &ids).await.expect("generate");
    assert!(matches!(
        Appender::open(AppendConfig::new(5, dir.path()), &ids),
        Err(ProducerError::DifferentInput { .. })
    ));
}

#[tokio::test]
async fn appender_drops_what_is_not_durable_and_the_replay_is_exactly_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ids = Counter(AtomicU64::new(0));
    let mut cfg = AppendConfig::new(0, dir.path());
    cfg.batch = 4;
    let mut a = Appender::open(cfg.clone(), &ids).expect("open");
    a.append_batch((0..6).map(item)).await.expect("append");
    // Items 0..4 are being written, 4 and 5 only buffered: a crash now, once the write
    // is done, leaves 4 durable.
    a.stamper.finish_pending().await.expect("write");
    assert_eq!((a.durable(), a.next_seq()), (4, 6));
    drop(a);
    let mut a = Appender::open(cfg.clone(), &ids).expect("reopen");
    assert_eq!(a.resume_at(), 4);
    for i in a.resume_at()..10 {
        a.append(&item(i)).await.expect("append");
    }
    a.finish().await.expect("finish");
    drop(a);
    assert_items_exactly_once(dir.path(), 0, 10);
}

#[tokio::test]
async fn appender_after_an_error_refuses_everything_until_reopened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = AppendConfig::new(1, dir.path());
    cfg.batch = 4;
    // One ID request succeeds, then no quorum.
    let failing = Failing(Counter(AtomicU64::new(0)), AtomicU64::new(1));
    let mut a = Appender::open(cfg.clone(), &failing).expect("open");
    let e = a
        .append_batch((0..8).map(item))
        .await
        .expect_err("no quorum for the second batch");
    assert!(matches!(e, ProducerError::Ids { next_seq: 4, .. }), "{e}");
    let e = a
        .append(&item(8))
        .await
        .expect_err("refused after an error");
    assert!(
        matches!(e, ProducerError::AppenderFailed { durable: 4, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("append from item 4"), "{e}");
    assert!(a.flush().await.is_err() && a.finish().await.is_err());
    drop(a);
    let ids = Counter(AtomicU64::new(100));
    let mut a = Appender::open(cfg, &ids).expect("reopen");
    assert_eq!(a.resume_at(), 4);
    for i in a.resume_at()..9 {
        a.append(&item(i)).await.expect("append");
    }
    a.finish().await.expect("finish");
    drop(a);
    assert_items_exactly_once(dir.path(), 1, 9);
}

#[tokio::test]
async fn appender_refuses_an_item_above_the_limit_and_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ids = Counter(AtomicU64::new(0));
    let mut a = Appender::open(AppendConfig::new(2, dir.path()), &ids).expect("open");
    a.append(&item(0)).await.expect("append");
    let big = vec![b'x'; MAX_ITEM_BYTES + 1];
    let e = a.append(&big).await.expect_err("too long");
    assert!(
        matches!(e, ProducerError::ItemTooLong { seq: 1, .. }),
        "{e}"
    );
    assert_eq!(e.exit_code(), 3);
    let e = a
        .append_batch([item(1), big, item(2)])
        .await
        .expect_err("too long in a batch");
    assert!(
        matches!(e, ProducerError::ItemTooLong { seq: 2, .. }),
        "{e}"
    );
    assert_eq!(a.next_seq(), 1, "nothing of the batch was appended");
    a.append_batch([item(1), item(2)]).await.expect("append");
    assert!(matches!(
        a.seal_to(dir.path().to_str().expect("utf-8")).await,
        Err(ProducerError::Seal(SealError::Unfinished { .. }))
    ));
    a.finish().await.expect("finish");
    drop(a);
    assert_items_exactly_once(dir.path(), 2, 3);
    let mut cfg = AppendConfig::new(3, dir.path());
    cfg.batch = 0;
    assert!(matches!(
        Appender::open(cfg, &ids),
        Err(ProducerError::Config(_))
    ));
}

#[tokio::test]
async fn appender_counts_into_the_producer_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ids = Counter(AtomicU64::new(0));
    let mut cfg = AppendConfig::new(6, dir.path());
    cfg.batch = 4;
    let metrics = Arc::new(ProducerMetrics::new(6));
    let mut a = Appender::open(cfg, &ids)
        .expect("open")
        .with_metrics(metrics.clone());
    a.append_batch((0..10).map(item)).await.expect("append");
    a.finish().await.expect("finish");
    let text = metrics::endpoints(metrics).metrics_text().expect("encode");
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    assert_eq!(value("qlist_producer_items_written_total"), 10.0, "{text}");
    // Batches of 4: 4, 4, then the last 2 at finish.
    assert_eq!(value("qlist_producer_batches_written_total"), 3.0, "{text}");
    assert_eq!(value("qlist_producer_id_wait_seconds_count"), 3.0, "{text}");
    assert_eq!(value("qlist_producer_id_errors_total"), 0.0, "{text}");
    assert_eq!(value("qlist_producer_shard"), 6.0, "{text}");
}

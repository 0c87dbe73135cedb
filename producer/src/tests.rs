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
        InputSpec::Generate {
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
    cfg.input = InputSpec::Generate {
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
        InputSpec::Generate {
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
        InputSpec::Generate {
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
        InputSpec::Generate {
            count: 1,
            payload_size: MAX_ITEM_BYTES + 1,
        },
    );
    assert!(matches!(
        Producer::open(cfg.clone()),
        Err(ProducerError::Config(_))
    ));
    cfg.input = InputSpec::Generate {
        count: 1,
        payload_size: 1,
    };
    cfg.batch = 0;
    assert!(matches!(Producer::open(cfg), Err(ProducerError::Config(_))));
}

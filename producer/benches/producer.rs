//! Producer throughput (items/s) with `--generate` items of 100 bytes at batch sizes 1,
//! 100 and 10,000, in one run, against baselines:
//!
//! - `producer`: the real thing: [`producer::run`] stamping every batch with one range
//!   from a 5-node local redis-server quorum (fsync on every write) and writing batch +
//!   progress in one synced RocksDB WriteBatch.
//! - `local_ids`: the same producer with an in-process counter as ID source: the cost of
//!   the producer without the quorum.
//! - `plain_rocksdb`: plain synced RocksDB WriteBatches of the same items (same encoding,
//!   same batch size, no compression), no ID stamping, no progress marker.
//!
//! After criterion's figures, the three are also run interleaved round by round (medians
//! and ratios printed), which is robust to load drifting on a shared machine.
//!
//! Each iteration writes a fresh sublist; opening (creating) the database is not timed,
//! for the producer as for the baseline. `cargo bench -p producer` (release profile).

// criterion_group! defines a public function it gives no documentation.
#![allow(missing_docs)]

use criterion::{criterion_group, BenchmarkId, Criterion, SamplingMode, Throughput};
use idclient::{ClientConfig, IdError, IdRange, IdSource, QuorumClient};
use idtools::cluster::LocalQuorum;
use producer::{generate_payload, Config, ItemInput};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const PAYLOAD: usize = 100;
const SHARD: u32 = 1;

/// Items per iteration for a batch size: enough batches to reach a steady state, few
/// enough that one iteration stays well under a second.
fn items_for(batch: u64) -> u64 {
    match batch {
        1 => 200,
        100 => 10_000,
        _ => 100_000,
    }
}

struct Counter(AtomicU64);

impl IdSource for Counter {
    async fn next_ids(&self, n: u64) -> Result<IdRange, IdError> {
        let lo = self.0.fetch_add(n, Ordering::SeqCst) + 1;
        Ok(IdRange { lo, hi: lo + n - 1 })
    }
}

fn produce(
    rt: &tokio::runtime::Runtime,
    source: &impl IdSource,
    batch: u64,
    iters: u64,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cfg = Config::new(
            SHARD,
            dir.path(),
            ItemInput::Generate {
                count: items_for(batch),
                payload_size: PAYLOAD,
            },
        );
        cfg.batch = batch;
        // Creating the database is a fixed cost, outside the timing as for the baseline.
        let p = producer::Producer::open(cfg).expect("open sublist");
        let start = Instant::now();
        let summary = rt.block_on(p.run(source)).expect("producer run");
        total += start.elapsed();
        assert_eq!(summary.written, items_for(batch));
    }
    total
}

fn plain(batch: u64, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.set_compression_type(rocksdb::DBCompressionType::None);
        let db = rocksdb::DB::open(&opts, dir.path()).expect("open rocksdb");
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(true);
        let n = items_for(batch);
        let start = Instant::now();
        let mut seq = 0;
        while seq < n {
            let mut b = rocksdb::WriteBatch::default();
            let end = (seq + batch).min(n);
            for s in seq..end {
                let payload = generate_payload(SHARD, s, PAYLOAD);
                b.put(
                    qformat::shard::encode_key(s),
                    qformat::shard::encode_value(SHARD, s, &payload),
                );
            }
            db.write_opt(b, &wo).expect("write");
            seq = end;
        }
        total += start.elapsed();
    }
    total
}

fn bench(c: &mut Criterion) {
    let quorum = LocalQuorum::temp(5)
        .expect("cannot start a local redis-server quorum (is redis-server installed?)");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let client = rt
        .block_on(QuorumClient::connect(ClientConfig::new(quorum.urls())))
        .expect("quorum client");
    let counter = Counter(AtomicU64::new(0));
    let mut g = c.benchmark_group("producer");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for batch in [1u64, 100, 10_000] {
        g.throughput(Throughput::Elements(items_for(batch)));
        g.bench_with_input(BenchmarkId::new("producer", batch), &batch, |b, &batch| {
            b.iter_custom(|iters| produce(&rt, &client, batch, iters))
        });
        g.bench_with_input(BenchmarkId::new("local_ids", batch), &batch, |b, &batch| {
            b.iter_custom(|iters| produce(&rt, &counter, batch, iters))
        });
        g.bench_with_input(
            BenchmarkId::new("plain_rocksdb", batch),
            &batch,
            |b, &batch| b.iter_custom(|iters| plain(batch, iters)),
        );
    }
    g.finish();
}

/// Rounds of the interleaved comparison.
const INTERLEAVED_ROUNDS: usize = 7;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The three variants run in turn, round after round, so that load from other processes
/// (fsync latency on a shared machine drifts a lot) hits them alike; medians of items/s
/// and of the per-round ratio producer / plain. Printed after criterion's figures.
fn interleaved() {
    let quorum = LocalQuorum::temp(5)
        .expect("cannot start a local redis-server quorum (is redis-server installed?)");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let client = rt
        .block_on(QuorumClient::connect(ClientConfig::new(quorum.urls())))
        .expect("quorum client");
    let counter = Counter(AtomicU64::new(0));
    println!("interleaved, {INTERLEAVED_ROUNDS} rounds, medians (items/s):");
    println!(
        "{:>6} {:>12} {:>12} {:>14} {:>16} {:>16}",
        "batch", "producer", "local_ids", "plain_rocksdb", "producer/plain", "local_ids/plain"
    );
    for batch in [1u64, 100, 10_000] {
        let n = items_for(batch) as f64;
        let (mut p, mut l, mut b, mut rp, mut rl) = (vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..INTERLEAVED_ROUNDS {
            let tp = produce(&rt, &client, batch, 1).as_secs_f64();
            let tl = produce(&rt, &counter, batch, 1).as_secs_f64();
            let tb = plain(batch, 1).as_secs_f64();
            p.push(n / tp);
            l.push(n / tl);
            b.push(n / tb);
            rp.push(tb / tp);
            rl.push(tb / tl);
        }
        println!(
            "{batch:>6} {:>12.0} {:>12.0} {:>14.0} {:>16.2} {:>16.2}",
            median(p),
            median(l),
            median(b),
            median(rp),
            median(rl)
        );
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // Not under `cargo test --benches` / `--list`: criterion then only smoke-runs.
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--list" || a == "--test") {
        interleaved();
    }
}

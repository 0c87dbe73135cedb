//! IDs per second under contention: the direct client (fast protocol, combining rounds
//! when contended, the default; fast with every request in its own rounds, the baseline
//! `direct-fast-uncombined`; classic) against the broker (`broker-window`: serving from
//! a confirmed window, idbroker's default; `broker-rounds`: one write round per batch),
//! at 1, 16, 64 and 256 concurrent callers, single IDs and ranges of 1000; and the two
//! brokers at 1024 callers over 4 BrokerClients (`1024x4`: each client its own
//! connections and coalescing queue, as 4 processes of 256 callers would be).
//!
//! Each run starts its own 5-node redis-server quorum (durable: fsync on every write) and
//! two in-process brokers on free loopback ports, one per serve mode (measured one at a
//! time: while one runs the other is idle, so it costs the window at most one hole). Direct callers are independent clients
//! (own connections, like separate processes); broker callers share one BrokerClient.
//! Throughput is reported in IDs (elements) per second.
//!
//! `cargo bench --bench ids`; `QLIST_BENCH_CALLERS=1,64` limits the caller counts
//! (`1024x4`: 1024 callers over 4 broker clients, broker rows only).

use broker::{BrokerConfig, RoundSource, WindowSource};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use idclient::broker_client::{BrokerClient, BrokerClientConfig};
use idclient::{ClientConfig, Combine, IdSource, Protocol, QuorumClient};
use idtools::cluster::LocalQuorum;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `iters` requests of `count` IDs spread over all `sources` concurrently.
async fn run<S: IdSource + 'static>(sources: &[Arc<S>], iters: u64, count: u64) -> Duration {
    let remaining = Arc::new(AtomicU64::new(iters));
    let started = Instant::now();
    let tasks: Vec<_> = sources
        .iter()
        .map(|s| {
            let (s, remaining) = (Arc::clone(s), Arc::clone(&remaining));
            tokio::spawn(async move {
                while remaining
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1))
                    .is_ok()
                {
                    // Errors would show as a failed benchmark, not a fast one.
                    if let Err(e) = s.next_ids(count).await {
                        panic!("request failed during the benchmark: {e}");
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        if let Err(e) = t.await {
            panic!("benchmark caller failed: {e}");
        }
    }
    started.elapsed()
}

/// Caller counts, each with the number of broker clients they are spread over.
fn callers() -> Vec<(usize, usize)> {
    let parse = |s: &str| -> Option<(usize, usize)> {
        match s.trim().split_once('x') {
            Some((callers, clients)) => Some((callers.parse().ok()?, clients.parse().ok()?)),
            None => Some((s.trim().parse().ok()?, 1)),
        }
    };
    std::env::var("QLIST_BENCH_CALLERS")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(parse)
                .filter(|&(_, k)| k > 0)
                .collect()
        })
        .unwrap_or_else(|| vec![(1, 1), (16, 1), (64, 1), (256, 1), (1024, 4)])
}

fn ids(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let quorum = LocalQuorum::temp(5)
        .expect("cannot start redis-server quorum (apt-get install redis-server)");
    let (rounds_addr, stop_rounds) = rt.block_on(async {
        let quorum_client = broker_quorum(&quorum).await;
        start_broker(Arc::new(quorum_client), 1).await
    });
    let (window_addr, stop_window) = rt.block_on(async {
        let quorum_client = broker_quorum(&quorum).await;
        let window = WindowSource::new(Arc::new(quorum_client));
        start_broker(Arc::new(window), broker::DEFAULT_PIPELINE).await
    });
    let mut group = c.benchmark_group("ids");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for (callers, clients) in callers() {
        // Several clients: broker rows only (1024 direct clients in one process starve
        // each other: `scripts/bench-window.sh` has that row).
        let split = clients > 1;
        let param = if split {
            format!("{callers}x{clients}")
        } else {
            callers.to_string()
        };
        let direct = |protocol, combine| {
            if split {
                return Vec::new();
            }
            rt.block_on(async {
                let mut config = ClientConfig::new(quorum.urls());
                config.protocol = protocol;
                config.combine = combine;
                config.deadline = Duration::from_secs(30);
                let mut v = Vec::new();
                for _ in 0..callers {
                    v.push(Arc::new(
                        QuorumClient::connect(config.clone())
                            .await
                            .expect("connect"),
                    ));
                }
                v
            })
        };
        let fast = direct(Protocol::Fast, Combine::Auto);
        let uncombined = direct(Protocol::Fast, Combine::Never);
        let classic = direct(Protocol::Classic, Combine::Never);
        let brokered = |addr: &String| {
            rt.block_on(async {
                let config = BrokerClientConfig {
                    deadline: Duration::from_secs(30),
                    ..Default::default()
                };
                let mut v = Vec::new();
                for _ in 0..clients {
                    let client = Arc::new(
                        BrokerClient::connect(vec![addr.clone()], config.clone())
                            .await
                            .expect("broker client"),
                    );
                    v.extend(std::iter::repeat_n(client, callers / clients));
                }
                v
            })
        };
        let rounds = brokered(&rounds_addr);
        let window = brokered(&window_addr);
        for count in [1u64, 1000] {
            let size = if count == 1 { "single" } else { "range1000" };
            group.throughput(Throughput::Elements(count));
            if !split {
                group.bench_function(
                    BenchmarkId::new(format!("direct-fast/{size}"), callers),
                    |b| {
                        b.to_async(&rt)
                            .iter_custom(|iters| run(&fast, iters, count))
                    },
                );
                group.bench_function(
                    BenchmarkId::new(format!("direct-fast-uncombined/{size}"), callers),
                    |b| {
                        b.to_async(&rt)
                            .iter_custom(|iters| run(&uncombined, iters, count))
                    },
                );
                group.bench_function(
                    BenchmarkId::new(format!("direct-classic/{size}"), callers),
                    |b| {
                        b.to_async(&rt)
                            .iter_custom(|iters| run(&classic, iters, count))
                    },
                );
            }
            group.bench_function(
                BenchmarkId::new(format!("broker-rounds/{size}"), &param),
                |b| {
                    b.to_async(&rt)
                        .iter_custom(|iters| run(&rounds, iters, count))
                },
            );
            group.bench_function(
                BenchmarkId::new(format!("broker-window/{size}"), &param),
                |b| {
                    b.to_async(&rt)
                        .iter_custom(|iters| run(&window, iters, count))
                },
            );
        }
    }
    group.finish();
    let _ = stop_rounds.send(());
    let _ = stop_window.send(());
}

/// The quorum client a broker uses.
async fn broker_quorum(quorum: &LocalQuorum) -> QuorumClient {
    QuorumClient::connect(ClientConfig::new(quorum.urls()))
        .await
        .expect("broker's quorum client")
}

/// Starts a broker serving from `source` (`pipeline` rounds at once) on a free loopback
/// port: its address, and the sender that stops it.
async fn start_broker<S: RoundSource>(
    source: Arc<S>,
    pipeline: usize,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(broker::run(
        listener,
        source,
        BrokerConfig {
            pipeline,
            ..BrokerConfig::default()
        },
        async move {
            let _ = rx.await;
        },
    ));
    (addr, tx)
}

criterion_group!(benches, ids);
criterion_main!(benches);

//! Deterministic simulation of the quorum protocol (and of the broker's batcher) over
//! the in-memory node model of `idclient::sim`: seeded message loss, delay, reordering,
//! duplication and node crashes, on tokio's paused clock. Every seed's history of ID
//! requests is checked with `idclient::history::check`.
//!
//! - `QLIST_SIM_SEEDS=N` sets how many seeds the quorum simulation runs (default
//!   [`DEFAULT_SEEDS`]); the broker simulation runs a tenth of that.
//! - `QLIST_SIM_SEED=S` runs only seed S (what a failure message tells you to do).
//!
//! A failure prints the seed; the same seed replays the same run (the test
//! `same_seed_replays_exactly` holds the model to that).

use broker::{BrokerConfig, RoundSource};
use idclient::broker_client::{BrokerClient, BrokerClientConfig};
use idclient::history::{check, Event};
use idclient::sim::{SimCluster, SimConfig, SimNode};
use idclient::{Combine, IdError, IdRange, Protocol, QuorumClient};
use rand::Rng;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Seeds per run of the quorum simulation: ~1 ms of CPU each on this 2-core machine
/// (measured: see docs/faults.md), so the default stays a few seconds.
const DEFAULT_SEEDS: u64 = 3000;

/// The broker simulation runs real loopback sockets: costlier per seed.
const BROKER_SEED_DIVISOR: u64 = 10;

fn seeds(divisor: u64) -> Vec<u64> {
    if let Ok(s) = std::env::var("QLIST_SIM_SEED") {
        let seed = s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("QLIST_SIM_SEED={s:?} is not a u64"));
        return vec![seed];
    }
    let n = match std::env::var("QLIST_SIM_SEEDS") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("QLIST_SIM_SEEDS={s:?} is not a count")),
        Err(_) => DEFAULT_SEEDS,
    };
    (0..(n / divisor).max(1)).collect()
}

fn runtime(io: bool) -> tokio::runtime::Runtime {
    let mut b = tokio::runtime::Builder::new_current_thread();
    b.enable_time().start_paused(true);
    if io {
        b.enable_io();
    }
    b.build().expect("build a current-thread tokio runtime")
}

/// A recorded history on the virtual clock (ns since the run started).
#[derive(Clone)]
struct Recorder {
    start: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder {
            start: Instant::now(),
            events: Arc::default(),
        }
    }

    fn ns(&self) -> u64 {
        Instant::now().duration_since(self.start).as_nanos() as u64
    }

    async fn record<F: Future<Output = Result<IdRange, IdError>>>(
        &self,
        request: F,
    ) -> Result<IdRange, IdError> {
        let invoke_ns = self.ns();
        let result = request.await;
        let event = Event {
            invoke_ns,
            return_ns: self.ns(),
            outcome: result.as_ref().ok().copied(),
        };
        self.events.lock().expect("history lock").push(event);
        result
    }

    fn events(&self) -> Vec<Event> {
        self.events.lock().expect("history lock").clone()
    }
}

/// The simulated quorum client as the broker's round source.
struct SimSource(QuorumClient<SimNode>);

impl RoundSource for SimSource {
    fn next_ids_until(
        &self,
        n: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<IdRange, IdError>> + Send {
        self.0.next_ids_until(n, deadline)
    }
}

/// Network and node parameters drawn from the seed: from calm to very lossy.
fn random_config(cluster_rng: &mut impl Rng) -> SimConfig {
    let nodes = [1, 3, 3, 5, 5, 5, 7][cluster_rng.gen_range(0..7)];
    SimConfig {
        nodes,
        loss: [0.0, 0.01, 0.05, 0.2][cluster_rng.gen_range(0..4)],
        duplicate: [0.0, 0.05, 0.3][cluster_rng.gen_range(0..3)],
        max_delay: Duration::from_micros(cluster_rng.gen_range(0..=20_000)),
        reply_timeout: Duration::from_millis(cluster_rng.gen_range(5..=50)),
        amnesia: false,
    }
}

fn client(
    cluster: &SimCluster,
    protocol: Protocol,
    deadline: Duration,
    jitter_seed: u64,
    combine: Combine,
) -> QuorumClient<SimNode> {
    QuorumClient::with_nodes(cluster.nodes(), "current", protocol, deadline)
        .expect("a valid simulated client")
        .with_jitter_seed(jitter_seed)
        .with_combine(combine)
}

/// Which clients a workload runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mix {
    /// Fast and classic, none combining (the amnesia runs keep their pinned behaviour).
    Plain,
    /// Fast and classic; fast ones combine always, when contended, or never.
    Mixed,
    /// Many fast clients that combine (always or when contended), little think time:
    /// batches with several members, under the same faults.
    Combining,
}

/// A combine mode from bits the caller already drew (drawing more from the cluster's RNG
/// would shift every later draw of the seed).
fn combine_mode(bits: u64, mix: Mix) -> Combine {
    match (mix, bits % 3) {
        (Mix::Plain, _) => Combine::Never,
        (_, 0) => Combine::Auto,
        (_, 1) => Combine::Always,
        (Mix::Mixed, _) => Combine::Never,
        (Mix::Combining, _) => Combine::Auto,
    }
}

/// Crashes and restarts nodes at random until `stop` is set. `max_down` bounds how many
/// are down at once (all of them, for the durable model: safety must not depend on it).
async fn fault_schedule(
    cluster: SimCluster,
    max_down: usize,
    mean_gap: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let n = cluster.config().nodes;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let (gap, victim, crash) = cluster.with_rng(|r| {
            (
                Duration::from_nanos(r.gen_range(0..=2 * mean_gap.as_nanos() as u64)),
                r.gen_range(0..n),
                r.gen_bool(0.5),
            )
        });
        tokio::time::sleep(gap).await;
        let down = (0..n).filter(|&i| !cluster.is_up(i)).count();
        if crash && down < max_down {
            cluster.crash(victim);
        } else {
            cluster.restart(victim);
        }
    }
    for i in 0..n {
        cluster.restart(i);
    }
}

struct Outcome {
    events: Vec<Event>,
    ok: usize,
    /// Requests served by a batch another client led.
    combined: u64,
}

/// FNV-1a over a history: two runs of one seed print the same digest when they replay.
fn digest(events: &[Event]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for e in events {
        let (lo, hi) = e.outcome.map_or((0, 0), |r| (r.lo, r.hi));
        for v in [e.invoke_ns, e.return_ns, lo, hi] {
            for b in v.to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    h
}

/// Several concurrent direct clients (fast and classic, single IDs and ranges, some
/// restarting with a cold `last_known`; see [`Mix`]) against a faulty simulated quorum.
///
/// Returns how many requests a batch led by another client served.
async fn quorum_workload(
    cluster: SimCluster,
    recorder: Recorder,
    clients: usize,
    requests: usize,
    mix: Mix,
) -> u64 {
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (cluster, recorder) = (cluster.clone(), recorder.clone());
        let (protocol, deadline, ranges, jitter) = cluster.with_rng(|r| {
            (
                if mix == Mix::Combining || r.gen_bool(0.5) {
                    Protocol::Fast
                } else {
                    Protocol::Classic
                },
                Duration::from_millis(r.gen_range(20..=500)),
                r.gen_bool(0.5),
                r.gen::<u64>(),
            )
        });
        tasks.push(tokio::spawn(async move {
            let combine = combine_mode(jitter >> 7, mix);
            let max_think = if mix == Mix::Combining { 1_000 } else { 5_000 };
            let mut qc = client(&cluster, protocol, deadline, jitter ^ c as u64, combine);
            let mut served = 0;
            for _ in 0..requests {
                let (count, think, restart) = cluster.with_rng(|r| {
                    (
                        if ranges { r.gen_range(1..=1000) } else { 1 },
                        Duration::from_micros(r.gen_range(0..=max_think)),
                        r.gen_bool(0.05),
                    )
                });
                if restart {
                    // A restarted process: no memory of the register, a fresh guess.
                    served += qc.counters().combined;
                    qc = client(
                        &cluster,
                        protocol,
                        deadline,
                        jitter.wrapping_add(1),
                        combine,
                    );
                }
                let _ = recorder
                    .record(qc.next_ids_until(count, Instant::now() + deadline))
                    .await;
                tokio::time::sleep(think).await;
            }
            served + qc.counters().combined
        }));
    }
    let mut served = 0;
    for t in tasks {
        served += t.await.expect("client task");
    }
    served
}

/// One seed of the quorum simulation.
fn run_quorum_seed(seed: u64, amnesia: bool) -> Outcome {
    run_quorum_seed_with(seed, amnesia, if amnesia { Mix::Plain } else { Mix::Mixed })
}

fn run_quorum_seed_with(seed: u64, amnesia: bool, mix: Mix) -> Outcome {
    runtime(false).block_on(async move {
        let mut config = random_config(&mut config_rng(seed));
        config.amnesia = amnesia;
        if amnesia {
            // The negative case: crashes frequent enough that a majority can be wiped.
            config.nodes = 3;
        }
        let cluster = SimCluster::new(config, seed);
        let recorder = Recorder::new();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let n = cluster.config().nodes;
        let faults = tokio::spawn(fault_schedule(
            cluster.clone(),
            n,
            Duration::from_millis(if amnesia { 5 } else { 30 }),
            stop.clone(),
        ));
        let most = if mix == Mix::Combining { 10 } else { 5 };
        let (clients, requests) =
            cluster.with_rng(|r| (r.gen_range(2..=most), r.gen_range(10..=30)));
        let combined =
            quorum_workload(cluster.clone(), recorder.clone(), clients, requests, mix).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        faults.await.expect("fault task");
        let events = recorder.events();
        let ok = events.iter().filter(|e| e.outcome.is_some()).count();
        Outcome {
            events,
            ok,
            combined,
        }
    })
}

/// The RNG that draws a seed's network parameters (separate from the cluster's, which
/// is seeded with the seed itself).
fn config_rng(seed: u64) -> rand::rngs::StdRng {
    <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed ^ 0x5eed_c0f1_9000_0001)
}

/// What a run of many seeds added up to.
struct Totals {
    seeds: usize,
    ok: usize,
    total: usize,
    combined: u64,
}

/// Runs `run` for every seed and checks each history; a violation panics with the seed
/// and the command that replays it (`name` is the test's name filter).
fn check_seeds(label: &str, name: &str, divisor: u64, run: impl Fn(u64) -> Outcome) -> Totals {
    let started = std::time::Instant::now();
    let seeds = seeds(divisor);
    let mut t = Totals {
        seeds: seeds.len(),
        ok: 0,
        total: 0,
        combined: 0,
    };
    for &seed in &seeds {
        let out = run(seed);
        if let Err(v) = check(&out.events) {
            panic!("{label} seed {seed}: {v}\nreplay with QLIST_SIM_SEED={seed} cargo test --release --test sim {name}");
        }
        t.ok += out.ok;
        t.total += out.events.len();
        t.combined += out.combined;
        if seeds.len() == 1 {
            eprintln!(
                "{label} seed {seed}: history digest {:016x}",
                digest(&out.events)
            );
        }
    }
    let Totals {
        ok,
        total,
        combined,
        ..
    } = t;
    eprintln!("{label}: {} seeds, {total} requests, {ok} succeeded ({combined} in another client's batch), in {:?}", seeds.len(), started.elapsed());
    t
}

#[test]
fn quorum_protocol_is_safe_under_simulated_faults() {
    let Totals { ok, total, .. } = check_seeds("quorum", "quorum_protocol", 1, |seed| {
        run_quorum_seed(seed, false)
    });
    // Not vacuous: most requests get IDs despite the faults.
    assert!(
        ok * 2 > total,
        "only {ok} of {total} requests succeeded: the model is too hostile to test anything"
    );
}

/// Seeds of the combining workload per seed of the quorum simulation: a third as many.
const COMBINING_SEED_DIVISOR: u64 = 3;

#[test]
fn combined_rounds_are_safe_under_simulated_faults() {
    let Totals {
        seeds,
        ok,
        total,
        combined,
    } = check_seeds(
        "combining",
        "combined_rounds",
        COMBINING_SEED_DIVISOR,
        |seed| run_quorum_seed_with(seed, false, Mix::Combining),
    );
    // Up to 10 clients contend under the same faults: about half the requests succeed,
    // with or without combining (measured: 56,677 of 116,223 combining, 56,727 never).
    assert!(
        ok * 3 > total,
        "only {ok} of {total} requests succeeded: the model is too hostile to test anything"
    );
    if seeds > 1 {
        assert!(
            combined * 20 > ok as u64,
            "only {combined} of {ok} successful requests rode in another client's batch"
        );
    }
}

#[test]
fn same_seed_replays_exactly() {
    for seed in [1, 7, 42] {
        let a = run_quorum_seed(seed, false).events;
        let b = run_quorum_seed(seed, false).events;
        assert!(!a.is_empty());
        assert_eq!(a, b, "seed {seed} did not replay identically");
        let a = run_quorum_seed_with(seed, false, Mix::Combining).events;
        let b = run_quorum_seed_with(seed, false, Mix::Combining).events;
        assert_eq!(a, b, "combining seed {seed} did not replay identically");
    }
}

/// A seed (found once by the loop below, then pinned) whose amnesiac nodes make the
/// quorum hand out a duplicate.
const AMNESIA_SEED: u64 = 0;

/// Seeds the amnesia loop tries; a violation shows up within the first few.
const AMNESIA_SEEDS: u64 = 200;

#[test]
fn amnesia_produces_a_duplicate_that_the_checker_catches() {
    let out = run_quorum_seed(AMNESIA_SEED, true);
    assert!(
        check(&out.events).is_err(),
        "pinned seed {AMNESIA_SEED} no longer produces a violation under amnesia"
    );
    let mut found = Vec::new();
    for seed in 0..AMNESIA_SEEDS {
        if let Err(v) = check(&run_quorum_seed(seed, true).events) {
            if found.is_empty() {
                eprintln!("seed {seed}: {v}");
            }
            found.push(seed);
        }
    }
    eprintln!(
        "amnesia: {} of {AMNESIA_SEEDS} seeds violated safety (first: {:?})",
        found.len(),
        found.first()
    );
    assert!(
        !found.is_empty(),
        "no seed out of {AMNESIA_SEEDS} produced a violation under amnesia"
    );
}

/// One seed of the broker simulation: two `broker::run` servers over the simulated
/// quorum on loopback sockets, broker clients with failover, direct clients alongside,
/// node crashes, and one broker stopped mid-run. Everything lands in one history.
fn run_broker_seed(seed: u64) -> Outcome {
    runtime(true).block_on(async move {
        let mut config = random_config(&mut config_rng(seed));
        // Keep rounds short and available often: the point is the batcher's ordering.
        config.nodes = config.nodes.max(3);
        let cluster = SimCluster::new(config, seed);
        let recorder = Recorder::new();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let n = cluster.config().nodes;
        let faults = tokio::spawn(fault_schedule(
            cluster.clone(),
            n / 2 + 1,
            Duration::from_millis(30),
            stop.clone(),
        ));
        let mut brokers = Vec::new();
        let mut addrs = Vec::new();
        for b in 0..2u64 {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind a loopback port");
            addrs.push(listener.local_addr().expect("local addr").to_string());
            let source = Arc::new(SimSource(client(
                &cluster,
                Protocol::Fast,
                Duration::from_secs(1),
                seed ^ b,
                Combine::Auto,
            )));
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(broker::run(
                listener,
                source,
                BrokerConfig::default(),
                async move {
                    let _ = rx.await;
                },
            ));
            brokers.push((tx, task));
        }
        let mut tasks = Vec::new();
        for c in 0..4u64 {
            let (cluster, recorder, addrs) = (cluster.clone(), recorder.clone(), addrs.clone());
            tasks.push(tokio::spawn(async move {
                let config = BrokerClientConfig {
                    deadline: Duration::from_millis(500),
                    connections: 1,
                    ..Default::default()
                };
                let bc = BrokerClient::connect(addrs, config)
                    .await
                    .expect("connect to a simulated broker");
                for _ in 0..20 {
                    let (count, think) = cluster.with_rng(|r| {
                        (
                            r.gen_range(1..=10),
                            Duration::from_micros(r.gen_range(0..=3_000)),
                        )
                    });
                    let _ = recorder
                        .record(
                            bc.next_ids_until(count, Instant::now() + Duration::from_millis(500)),
                        )
                        .await;
                    tokio::time::sleep(think).await;
                }
                c
            }));
        }
        // Direct clients on the same quorum at the same time.
        let direct = tokio::spawn(quorum_workload(
            cluster.clone(),
            recorder.clone(),
            2,
            15,
            Mix::Mixed,
        ));
        // Stop the first broker mid-run: its clients fail over to the second.
        let stop_after = cluster.with_rng(|r| Duration::from_millis(r.gen_range(5..=60)));
        tokio::time::sleep(stop_after).await;
        let (first_stop, first_task) = brokers.remove(0);
        let _ = first_stop.send(());
        first_task.await.expect("broker task").expect("broker run");
        for t in tasks {
            t.await.expect("broker client task");
        }
        let combined = direct.await.expect("direct clients");
        for (tx, task) in brokers {
            let _ = tx.send(());
            task.await.expect("broker task").expect("broker run");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        faults.await.expect("fault task");
        let events = recorder.events();
        let ok = events.iter().filter(|e| e.outcome.is_some()).count();
        Outcome {
            events,
            ok,
            combined,
        }
    })
}

#[test]
fn broker_batcher_is_safe_under_simulated_faults() {
    let started = std::time::Instant::now();
    let (mut ok, mut total) = (0, 0);
    let seeds = seeds(BROKER_SEED_DIVISOR);
    for &seed in &seeds {
        let out = run_broker_seed(seed);
        if let Err(v) = check(&out.events) {
            panic!("broker seed {seed}: {v}\nreplay with QLIST_SIM_SEED={seed} cargo test --release --test sim broker");
        }
        ok += out.ok;
        total += out.events.len();
        if seeds.len() == 1 {
            eprintln!(
                "broker seed {seed}: history digest {:016x}",
                digest(&out.events)
            );
        }
    }
    eprintln!(
        "broker: {} seeds, {total} requests, {ok} succeeded, in {:?}",
        seeds.len(),
        started.elapsed()
    );
    assert!(
        ok * 2 > total,
        "only {ok} of {total} requests succeeded: the model is too hostile to test anything"
    );
}

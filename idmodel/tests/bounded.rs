//! The exhaustive checks (docs/model.md, "Bounds"): every interleaving of the model's
//! steps within the bounds, with every safety property checked in every state reached.

use idmodel::{props, Config};
use stateright::{Checker, Model};
use std::time::Instant;

/// The depth of the bounded check `cargo test` runs (steps from the initial state).
pub const DEPTH: usize = 12;

fn check(cfg: Config, depth: usize, what: &str) {
    let started = Instant::now();
    let checker = cfg
        .checker()
        .threads(2)
        .target_max_depth(depth)
        .spawn_bfs()
        .join();
    eprintln!(
        "{what}: {} states ({} unique), depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    for p in props::SAFETY {
        checker.assert_no_discovery(p);
    }
}

/// 2 brokers, 3 nodes, 2 clients: no interleaving within [`DEPTH`] steps breaks a
/// safety property (elections, terms, first rounds; a first answer takes 16 steps,
/// the long run below).
#[test]
fn two_brokers_three_nodes_two_clients() {
    check(Config::small(), DEPTH, "bounded");
}

/// From broker 0 leading term 1 with a live window (client 0 served): every
/// interleaving of the next [`DEEP`] steps, confirmations and a second election included.
pub const DEEP: usize = 10;

#[test]
fn from_a_leader_serving_a_window() {
    let cfg = Config::small();
    let s = cfg
        .play(&cfg.initial(), &idmodel::script::leader_served())
        .expect("the script plays");
    let c = cfg
        .clone()
        .starting_at(s)
        .checker()
        .threads(2)
        .target_max_depth(DEEP)
        .spawn_bfs()
        .join();
    eprintln!(
        "from a leader: {} states ({} unique)",
        c.state_count(),
        c.unique_state_count()
    );
    for p in props::SAFETY {
        c.assert_no_discovery(p);
    }
    c.assert_any_discovery(props::FROM_WINDOW);
}

/// The long run: the same from the start to depth 16 (first answers reached), which
/// takes minutes (BENCHMARKS.md, "Model checking: state counts").
#[test]
#[ignore]
fn long_two_brokers_to_depth_16() {
    let started = Instant::now();
    let checker = Config::small()
        .checker()
        .threads(2)
        .target_max_depth(16)
        .spawn_bfs()
        .join();
    eprintln!(
        "long: {} states ({} unique), {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        started.elapsed().as_secs_f64()
    );
    for p in props::SAFETY {
        checker.assert_no_discovery(p);
    }
    checker.assert_any_discovery(props::ANSWERED);
}

/// The depth of the 3-broker long run ([`long_three_brokers`]): 11 steps, 10 GB of
/// checker memory (14 would need about twice that); `IDMODEL_DEPTH`
/// overrides it (to measure how the state count grows).
pub const THREE_DEPTH: usize = 13;

/// 3 brokers, 3 nodes, 2 clients, every other bound as [`Config::small`]: from the start
/// to [`THREE_DEPTH`] (BENCHMARKS.md, "Model checking: state counts").
#[test]
#[ignore]
fn long_three_brokers() {
    let depth = std::env::var("IDMODEL_DEPTH")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(THREE_DEPTH);
    let mut cfg = Config::small();
    cfg.brokers = 3;
    check(cfg, depth, "three brokers");
}

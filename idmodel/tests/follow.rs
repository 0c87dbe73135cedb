//! The follow model (docs/model.md, "The follow model"): producers publishing with claims
//! and a follower emitting up to the watermark, searched exhaustively within the bounds
//! (no depth bound: the state space is finite), and each guard removed on its own.

use idmodel::follow::{broken, props, Action, Config, Mutant, State};
use stateright::{Checker, HasDiscoveries, Model, Path};
use std::time::Instant;

/// Unique states the correct model's search must at least reach, so a change that
/// disables steps cannot make the check pass by exploring little.
const MIN_STATES: usize = 100_000;

/// The path, one action a line (`--nocapture`).
fn print_trace(title: &str, path: Path<State, Action>) {
    let actions = path.into_actions();
    eprintln!("{title}, in {} steps:", actions.len());
    for (i, a) in actions.iter().enumerate() {
        eprintln!("  {i:2}. {a:?}");
    }
}

/// Every state within `cfg`'s bounds; with `stop`, only until a property breaks.
fn search(cfg: Config, what: &str, stop: bool) -> impl Checker<Config> {
    let started = Instant::now();
    // A search for a counterexample runs on one thread: BFS then gives a shortest one,
    // the same every run.
    let mut b = cfg.checker().threads(if stop { 1 } else { 2 });
    if stop {
        b = b.finish_when(HasDiscoveries::AnyFailures);
    }
    let c = b.spawn_bfs().join();
    eprintln!(
        "{what}: {} states ({} unique), depth {}, {:.1} s",
        c.state_count(),
        c.unique_state_count(),
        c.max_depth(),
        started.elapsed().as_secs_f64()
    );
    c
}

#[track_caller]
fn safe(c: &impl Checker<Config>) {
    for p in props::SAFETY {
        c.assert_no_discovery(p);
    }
    c.assert_any_discovery(props::EARLY);
    c.assert_any_discovery(props::COMPLETE);
    assert!(
        c.unique_state_count() >= MIN_STATES,
        "{}",
        c.unique_state_count()
    );
}

/// Every interleaving within [`Config::small`]: no safety property breaks, the follower
/// emits before the end and eventually every item. Pipelined answers stamped in the
/// order they arrive can leave a shard's IDs out of seq order: the checker shows how
/// (docs/model.md: the contract must say which discipline keeps a shard in order).
#[test]
fn the_follow_protocol_is_safe_within_the_bounds() {
    let c = search(Config::small(), "follow", false);
    safe(&c);
    print_trace(
        props::SHARD_DISORDER,
        c.assert_any_discovery(props::SHARD_DISORDER),
    );
}

/// Idle producers taking a fresh ID to move their claims ([`Config::idle`]).
#[test]
fn fresh_ids_of_idle_producers_are_safe() {
    let c = search(Config::idle(), "follow idle", false);
    safe(&c);
}

/// One request at a time per producer (the next begins after the last returned or timed
/// out): a shard's IDs follow its seq, and the guards of [`Mutant::ClaimInFlight`] and
/// [`Mutant::ClaimLastWritten`] are implied (every request in flight began after the
/// claimed ID returned), so removing them breaks nothing.
#[test]
fn sequential_requests_keep_shard_order_and_imply_two_guards() {
    let cfg = Config {
        pipeline: 1,
        ..Config::small()
    };
    let c = search(cfg.clone(), "follow, sequential", false);
    for p in props::SAFETY.into_iter().chain([props::SHARD_DISORDER]) {
        c.assert_no_discovery(p);
    }
    for m in [Mutant::ClaimInFlight, Mutant::ClaimLastWritten] {
        let c = search(
            cfg.clone().with_mutant(m),
            &format!("{m:?}, sequential"),
            false,
        );
        for p in props::SAFETY {
            c.assert_no_discovery(p);
        }
    }
}

#[track_caller]
fn caught(m: Mutant, property: &'static str) {
    let c = search(Config::small().with_mutant(m), &format!("{m:?}"), true);
    let path = c.assert_any_discovery(property);
    assert!(broken(path.last_state()).contains(&property));
    print_trace(&format!("{m:?} breaks \"{property}\""), path);
}

#[test]
fn claiming_with_a_request_in_flight_is_caught() {
    caught(Mutant::ClaimInFlight, props::PREFIX);
}

#[test]
fn a_checkpoint_before_its_segment_is_caught() {
    caught(Mutant::CheckpointBeforeSegment, props::SEGMENTS_FOUND);
}

#[test]
fn claiming_the_last_written_id_is_caught() {
    caught(Mutant::ClaimLastWritten, props::PREFIX);
}

#[test]
fn ignoring_a_shard_without_a_checkpoint_is_caught() {
    caught(Mutant::IgnoreShardWithoutCheckpoint, props::PREFIX);
}

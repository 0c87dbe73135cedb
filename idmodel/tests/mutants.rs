//! Each guard removed on its own: the checker must find the counterexample it prevents.

use broker::serve::rules::{Mutant, Rules};
use idmodel::script::{answer, ask, elect, leader_served, to_nodes};
use idmodel::{broken, props, Action, Config, Step};
use stateright::{Checker, HasDiscoveries, Model};

/// Broker 0 led term 1 and served client 0 (its window holds the next ID); broker 1
/// then won term 2 and served client 1 by a round on nodes 1 and 2 (a retry: its first
/// guess lost to broker 0's range).
fn deposed_leader_with_a_window(cfg: &Config) -> idmodel::State {
    let mut steps: Vec<Step> = leader_served();
    // Its first candidacy finds term 1 on node 1 and follows it; the second wins term 2.
    steps.push(Step::Do(Action::Watch(1)));
    steps.extend(to_nodes(1, &[1, 2]));
    steps.push(Step::Do(Action::Stand(1)));
    steps.extend(to_nodes(1, &[1, 2]));
    steps.extend(elect(1, &[1, 2]));
    steps.extend(ask(1, 1));
    steps.extend(to_nodes(1, &[1, 0])); // rejected: broker 0 holds 1..=2
                                        // The retry above it (node 2 first takes the first guess, still in flight).
    steps.extend(to_nodes(1, &[1, 2, 2]));
    steps.push(answer(1, 1));
    cfg.play(&cfg.initial(), &steps).expect("the script plays")
}

#[track_caller]
fn finds(mutant: Mutant, property: &'static str, depth: usize) {
    let mut cfg = Config::small().with_rules(Rules::with(mutant));
    cfg.requests = 2;
    let s = deposed_leader_with_a_window(&cfg);
    let c = cfg
        .starting_at(s)
        .checker()
        .threads(2)
        .target_max_depth(depth)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let path = c.assert_any_discovery(property);
    assert!(broken(path.last_state()).contains(&property));
}

#[test]
fn serving_before_the_confirmation_breaks_real_time_order() {
    finds(Mutant::ServeBeforeConfirm, props::LINEARIZABLE, 8);
}

#[test]
fn keeping_a_dead_window_breaks_real_time_order() {
    finds(Mutant::KeepDeadWindow, props::LINEARIZABLE, 10);
}

#[test]
fn admitting_while_not_leading_is_caught() {
    finds(Mutant::AdmitWhileNotLeading, props::STEPPED_DOWN, 8);
}

/// The same start with every guard kept: a deposed leader still holding a window
/// (etcd #12528, tikv/pd #4884) hands out nothing out of order, at the depth that finds
/// each mutant above.
#[test]
fn a_deposed_leader_with_a_window_stays_safe() {
    let mut cfg = Config::small();
    cfg.requests = 2;
    let s = deposed_leader_with_a_window(&cfg);
    let c = cfg
        .starting_at(s)
        .checker()
        .threads(2)
        .target_max_depth(10)
        .spawn_bfs()
        .join();
    for p in props::SAFETY {
        c.assert_no_discovery(p);
    }
    assert!(c.unique_state_count() > 1000, "{}", c.unique_state_count());
}

//! Each guard removed on its own: the checker must find the counterexample it prevents.

use broker::serve::rules::{Mutant, Rules};
use idmodel::script::{
    deposed_leader, minority_claim_in_flight, stale_window_after_failover, term_past_its_leader,
};
use idmodel::{broken, props, Action, Config, Step};
use stateright::{Checker, HasDiscoveries, Model, Path};

fn deposed_leader_with_a_window(cfg: &Config) -> idmodel::State {
    cfg.play(&cfg.initial(), &deposed_leader())
        .expect("the script plays")
}

/// The counterexample, one action a line after the scripted start (`--nocapture`).
fn print_trace(mutant: Mutant, property: &str, path: Path<idmodel::State, Action>) {
    let actions = path.into_actions();
    eprintln!(
        "{mutant:?} breaks \"{property}\" in {} steps:",
        actions.len()
    );
    for (i, a) in actions.iter().enumerate() {
        eprintln!("  {i:2}. {a:?}");
    }
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
    print_trace(mutant, property, path);
}

#[test]
fn serving_before_the_confirmation_breaks_real_time_order() {
    finds(Mutant::ServeBeforeConfirm, props::LINEARIZABLE, 8);
}

#[test]
fn keeping_a_dead_window_breaks_real_time_order() {
    finds(Mutant::KeepDeadWindow, props::LINEARIZABLE, 9);
}

#[test]
fn admitting_while_not_leading_is_caught() {
    finds(Mutant::AdmitWhileNotLeading, props::STEPPED_DOWN, 8);
}

/// The same start with every guard kept: a deposed leader still holding a window
/// (etcd #12528, tikv/pd #4884) hands out nothing out of order, at the depth that finds
/// each mutant above (9: the deepest of them, `KeepDeadWindow`, takes 7 steps, and
/// stateright's depth 9 covers 7 steps from the start).
#[test]
fn a_deposed_leader_with_a_window_stays_safe() {
    let mut cfg = Config::small();
    cfg.requests = 2;
    let s = deposed_leader_with_a_window(&cfg);
    let c = cfg
        .starting_at(s)
        .checker()
        .threads(2)
        .target_max_depth(9)
        .spawn_bfs()
        .join();
    eprintln!(
        "deposed leader: {} states ({} unique)",
        c.state_count(),
        c.unique_state_count()
    );
    for p in props::SAFETY {
        c.assert_no_discovery(p);
    }
    assert!(c.unique_state_count() > 1000, "{}", c.unique_state_count());
}

/// From `steps` (played with every guard kept), BFS to `depth`: with every guard kept no
/// safety property breaks; with `mutant` the checker finds `property` broken. The first
/// half is what makes the test about that one guard.
#[track_caller]
fn only_the_mutant_breaks(
    cfg: Config,
    steps: &[Step],
    mutant: Mutant,
    property: &'static str,
    depth: usize,
) {
    let start = cfg.play(&cfg.initial(), steps).expect("the script plays");
    let kept = cfg
        .clone()
        .starting_at(start.clone())
        .checker()
        .threads(2)
        .target_max_depth(depth)
        .spawn_bfs()
        .join();
    for p in props::SAFETY {
        kept.assert_no_discovery(p);
    }
    assert!(
        kept.unique_state_count() > 10,
        "{}",
        kept.unique_state_count()
    );
    let c = cfg
        .with_rules(Rules::with(mutant))
        .starting_at(start)
        .checker()
        .threads(2)
        .target_max_depth(depth)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let path = c.assert_any_discovery(property);
    assert!(broken(path.last_state()).contains(&property));
    print_trace(mutant, property, path);
}

/// A follower of term 2 that knows only term 1's leader (and a second refresh allowed,
/// so that leader's heartbeat can still be news): adopting it takes the term back.
#[test]
fn ignoring_the_heartbeat_term_takes_a_term_back() {
    let mut cfg = Config::small();
    cfg.max_seq = 2;
    let steps = term_past_its_leader();
    only_the_mutant_breaks(
        cfg,
        &steps,
        Mutant::IgnoreHeartbeatTerm,
        props::TERMS_GROW,
        8,
    );
}

/// The same follower asked for an ID: it must not send the client to term 1's leader.
#[test]
fn redirecting_to_an_older_term_names_a_superseded_leader() {
    let steps = term_past_its_leader();
    only_the_mutant_breaks(
        Config::small(),
        &steps,
        Mutant::RedirectToOlderTerm,
        props::REDIRECT_CURRENT,
        4,
    );
}

/// Broker 1's claim of term 1 reaches node 2 after broker 0 won term 1 on nodes 0 and 1:
/// one accept of three. Leading on it, broker 1 serves client 1 in term 1 too.
#[test]
fn granting_without_a_majority_gives_a_term_two_leaders() {
    let steps = minority_claim_in_flight();
    only_the_mutant_breaks(
        Config::small(),
        &steps,
        Mutant::GrantWithoutMajority,
        props::ONE_PER_TERM,
        8,
    );
}

/// Broker 0, deposed without knowing it, closes a batch for client 0's third request
/// after client 1 was returned 4: only a fresh read sees 6 and kills the window; the
/// last read (3) would confirm ID 3.
#[test]
fn accepting_a_stale_confirmation_breaks_real_time_order() {
    let mut cfg = Config::small();
    cfg.window = 2;
    cfg.requests = 3;
    let steps = stale_window_after_failover();
    only_the_mutant_breaks(
        cfg,
        &steps,
        Mutant::AcceptStaleConfirm,
        props::LINEARIZABLE,
        6,
    );
}

//! Liveness, bounded (docs/model.md, "Liveness"): from every state the exhaustive search
//! reaches, faults included, once the faults stop a request is answered within
//! [`QUIET_STEPS`] steps of a fair fault-free schedule ([`Config::quiet_run`]). The
//! check is the `always` property [`props::LIVE`], so a state that fails it comes with
//! the path that led there.

use idmodel::script::to_nodes;
use idmodel::{props, Action, Config, Role, Sabotage, State, Step};
use stateright::{Checker, HasDiscoveries, Model};
use std::time::Instant;

/// Steps a quiet run may take to hand out an ID (deliveries count one each; most are a
/// client's redirects while no broker leads). The longest any state needs: from the
/// start, 111 to 120 (the check fails at 110, passes at 120); from a leader, 81 to 100.
pub const QUIET_STEPS: usize = 150;

/// The depth of the search from the start (stateright's depth `d` covers `d - 2` steps).
pub const DEPTH: usize = 12;

/// The depth of the search from a leader serving a window.
pub const DEEP: usize = 9;

/// The checker, run with the liveness property to `depth`, stopping at the first failure.
fn check(mut cfg: Config, depth: usize, what: &str) -> impl Checker<Config> {
    cfg.liveness = Some(QUIET_STEPS);
    let started = Instant::now();
    let c = cfg
        .checker()
        .threads(2)
        .target_max_depth(depth)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    eprintln!(
        "{what}: {} states ({} unique), {:.1} s",
        c.state_count(),
        c.unique_state_count(),
        started.elapsed().as_secs_f64()
    );
    c
}

/// What the quiet run from a state that failed did, for the failure message.
fn quiet_story(cfg: &Config, s: &State) -> String {
    let run = cfg.quiet_run(s, QUIET_STEPS);
    let mut out = format!(
        "the quiet run took {} steps, answered: {}\n",
        run.actions.len(),
        run.answered
    );
    for a in run.actions.iter().take(40) {
        out.push_str(&format!("  {a:?}\n"));
    }
    out.push_str(&format!("and ended in {:#?}", run.end));
    out
}

/// Every state reached keeps every safety property and recovers once faults stop.
#[track_caller]
fn recovers(cfg: Config, depth: usize, what: &str) {
    let c = check(cfg.clone(), depth, what);
    for p in props::SAFETY {
        c.assert_no_discovery(p);
    }
    if let Some(path) = c.discovery(props::LIVE) {
        let s = path.last_state().clone();
        panic!(
            "{what}: stuck after {:?}\n{}",
            path.into_actions(),
            quiet_story(&cfg, &s)
        );
    }
}

/// 2 brokers, 3 nodes, 2 clients: from every state within [`DEPTH`] of the start
/// (elections, terms, crashes, lost answers, first rounds), a request is answered once
/// faults stop.
#[test]
fn from_the_start_every_state_recovers_once_faults_stop() {
    recovers(Config::small(), DEPTH, "liveness from the start");
}

/// From broker 0 leading term 1 with a live window: confirmation reads and rounds that
/// lost answers, a crashed node, a second election, each left to recover.
#[test]
fn from_a_leader_serving_a_window_every_state_recovers() {
    let cfg = Config::small();
    let s = cfg
        .play(&cfg.initial(), &idmodel::script::leader_served())
        .expect("the script plays");
    recovers(cfg.starting_at(s), DEEP, "liveness from a leader");
}

/// Node 2 crashed; brokers 0 and 1 both read the term register empty and sent their
/// claims of term 1, none delivered yet.
fn two_claims_one_node_down() -> Vec<Step> {
    let mut s = vec![Step::Do(Action::Crash(2))];
    for b in 0..2 {
        s.push(Step::Do(Action::Watch(b)));
        s.extend(to_nodes(b, &[0, 1]));
        s.push(Step::Do(Action::Stand(b)));
        s.extend(to_nodes(b, &[0, 1])); // register 0: claim 1
    }
    s
}

/// The claims may split (node 0 takes broker 0's, node 1 broker 1's): neither has a
/// majority and neither is refused by one, with node 2 down for good. Each candidate's
/// claim times out, it stands again and one wins: the check passes. With a claim that
/// never times out ([`Sabotage::ClaimWithoutTimeout`]) both wait for good, no request is
/// ever answered, and the check finds that state.
#[test]
fn a_claim_that_never_times_out_is_found_stuck() {
    let cfg = Config::small();
    let start = cfg
        .play(&cfg.initial(), &two_claims_one_node_down())
        .expect("the script plays");
    recovers(
        cfg.clone().starting_at(start.clone()),
        DEEP,
        "liveness, split claims",
    );

    let mut broken = cfg;
    broken.sabotage = Some(Sabotage::ClaimWithoutTimeout);
    let broken = broken.starting_at(start);
    let c = check(
        broken.clone(),
        DEEP,
        "liveness, split claims, no claim timeout",
    );
    let path = c.assert_any_discovery(props::LIVE);
    let stuck = path.last_state().clone();
    eprintln!("stuck after {:?}", path.into_actions());
    let run = broken.quiet_run(&stuck, QUIET_STEPS);
    assert!(!run.answered, "{}", quiet_story(&broken, &stuck));
    // Not a bound too short: both brokers are still candidates at its end, waiting on
    // claims nothing will answer, while the clients are redirected in circles.
    assert!(
        run.end.brokers.iter().all(|b| b.role == Role::Candidate),
        "{}",
        quiet_story(&broken, &stuck)
    );
}

//! Each guard removed on its own: the checker must find the counterexample it prevents.

use broker::serve::rules::{Mutant, Rules};
use idmodel::script::{
    ask, deposed_leader, minority_claim_in_flight, stale_window_after_failover,
    term_past_its_leader, to_nodes,
};
use idmodel::{broken, props, Action, Config, Node, Role, Stage, Step};
use stateright::{Checker, HasDiscoveries, Model, Path, Property};
use std::time::Instant;

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
    let kept = search(&cfg, &start, depth);
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

// ---- The guards whose removal breaks no safety property (docs/model.md, "Mutants") ----

/// BFS from `start` to `depth` under `cfg` (every state: nothing stops it early).
fn search(cfg: &Config, start: &idmodel::State, depth: usize) -> impl Checker<Config> {
    let started = Instant::now();
    let c = cfg
        .clone()
        .starting_at(start.clone())
        .checker()
        .threads(2)
        .target_max_depth(depth)
        .spawn_bfs()
        .join();
    eprintln!(
        "{:?}, depth {depth}: {} states ({} unique), {:.1} s",
        cfg.rules.mutant,
        c.state_count(),
        c.unique_state_count(),
        started.elapsed().as_secs_f64()
    );
    c
}

/// Plays `to_guard` to the step where the guard decides and `at_guard` through it,
/// under every guard and under `mutant`, and checks what `differs` says the guard
/// changes. Then BFS from the mutant's state right after the guard to `depth`, with
/// the liveness property ([`props::LIVE`], 150 quiet steps as in liveness.rs) too:
/// nothing breaks. The first half shows that the state searched is one the guard
/// would have prevented, so the search is about that guard.
#[track_caller]
fn breaks_nothing(
    cfg: Config,
    to_guard: &[Step],
    at_guard: &[Step],
    mutant: Mutant,
    differs: impl Fn(&idmodel::State, &idmodel::State) -> bool,
    depth: usize,
) {
    let before = cfg
        .play(&cfg.initial(), to_guard)
        .expect("the script plays");
    let kept = cfg.play(&before, at_guard).expect("the guard step plays");
    let mut broken_cfg = cfg.with_rules(Rules::with(mutant));
    let start = broken_cfg
        .play(&before, at_guard)
        .expect("the guard step plays with the mutant");
    assert!(
        differs(&kept, &start),
        "{mutant:?} changes nothing here: {:#?}\n{:#?}",
        kept.brokers,
        kept.net
    );
    broken_cfg.liveness = Some(150);
    let c = search(&broken_cfg, &start, depth);
    for p in props::SAFETY.iter().chain([&props::LIVE]) {
        c.assert_no_discovery(p);
    }
    assert!(c.unique_state_count() > 1000, "{}", c.unique_state_count());
}

/// Broker 1 (term 2) refreshed its heartbeat on nodes 1 and 2; then broker 0, the
/// deposed leader of term 1 with a window, refreshes and node 1 answers with term 2's
/// heartbeat. With the guard broker 0 steps down; without it
/// ([`Mutant::IgnoreHigherTermOnRefresh`]) it keeps leading term 1 (until its refresh
/// is overdue) and may admit requests and serve them from its window.
///
/// Nothing breaks, within depth 8 of that state, safety or liveness: leading is not
/// what makes serving safe (the confirmation read is: a deposed leader that does not
/// know it, `a_deposed_leader_with_a_window_stays_safe`, is the same case), and a
/// leader whose refresh a majority refuses steps down when it is overdue, and one whose
/// window died when it reads the term register. The step-down is promptness: it stops
/// a deposed leader from admitting requests that then need a fresh round.
#[test]
fn ignoring_a_higher_term_on_refresh_breaks_nothing() {
    let mut cfg = Config::small();
    cfg.requests = 2;
    let mut to_guard = deposed_leader();
    to_guard.push(Step::Do(Action::Refresh(1)));
    to_guard.extend(to_nodes(1, &[1, 2]));
    to_guard.push(Step::Do(Action::Refresh(0)));
    breaks_nothing(
        cfg,
        &to_guard,
        &to_nodes(0, &[1]),
        Mutant::IgnoreHigherTermOnRefresh,
        |kept, mutant| {
            kept.brokers[0].role == Role::Follower && mutant.brokers[0].role == Role::Leader
        },
        8,
    );
}

/// The deposed leader's confirmation read for client 0's second request finds broker
/// 1's range above its window, which dies (a fresh round serves the request); broker 0
/// reads the term register and finds term 2. With the guard it steps down; without it
/// ([`Mutant::KeepLeadingAfterDeadWindow`]) it keeps leading term 1.
///
/// Nothing breaks, within depth 8 of that state, safety or liveness, for the reasons of
/// the refresh's step-down above (the two step-downs back each other up: once faults
/// stop, the leader's next refresh meets term 2's heartbeat). The step-down is
/// promptness: the broker learns of the newer leader without waiting for a refresh.
#[test]
fn keeping_the_lead_after_a_dead_window_breaks_nothing() {
    let mut cfg = Config::small();
    cfg.requests = 2;
    let mut to_guard = deposed_leader();
    to_guard.extend(ask(0, 0));
    // The read (node 2 first takes the old round's write) finds 4: the window dies, and
    // a fresh round (5..=6) on nodes 0 and 1 serves client 0 ID 5.
    to_guard.extend(to_nodes(0, &[1, 2, 2]));
    to_guard.extend(to_nodes(0, &[0, 1]));
    to_guard.push(Step::Do(Action::CheckTerm(0)));
    breaks_nothing(
        cfg,
        &to_guard,
        &to_nodes(0, &[0, 1]), // the term register: 2
        Mutant::KeepLeadingAfterDeadWindow,
        |kept, mutant| {
            kept.brokers[0].role == Role::Follower && mutant.brokers[0].role == Role::Leader
        },
        8,
    );
}

/// The model under check, with one more `always` property: `holds` (with every
/// safety property folded into one, [`SAFE`]).
struct Watched {
    cfg: Config,
    holds: fn(&Config, &idmodel::State) -> bool,
}

/// Every safety property of [`props::SAFETY`] at once.
const SAFE: &str = "every safety property";

/// The property a [`Watched`] model adds.
const HOLDS: &str = "the guard's condition never holds";

impl Model for Watched {
    type State = idmodel::State;
    type Action = Action;

    fn init_states(&self) -> Vec<idmodel::State> {
        self.cfg.init_states()
    }

    fn actions(&self, s: &idmodel::State, out: &mut Vec<Action>) {
        self.cfg.actions(s, out);
    }

    fn next_state(&self, s: &idmodel::State, a: Action) -> Option<idmodel::State> {
        self.cfg.next_state(s, a)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(SAFE, |_, s: &idmodel::State| broken(s).is_empty()),
            Property::always(HOLDS, |m: &Watched, s: &idmodel::State| {
                (m.holds)(&m.cfg, s)
            }),
        ]
    }
}

/// Whether `holds` of a majority of the nodes.
fn on_a_majority(cfg: &Config, s: &idmodel::State, holds: impl Fn(&Node) -> bool) -> bool {
    let holding = s.nodes.iter().filter(|n| holds(n)).count();
    holding >= Rules::majority(cfg.nodes as usize)
}

/// Searches from `start` to depth 8 under `cfg` (a mutant's rules) with the property
/// `holds` added ([`Watched`]): no safety property breaks and `holds` holds in every
/// state reached; and the search was not trivial.
fn holds_in_every_state(
    cfg: Config,
    start: idmodel::State,
    holds: fn(&Config, &idmodel::State) -> bool,
) {
    let mutant = cfg.rules.mutant;
    let started = Instant::now();
    let c = Watched {
        cfg: cfg.starting_at(start),
        holds,
    }
    .checker()
    .threads(2)
    .target_max_depth(8)
    .spawn_bfs()
    .join();
    eprintln!(
        "{mutant:?}, depth 8: {} states ({} unique), {:.1} s",
        c.state_count(),
        c.unique_state_count(),
        started.elapsed().as_secs_f64()
    );
    c.assert_no_discovery(SAFE);
    c.assert_no_discovery(HOLDS);
    assert!(c.unique_state_count() > 1000, "{}", c.unique_state_count());
}

/// [`Mutant::IgnoreLostWrites`] changes nothing the model can reach: the ID registers
/// are durable (a crash keeps them) and only grow, and a window's TOP was accepted by a
/// majority before any read of it starts, so every majority read shares a node with
/// that majority and sees at least TOP: `lost_writes` never holds. The guard is for a
/// failure outside the model's (and the protocol's) assumptions, a node that loses
/// acknowledged writes (appendfsync off, a lost disk), where it switches windows off
/// loudly; no guard keeps IDs unique then.
///
/// Pinned: from the deposed leader with a window (confirmations, dead windows, fresh
/// rounds, a crash and restart), to depth 8 with the mutant, in every state the TOP of
/// every live window and of every batch waiting for its confirmation is on a majority
/// (so no read can find less), and nothing breaks.
#[test]
fn ignoring_lost_writes_changes_nothing_the_model_reaches() {
    let mut cfg = Config::small().with_rules(Rules::with(Mutant::IgnoreLostWrites));
    cfg.requests = 2;
    let start = deposed_leader_with_a_window(&cfg);
    holds_in_every_state(cfg, start, |cfg, s| {
        s.brokers.iter().all(|b| {
            let window = !b.window.alive || on_a_majority(cfg, s, |n| n.current >= b.window.top);
            let batch = match b.batch.as_ref().map(|bt| bt.stage) {
                Some(Stage::Confirm { known_top, .. }) => {
                    on_a_majority(cfg, s, |n| n.current >= known_top)
                }
                _ => true,
            };
            window && batch
        })
    });
}

/// Broker 1 read the term register empty and claimed term 1, which only node 2 took
/// before the claim timed out (its copies to nodes 0 and 1 still in flight); broker 0
/// then stood, read term 1 from nodes 1 and 2 and followed it: term 1, which no
/// majority holds, and whose claim no broker won.
fn minority_term_followed() -> Vec<Step> {
    let mut s = vec![Step::Do(Action::Watch(1))];
    s.extend(to_nodes(1, &[1, 2]));
    s.push(Step::Do(Action::Stand(1)));
    s.extend(to_nodes(1, &[1, 2])); // register 0: claim 1
    s.extend(to_nodes(1, &[2]));
    s.push(Step::Do(Action::ElectTimeout(1)));
    s.push(Step::Do(Action::Watch(0)));
    s.extend(to_nodes(0, &[0, 1]));
    s.push(Step::Do(Action::Stand(0)));
    s.extend(to_nodes(0, &[1, 2])); // register 1 above its term 0: follow it
    s
}

/// Broker 0 (term 1, followed from the register) stands again and reads the term
/// register from nodes 0 and 1: 0, below its term. It keeps term 1, which the register
/// itself showed it (`term_unclaimed` compares with the highest term a broker ever read
/// from the register, not with the latest read), and claims term 2.
///
/// Found by the model checker: when the rule compared with the latest read alone, this
/// step took broker 0's term back from 1 to 0 (and the broker logged a forged heartbeat
/// that never was), which breaks "a broker's term never goes back". The bounded checks
/// from the start do not reach it (about 20 steps). Pinned: the step keeps the term, and
/// nothing breaks within depth 8 of the state before it.
#[test]
fn a_term_only_a_minority_claimed_is_kept() {
    let cfg = Config::small();
    let before = cfg
        .play(&cfg.initial(), &minority_term_followed())
        .expect("the script plays");
    let mut again = vec![Step::Do(Action::Watch(0))];
    again.extend(to_nodes(0, &[0, 1]));
    again.push(Step::Do(Action::Stand(0)));
    again.extend(to_nodes(0, &[0, 1])); // register 0, below its term 1
    let after = cfg.play(&before, &again).expect("standing again plays");
    assert_eq!(after.brokers[0].term, 1, "{:#?}", after.brokers[0]);
    let c = search(&cfg, &before, 8);
    for p in props::SAFETY {
        c.assert_no_discovery(p);
    }
    assert!(c.unique_state_count() > 1000, "{}", c.unique_state_count());
}

/// [`Mutant::KeepUnclaimedTerm`] changes nothing the model can reach: `term_unclaimed`
/// never holds there. A broker's term comes from the term register (then it is at or
/// below the highest term it read) or from a heartbeat or its own win (then a majority
/// claimed it, and the term registers only grow, so every later majority read shows it).
/// The guard is for heartbeats no election produced (written by hand, or forged without
/// `--auth-token-file`): a heartbeat of a huge term would otherwise stop every election
/// (`Candidacy::Exhausted`) or make terms jump. The model trusts every heartbeat, so that
/// case is outside it.
///
/// Pinned: from a term only a minority claimed, followed, to depth 8 with the mutant, in
/// every state every broker's term is at or below the highest it read from the register
/// or on a majority of the term registers (so no read can find less), and nothing breaks.
#[test]
fn keeping_an_unclaimed_term_changes_nothing_the_model_reaches() {
    let cfg = Config::small().with_rules(Rules::with(Mutant::KeepUnclaimedTerm));
    let start = cfg
        .play(&cfg.initial(), &minority_term_followed())
        .expect("the script plays");
    holds_in_every_state(cfg, start, |cfg, s| {
        s.brokers
            .iter()
            .all(|b| b.term <= b.term_read || on_a_majority(cfg, s, |n| n.term >= b.term))
    });
}

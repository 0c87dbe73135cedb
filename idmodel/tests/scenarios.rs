//! The failure stories of the systems qlist is compared with (docs/model.md,
//! "Scenarios"), each replayed as a script up to the moment the story turns on, then
//! checked exhaustively from there: every interleaving of the next steps (faults
//! included) keeps every safety property. Each test also replays the story's ending to
//! show which guard decides it.

use broker::serve::rules::{Mutant, Rules};
use idmodel::script::to_nodes;
use idmodel::script::{answer, ask, deposed_leader, elect, leader_served, term_past_its_leader};
use idmodel::{props, Action, Addr, Config, Msg, Role, State, Step};
use stateright::{Checker, HasDiscoveries, Model};
use std::time::Instant;

/// Steps explored from each story's turning point (stateright's depth counts the start
/// as 1 and checks states up to one short of it: `DEPTH - 2` steps).
const DEPTH: usize = 8;

#[track_caller]
fn play(cfg: &Config, s: &State, steps: &[Step]) -> State {
    cfg.play(s, steps)
        .unwrap_or_else(|e| panic!("the story plays: {e}"))
}

/// Every interleaving of `DEPTH - 2` steps from `start` keeps every safety property, and
/// some request is answered after `start` (its `sometimes` flags are cleared first).
#[track_caller]
fn explore(what: &str, cfg: &Config, start: &State) {
    let mut start = start.clone();
    start.ghost.answered = 0;
    start.ghost.answered_from_window = false;
    let started = Instant::now();
    let c = cfg
        .clone()
        .starting_at(start)
        .checker()
        .threads(2)
        .target_max_depth(DEPTH)
        .spawn_bfs()
        .join();
    eprintln!(
        "{what}: {} states ({} unique), {:.1} s",
        c.state_count(),
        c.unique_state_count(),
        started.elapsed().as_secs_f64()
    );
    for p in props::SAFETY {
        c.assert_no_discovery(p);
    }
    c.assert_any_discovery(props::ANSWERED);
}

/// The ID client `c` was last handed for request `req`.
#[track_caller]
fn id_of(s: &State, c: u8, req: u8) -> u64 {
    s.ghost
        .handed
        .iter()
        .find(|h| (h.1, h.2) == (c, req))
        .map(|h| h.0)
        .unwrap_or_else(|| panic!("client {c} was handed nothing for request {req}"))
}

/// tikv/pd #4884, #4885: a re-elected leader served from state it held before it
/// synced. Here broker 0 led term 1 (its window holds ID 2), broker 1 won term 2 and
/// served ID 3; broker 0 learns of term 2 from a heartbeat, steps down, then wins term 3
/// with its term-1 window still in memory. The window's confirmation read, not the
/// election, decides: it finds broker 1's range above the window, which dies, and the
/// request is served by a fresh round above 3.
#[test]
fn pd_4884_a_re_elected_leader_serves_nothing_from_before_its_election() {
    let mut cfg = Config::small();
    cfg.max_term = 3;
    cfg.requests = 2;
    let mut steps = deposed_leader();
    steps.push(Step::Do(Action::Refresh(1)));
    steps.extend(to_nodes(1, &[1, 2])); // heartbeat (2, 1) of broker 1
    steps.push(Step::Do(Action::Refresh(0)));
    steps.extend(to_nodes(0, &[1])); // finds (2, 1): steps down
    steps.extend(to_nodes(0, &[0])); // the same refresh lands on node 0, unawaited
    steps.push(Step::Do(Action::Watch(0)));
    steps.extend(to_nodes(0, &[0, 1]));
    steps.push(Step::Do(Action::Stand(0)));
    steps.extend(to_nodes(0, &[0, 1])); // register 2: claim 3
    steps.extend(to_nodes(0, &[0, 1]));
    let s = play(&cfg, &cfg.initial(), &steps);
    let b0 = &s.brokers[0];
    assert_eq!((b0.role, b0.term), (Role::Leader, 3));
    assert!(b0.window.alive && b0.window.next == 2, "{:?}", b0.window);
    explore("pd #4884, re-elected leader", &cfg, &s);

    let mut end = ask(0, 0);
    end.extend(to_nodes(0, &[0, 1])); // the read: 4 on node 1, the window is dead
    end.extend(to_nodes(0, &[0, 1])); // the fresh round 5..=6
    end.push(answer(0, 0));
    let e = play(&cfg, &s, &end);
    assert!(!e.brokers[0].window.alive || e.brokers[0].window.top > 4);
    assert_eq!(id_of(&e, 0, 2), 5);
}

/// tikv/pd #3616, #8781: timestamps went backwards after a leader change. Here broker
/// 0 served ID 1 from a round on nodes 0 and 1; node 1 then crashed (its registers are
/// durable, its heartbeat is lost) and restarted, and broker 1 won term 2 on nodes 1
/// and 2, node 2 having never seen broker 0's range. Broker 1's first guess (1..=2)
/// wins node 2 but node 1 refuses it; every way on from there hands out only IDs
/// above 1.
#[test]
fn pd_3616_a_new_leader_after_a_node_crash_never_goes_back() {
    let cfg = Config::small();
    let mut steps = leader_served();
    steps.push(Step::Do(Action::Crash(1)));
    steps.push(Step::Do(Action::Restart(1)));
    steps.push(Step::Do(Action::Watch(1)));
    steps.extend(to_nodes(1, &[1, 2]));
    steps.push(Step::Do(Action::Stand(1)));
    steps.extend(to_nodes(1, &[1, 2])); // term 1 survived the crash on node 1: follow
    steps.extend(elect(1, &[1, 2]));
    steps.extend(ask(1, 1)); // the round 1..=2, in flight
    let s = play(&cfg, &cfg.initial(), &steps);
    assert_eq!(s.nodes[1].current, 2, "durable across the crash");
    assert_eq!(s.nodes[2].current, 0);
    assert_eq!(s.brokers[1].role, Role::Leader);
    explore("pd #3616, leader change after a crash", &cfg, &s);

    let mut end = to_nodes(1, &[2, 1, 0]); // node 2 takes 1..=2, nodes 1 and 0 refuse it
    end.extend(to_nodes(1, &[0, 1])); // the retry 3..=4
    end.push(answer(1, 1));
    let e = play(&cfg, &s, &end);
    assert_eq!(id_of(&e, 1, 1), 3);
}

/// Broker 0 led term 1 with a window (ID 2), was paused (it took no step) while broker 1
/// won term 2 and served client 1 ID 3, and resumed: client 0 then sent its next request
/// to broker 0, which still believes it leads and admits it. The state every paused-
/// leader story below starts from.
fn paused_leader_resumes(cfg: &Config) -> State {
    let mut steps = deposed_leader();
    steps.push(Step::Do(Action::Request(0)));
    steps.push(Step::Deliver(Addr::Client(0), Addr::Broker(0)));
    let s = play(cfg, &cfg.initial(), &steps);
    assert_eq!(s.brokers[0].role, Role::Leader);
    assert_eq!(s.brokers[0].queue.len(), 1);
    assert_eq!(s.clients[0].pending.map(|p| p.floor), Some(3));
    s
}

/// etcd #20418: reads went stale after a process pause (a lease outlived by the pause).
/// qlist's broker has no lease and no clock: however long broker 0 was paused, its
/// batch is served only after a majority read that started after the batch closed,
/// which sees broker 1's range; its window dies and a fresh round serves above 3.
#[test]
fn etcd_20418_a_paused_leader_resuming_serves_nothing_stale() {
    let mut cfg = Config::small();
    cfg.requests = 2;
    let s = paused_leader_resumes(&cfg);
    explore("etcd #20418, paused leader", &cfg, &s);

    let mut end = vec![Step::Do(Action::Close(0))];
    end.extend(to_nodes(0, &[0, 1])); // the read: 4 on node 1
    end.extend(to_nodes(0, &[0, 1])); // the fresh round 5..=6
    end.push(answer(0, 0));
    let e = play(&cfg, &s, &end);
    assert_eq!(id_of(&e, 0, 2), 5);
}

/// The same pause, the confirmation skipped: a clock-free broker has nothing else that
/// stops it (no lease to run out), and the checker finds ID 2 handed out after 3 was
/// returned.
#[test]
fn clock_free_confirm_is_what_stops_the_paused_leader() {
    let mut cfg = Config::small();
    cfg.requests = 2;
    let s = paused_leader_resumes(&cfg);
    let c = cfg
        .with_rules(Rules::with(Mutant::ServeBeforeConfirm))
        .starting_at(s)
        .checker()
        .threads(2)
        .target_max_depth(DEPTH)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let path = c.assert_any_discovery(props::LINEARIZABLE);
    eprintln!("without the confirmation: {:?}", path.into_actions());
}

/// etcd #12528: an old leader acted after it stepped down. Broker 0 closed a batch for
/// client 0 while leading (its confirmation read in flight, one answer in), then met
/// broker 1's heartbeat of term 2 on a refresh and stepped down. It may still finish
/// that batch (the read decides, not the lead), but it starts no request more: client
/// 1's requests sent to it are redirected.
#[test]
fn etcd_12528_a_leader_that_stepped_down_starts_nothing() {
    let mut cfg = Config::small();
    cfg.requests = 2;
    let mut steps = leader_served();
    steps.extend(ask(0, 0)); // the read, in flight
    steps.push(Step::Do(Action::Watch(1)));
    steps.extend(to_nodes(1, &[1, 2]));
    steps.push(Step::Do(Action::Stand(1)));
    steps.extend(to_nodes(1, &[1, 2])); // finds term 1: follows it
    steps.extend(elect(1, &[1, 2]));
    steps.push(Step::Do(Action::Refresh(1)));
    steps.extend(to_nodes(1, &[1, 2]));
    steps.push(Step::Do(Action::Refresh(0)));
    steps.extend(to_nodes(0, &[1, 1])); // its read (2), then the refresh: steps down
    let s = play(&cfg, &cfg.initial(), &steps);
    let b0 = &s.brokers[0];
    assert_eq!((b0.role, b0.term), (Role::Follower, 2));
    assert!(b0.batch.is_some(), "the batch it started while leading");
    let mut s2 = s.clone();
    // Client 1 asks the broker that stepped down.
    s2.clients[1].preferred = 0;
    explore("etcd #12528, stepped down", &cfg, &s2);

    let end = vec![
        Step::Do(Action::Request(1)),
        Step::Deliver(Addr::Client(1), Addr::Broker(0)),
    ];
    let e = play(&cfg, &s2, &end);
    assert!(e.brokers[0].queue.is_empty());
    assert!(e.net.iter().any(|m| m.dst == Addr::Client(1)
        && matches!(
            m.msg,
            Msg::Redirect {
                leader: Some(1),
                ..
            }
        )));
}

/// tikv #16069: a follower read broke linearizability. Broker 1 follows term 2 (claimed,
/// won by nobody) and still knows term 1's leader, broker 0; client 1 asks broker 1.
/// A follower answers no request from its own state: it redirects, and names no
/// leader of an older term; every interleaving from there stays linearizable.
#[test]
fn tikv_16069_a_follower_answers_nothing_itself() {
    let cfg = Config::small();
    let mut steps = term_past_its_leader();
    steps.push(Step::Do(Action::Request(1)));
    let s = play(&cfg, &cfg.initial(), &steps);
    assert_eq!(s.brokers[1].role, Role::Follower);
    assert_eq!(s.brokers[1].leader, Some((1, 0)));
    explore("tikv #16069, follower read", &cfg, &s);

    let end = vec![Step::Deliver(Addr::Client(1), Addr::Broker(1))];
    let e = play(&cfg, &s, &end);
    assert!(e.brokers[1].queue.is_empty());
    assert!(e
        .net
        .iter()
        .any(|m| m.dst == Addr::Client(1) && matches!(m.msg, Msg::Redirect { leader: None, .. })));
}

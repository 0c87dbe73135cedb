//! Scripts of common beginnings, for the checks that start deeper in a run.

use super::{Action, Addr, Step};

const B: fn(u8) -> Addr = Addr::Broker;
const N: fn(u8) -> Addr = Addr::Node;
const C: fn(u8) -> Addr = Addr::Client;

/// Broker `b`'s request (of any kind) reaches nodes `nodes`, each answering.
pub fn to_nodes(b: u8, nodes: &[u8]) -> Vec<Step> {
    nodes.iter().map(|&n| Step::Deliver(B(b), N(n))).collect()
}

/// Broker `b` reads the heartbeats, stands and wins its next term on nodes `nodes`
/// (a majority).
pub fn elect(b: u8, nodes: &[u8]) -> Vec<Step> {
    let mut s = vec![Step::Do(Action::Watch(b))];
    s.extend(to_nodes(b, nodes));
    s.push(Step::Do(Action::Stand(b)));
    s.extend(to_nodes(b, nodes)); // the term register read
    s.extend(to_nodes(b, nodes)); // the claim
    s
}

/// Client `c` asks broker `b`, which closes a batch of it.
pub fn ask(c: u8, b: u8) -> Vec<Step> {
    vec![
        Step::Do(Action::Request(c)),
        Step::Deliver(C(c), B(b)),
        Step::Do(Action::Close(b)),
    ]
}

/// Broker `b`'s answer reaches client `c`.
pub fn answer(b: u8, c: u8) -> Step {
    Step::Deliver(B(b), C(c))
}

/// Broker 0 leads term 1 and refreshed its heartbeat on nodes 0 and 1; broker 1
/// learned it (leader broker 0, term 1), then claimed term 2 on node 2 alone and
/// timed out; its late claims landed on nodes 0 and 1, so its next candidacy read
/// term 2 and followed it: a follower of term 2 that still knows the leader of term 1
/// and has seen no heartbeat of term 2.
pub fn term_past_its_leader() -> Vec<Step> {
    let mut s = elect(0, &[0, 1]);
    s.push(Step::Do(Action::Refresh(0)));
    s.extend(to_nodes(0, &[0, 1]));
    s.push(Step::Do(Action::Watch(1)));
    s.extend(to_nodes(1, &[1, 2])); // heartbeat (1, 1) of broker 0
    s.push(Step::Do(Action::Stand(1)));
    s.extend(to_nodes(1, &[1, 2])); // register 1: claim 2
    s.extend(to_nodes(1, &[2]));
    s.push(Step::Do(Action::ElectTimeout(1)));
    s.extend(to_nodes(1, &[0, 1])); // the late claims: term 2 everywhere
    s.push(Step::Do(Action::Watch(1)));
    s.extend(to_nodes(1, &[0, 1]));
    s.push(Step::Do(Action::Stand(1)));
    s.extend(to_nodes(1, &[0, 1])); // register 2 above its term: follow it
    s
}

/// Broker 1 read the term register empty and sent its claim of term 1; meanwhile
/// broker 0 won term 1 on nodes 0 and 1 and served client 0 (its window holds the
/// next ID); client 1 sent its request to broker 1. Node 2 has not taken broker 1's
/// claim yet: one accept, a minority.
pub fn minority_claim_in_flight() -> Vec<Step> {
    let mut s = vec![Step::Do(Action::Watch(1))];
    s.extend(to_nodes(1, &[1, 2]));
    s.push(Step::Do(Action::Stand(1)));
    s.extend(to_nodes(1, &[1, 2])); // register 0: claim 1
    s.extend(leader_served());
    s.push(Step::Do(Action::Request(1)));
    s
}

/// With a window of 2: broker 0 leads term 1, served client 0 by a round (1..=3)
/// and then from its window after a confirmation read (ID 2, the read saw 3);
/// broker 1 then won term 2 and served client 1 ID 4 by a round above 3. Broker 0
/// still leads (no refresh told it) and its window still holds ID 3.
pub fn stale_window_after_failover() -> Vec<Step> {
    let mut s = leader_served();
    s.extend(ask(0, 0));
    s.extend(to_nodes(0, &[0, 1])); // the confirmation read: 3
    s.push(answer(0, 0));
    s.push(Step::Do(Action::Watch(1)));
    s.extend(to_nodes(1, &[1, 2]));
    s.push(Step::Do(Action::Stand(1)));
    s.extend(to_nodes(1, &[1, 2])); // finds term 1: follows it
    s.extend(elect(1, &[1, 2]));
    s.extend(ask(1, 1));
    s.extend(to_nodes(1, &[1, 0])); // 1..=3 rejected
    s.extend(to_nodes(1, &[1, 2, 2])); // 4..=6 (node 2 first takes the old guess)
    s.push(answer(1, 1));
    s
}

/// Broker 0 led term 1 and served client 0 (its window holds the next ID); broker 1
/// then won term 2 and served client 1 by a round on nodes 1 and 2 (a retry: its
/// first guess lost to broker 0's range). Broker 0 still leads in its own view.
pub fn deposed_leader() -> Vec<Step> {
    let mut s = leader_served();
    // Its first candidacy finds term 1 on node 1 and follows it; the second wins term 2.
    s.push(Step::Do(Action::Watch(1)));
    s.extend(to_nodes(1, &[1, 2]));
    s.push(Step::Do(Action::Stand(1)));
    s.extend(to_nodes(1, &[1, 2]));
    s.extend(elect(1, &[1, 2]));
    s.extend(ask(1, 1));
    s.extend(to_nodes(1, &[1, 0])); // rejected: broker 0 holds 1..=2
                                    // The retry above it (node 2 first takes the first guess, still in flight).
    s.extend(to_nodes(1, &[1, 2, 2]));
    s.push(answer(1, 1));
    s
}

/// Broker 0 leads term 1 and served client 0 by a fresh round on nodes 0 and 1: its
/// window holds the next ID.
pub fn leader_served() -> Vec<Step> {
    let mut s = elect(0, &[0, 1]);
    s.extend(ask(0, 0));
    s.extend(to_nodes(0, &[0, 1])); // the round
    s.push(answer(0, 0));
    s
}

//! The model once faults stop, run on one fair schedule: the bounded liveness check.

use super::{Action, Config, State};
use stateright::Model;

/// A fault-free run from one state ([`Config::quiet_run`]).
#[derive(Clone, Debug)]
pub struct QuietRun {
    /// The steps taken, in order.
    pub actions: Vec<Action>,
    /// Whether a client was handed an ID (after the run's start) within the bound.
    pub answered: bool,
    /// Where it ended: at the first answer, at the bound, or where nothing was enabled.
    pub end: State,
}

impl Config {
    /// Runs [`Config::quiet`] from `s` on one fair schedule, for at most `max_steps` steps,
    /// until a client is handed an ID. The schedule: a network that delivers every message
    /// it can before any actor's own step (the first in flight first); then brokers and
    /// clients in turn (round-robin), each taking its first enabled step in the order
    /// time out (election, serving, an overdue refresh), close a batch, check the term,
    /// stand, watch, refresh; a client sends a request, or retries.
    pub fn quiet_run(&self, s: &State, max_steps: usize) -> QuietRun {
        let q = self.quiet();
        let goal = s.ghost.answered;
        let actors = (self.brokers + self.clients) as usize;
        let mut s = s.clone();
        let mut taken = Vec::new();
        let mut acts = Vec::new();
        let mut turn = 0;
        while s.ghost.answered <= goal && taken.len() < max_steps {
            acts.clear();
            q.actions(&s, &mut acts);
            let delivery = acts
                .iter()
                .find(|a| matches!(a, Action::Deliver(_)))
                .copied();
            let next = delivery.or_else(|| {
                (0..actors).find_map(|k| {
                    let actor = (turn + k) % actors;
                    let a = acts
                        .iter()
                        .filter(|a| self.owner(**a) == Some(actor))
                        .min_by_key(|a| quiet_priority(**a))
                        .copied()?;
                    turn = actor + 1;
                    Some(a)
                })
            });
            let Some(a) = next else { break };
            let Some(n) = q.next_state(&s, a) else { break };
            s = n;
            taken.push(a);
        }
        QuietRun {
            answered: s.ghost.answered > goal,
            actions: taken,
            end: s,
        }
    }

    /// The broker or client whose own step `a` is (brokers first), for the round-robin.
    fn owner(&self, a: Action) -> Option<usize> {
        match a {
            Action::Watch(b)
            | Action::Stand(b)
            | Action::Refresh(b)
            | Action::Overdue(b)
            | Action::CheckTerm(b)
            | Action::Close(b)
            | Action::ElectTimeout(b)
            | Action::ServeTimeout(b) => Some(b as usize),
            Action::Request(c) | Action::Retry(c) => Some((self.brokers + c) as usize),
            _ => None,
        }
    }
}

/// The order in which [`Config::quiet_run`] picks among one actor's enabled steps. A
/// timeout comes first: without faults one is enabled only once the network settled
/// with its operation still waiting, which is when its deadline runs out (a leader
/// could otherwise refresh for ever while its batch waits).
fn quiet_priority(a: Action) -> u8 {
    match a {
        Action::ElectTimeout(_) | Action::Request(_) => 0,
        Action::ServeTimeout(_) | Action::Retry(_) => 1,
        Action::Overdue(_) => 2,
        Action::Close(_) => 3,
        Action::CheckTerm(_) => 4,
        Action::Stand(_) => 5,
        Action::Watch(_) => 6,
        _ => 7,
    }
}

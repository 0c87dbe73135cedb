//! The bounds of a check, the rules under check, and how a check starts.

use super::{Action, Addr, Broker, Client, Ghost, Node, Role, State, Window};
use broker::serve::rules::{Rules, RULES};
use stateright::Model;

/// The bounds of one check, and the rules under check.
#[derive(Clone, Debug)]
pub struct Config {
    pub brokers: u8,
    pub nodes: u8,
    pub clients: u8,
    /// Requests each client sends.
    pub requests: u8,
    /// IDs a fresh round reserves beyond the batch's: the window.
    pub window: u64,
    /// No candidate claims a term above this.
    pub max_term: u64,
    /// A leader refreshes at most this often per term.
    pub max_seq: u64,
    /// No round writes an ID above this.
    pub max_id: u64,
    pub drops: u8,
    pub dups: u8,
    pub crashes: u8,
    pub retries: u8,
    pub rules: Rules,
    /// Whether the faults may happen: lost answers, duplicated requests, crashes and
    /// restarts, and timeouts at any moment. Without them ([`Config::quiet`]) a timeout
    /// fires only once the network has delivered all it can and the operation still
    /// waits, as it does on a quiet network with long enough timeouts.
    pub faults: bool,
    /// Adds the liveness property ([`crate::props::LIVE`]): from every state the check reaches,
    /// [`Config::quiet_run`] answers a request within this many steps.
    pub liveness: Option<usize>,
    /// A liveness bug planted in the model, to show the liveness check finds it.
    pub sabotage: Option<Sabotage>,
    /// Where the check starts: [`Config::initial`] if `None`, else this state (reached
    /// by a script, [`Config::play`]), so a deeper part of a run is explored exhaustively.
    pub from: Option<State>,
}

/// A liveness bug planted in the model (the decisions in `rules` are kept): the liveness
/// check must find the state it leaves stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sabotage {
    /// A candidate never gives up a claim that no majority has answered (its claim has
    /// no timeout): after a split vote with a node down it waits for good.
    ClaimWithoutTimeout,
}

/// One step of a script ([`Config::play`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Exactly this action.
    Do(Action),
    /// Deliver the first message in flight from `from` to `to`.
    Deliver(Addr, Addr),
    /// Node `to` applies the first request from `from` and its answer is lost.
    Lose(Addr, Addr),
}

impl Config {
    /// The bounded check `cargo test` runs (docs/model.md, "Bounds").
    pub fn small() -> Config {
        Config {
            brokers: 2,
            nodes: 3,
            clients: 2,
            requests: 1,
            window: 1,
            max_term: 2,
            max_seq: 1,
            max_id: 6,
            drops: 1,
            dups: 1,
            crashes: 1,
            retries: 1,
            rules: RULES,
            faults: true,
            liveness: None,
            sabotage: None,
            from: None,
        }
    }

    /// The same bounds, the check starting from `s`.
    pub fn starting_at(mut self, s: State) -> Config {
        self.from = Some(s);
        self
    }

    /// Plays `steps` from `s`, checking that each is enabled.
    ///
    /// # Errors
    /// The first step that is not enabled, with its index.
    pub fn play(&self, s: &State, steps: &[Step]) -> Result<State, String> {
        let mut s = s.clone();
        for (i, step) in steps.iter().enumerate() {
            let find = |lose: bool, from: Addr, to: Addr| {
                let mut acts = Vec::new();
                self.actions(&s, &mut acts);
                acts.into_iter().find(|a| match a {
                    Action::Deliver(e) if !lose => e.src == from && e.dst == to,
                    Action::Lose(e) if lose => e.src == from && e.dst == to,
                    _ => false,
                })
            };
            let action = match *step {
                Step::Do(a) => Some(a),
                Step::Deliver(from, to) => find(false, from, to),
                Step::Lose(from, to) => find(true, from, to),
            };
            s = action
                .and_then(|a| self.step(&s, a))
                .ok_or_else(|| format!("step {i}, {step:?}, is not enabled in {s:#?}"))?;
        }
        Ok(s)
    }

    /// The same bounds with one guard removed.
    pub fn with_rules(mut self, rules: Rules) -> Config {
        self.rules = rules;
        self
    }

    /// The same model once faults stop: no lost answers, duplicates, crashes or restarts
    /// (a crashed node stays down; a majority is up), timeouts only once the network is
    /// settled ([`Config::faults`]), a client's request retried only once no broker holds
    /// it. The bounds that only keep the search finite are lifted (terms, refreshes, IDs,
    /// requests): [`Config::quiet_run`] is bounded by its step count instead.
    pub fn quiet(&self) -> Config {
        Config {
            requests: u8::MAX,
            max_term: u64::MAX,
            max_seq: u64::MAX,
            max_id: u64::MAX,
            faults: false,
            liveness: None,
            from: None,
            ..*self
        }
    }
}

impl Config {
    pub(super) fn majority(&self) -> usize {
        Rules::majority(self.nodes as usize)
    }

    /// The state every check starts from: no leader, empty registers, nothing sent.
    pub fn initial(&self) -> State {
        let broker = Broker {
            role: Role::Follower,
            term: 0,
            term_read: 0,
            leader: None,
            newest: None,
            may_stand: false,
            seq: 0,
            window_died: false,
            tag: 0,
            elect: None,
            queue: Vec::new(),
            batch: None,
            window: Window::default(),
            known: 0,
            last_read: None,
            broken: false,
        };
        let node = Node {
            up: true,
            current: 0,
            term: 0,
            hb: None,
        };
        State {
            brokers: vec![broker; self.brokers as usize],
            nodes: vec![node; self.nodes as usize],
            clients: (0..self.clients)
                .map(|c| Client {
                    sent: 0,
                    pending: None,
                    preferred: c % self.brokers,
                })
                .collect(),
            net: Vec::new(),
            drops_left: self.drops,
            dups_left: self.dups,
            crashes_left: self.crashes,
            retries_left: self.retries,
            ghost: Ghost::default(),
        }
    }

    /// Applies `action` to `s`: `None` if it is not enabled there.
    pub fn step(&self, s: &State, action: Action) -> Option<State> {
        let mut acts = Vec::new();
        self.actions(s, &mut acts);
        if !acts.contains(&action) {
            return None;
        }
        self.next_state(s, action)
    }
}

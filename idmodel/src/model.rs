//! The model: actors, messages, steps and properties (docs/model.md).

use broker::serve::rules::{Candidacy, Confirm, LeadStep, Read, Rules, RULES};
use stateright::{Model, Property};

/// Most redirects one client request follows before it gives up (idclient's
/// `MAX_REDIRECTS` bounds the chained ones; here every redirect counts, which bounds
/// the model too).
pub const MAX_REDIRECTS: u8 = 3;

/// Which operation a reply belongs to: a per-broker counter.
pub type Tag = u8;

/// An actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Addr {
    Broker(u8),
    Node(u8),
    Client(u8),
}

/// A heartbeat as a node holds it: the leader `broker` of `term`, refresh `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hb {
    pub term: u64,
    pub seq: u64,
    pub broker: u8,
}

impl Hb {
    /// What followers order heartbeats by (idclient's `Heartbeat::key`).
    pub fn key(self) -> (u64, u64) {
        (self.term, self.seq)
    }
}

/// Every message, between brokers and nodes and between clients and brokers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    /// "If current < lo then current = hi": the conditional write of the ID register.
    Write {
        tag: Tag,
        lo: u64,
        hi: u64,
    },
    ReadMax {
        tag: Tag,
    },
    /// "If term < term then term = term": the term register.
    ClaimTerm {
        tag: Tag,
        term: u64,
    },
    ReadTerm {
        tag: Tag,
    },
    /// Set the heartbeat unless the node holds one of a higher term.
    Refresh {
        tag: Tag,
        hb: Hb,
    },
    ReadHb {
        tag: Tag,
    },
    Wrote {
        tag: Tag,
        ok: bool,
        current: u64,
    },
    Max {
        tag: Tag,
        value: u64,
    },
    Claimed {
        tag: Tag,
        ok: bool,
    },
    TermIs {
        tag: Tag,
        value: u64,
    },
    Refreshed {
        tag: Tag,
        higher: Option<Hb>,
    },
    HbIs {
        tag: Tag,
        hb: Option<Hb>,
    },
    /// A client's request for one ID (`req` numbers the client's requests).
    Next {
        req: u8,
    },
    Ids {
        req: u8,
        id: u64,
    },
    Redirect {
        req: u8,
        leader: Option<u8>,
    },
}

/// A message in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Env {
    pub src: Addr,
    pub dst: Addr,
    pub msg: Msg,
}

/// A broker's part in the election.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Follower,
    Candidate,
    Leader,
}

/// A quorum operation of the election in flight, collecting one answer per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ElectOp {
    pub tag: Tag,
    /// Nodes that answered (a bit each): a duplicate answer counts once.
    pub answered: u8,
    /// Answers that accepted (a claim, a refresh).
    pub ok: u8,
    pub kind: ElectKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElectKind {
    /// A follower reads the heartbeats; the newest so far.
    ReadHb {
        newest: Option<Hb>,
    },
    /// A candidate (or, `check`, a leader whose window died) reads the term register.
    ReadTerm {
        max: u64,
        check: bool,
    },
    Claim {
        term: u64,
    },
    /// A leader's refresh; the highest heartbeat a node answered with.
    Refresh {
        higher: Option<Hb>,
    },
}

/// One closed batch: its requests `(client, req, term admitted in)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Batch {
    pub reqs: Vec<(u8, u8, u64)>,
    pub tag: Tag,
    pub stage: Stage,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// IDs `lo..lo+n` set aside from window `generation` (TOP `known_top`), waiting
    /// for the confirmation read: the largest answer so far.
    Confirm {
        lo: u64,
        known_top: u64,
        generation: u8,
        answered: u8,
        max: u64,
    },
    /// A fresh window: the round `lo..=hi` (the batch's IDs, then the window).
    Round {
        lo: u64,
        hi: u64,
        answered: u8,
        ok: u8,
        rejected_max: u64,
    },
}

/// The window: `next..=top` unserved while `alive`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Window {
    pub alive: bool,
    pub next: u64,
    pub top: u64,
    pub generation: u8,
}

impl Window {
    fn available(&self) -> u64 {
        if self.alive && self.next <= self.top {
            self.top - self.next + 1
        } else {
            0
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Broker {
    pub role: Role,
    pub term: u64,
    /// The highest term it has read from the term register (any of its majority reads):
    /// a term at or below it came from the register, not from a heartbeat.
    pub term_read: u64,
    /// The last leader it learned, with that leader's term (what a redirect may name).
    pub leader: Option<(u64, u8)>,
    pub newest: Option<(u64, u64)>,
    /// A heartbeat read finished since the last one started: it may stand.
    pub may_stand: bool,
    pub seq: u64,
    pub window_died: bool,
    pub tag: Tag,
    pub elect: Option<ElectOp>,
    /// Admitted requests not yet in a batch.
    pub queue: Vec<(u8, u8, u64)>,
    pub batch: Option<Batch>,
    pub window: Window,
    /// The largest register value it has seen: its next round's guess.
    pub known: u64,
    /// The last confirmation read's value (only a stale-confirm mutant uses it).
    pub last_read: Option<u64>,
    pub broken: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub up: bool,
    /// The ID register and the term register: durable.
    pub current: u64,
    pub term: u64,
    /// The heartbeat: volatile, lost in a crash.
    pub hb: Option<Hb>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pending {
    pub req: u8,
    /// The largest ID any client had been returned when this request was sent: its ID
    /// must be above it (real-time order).
    pub floor: u64,
    pub target: u8,
    pub redirects: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    pub sent: u8,
    pub pending: Option<Pending>,
    pub preferred: u8,
}

/// What the properties look at: the history, summarised as it happens.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Ghost {
    /// Every ID a broker handed out: `(id, client, req)`.
    pub handed: Vec<(u64, u8, u8)>,
    /// `(term, broker)` of every broker that served a request admitted in that term.
    pub served_in: Vec<(u64, u8)>,
    pub returned_max: u64,
    pub answered: u8,
    pub answered_from_window: bool,
    pub answered_in_term_2: bool,
    pub duplicate: bool,
    pub out_of_order: bool,
    pub two_in_a_term: bool,
    pub admitted_not_leading: bool,
    pub term_went_back: bool,
    pub stale_redirect: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub brokers: Vec<Broker>,
    pub nodes: Vec<Node>,
    pub clients: Vec<Client>,
    /// Messages in flight (a multiset, kept sorted): any may be delivered next.
    pub net: Vec<Env>,
    pub drops_left: u8,
    pub dups_left: u8,
    pub crashes_left: u8,
    pub retries_left: u8,
    pub ghost: Ghost,
}

/// One step of one actor, or of the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Delivers a message. One to a node is applied there and its answer reaches the
    /// broker in the same step (a delay in between is a delay of the request).
    Deliver(Env),
    /// A node applies a request, and its answer is lost: the outcome is unknown.
    Lose(Env),
    /// A request to a node is sent twice: the copy may land any time later.
    Duplicate(Env),
    Crash(u8),
    Restart(u8),
    /// Follower: read the heartbeats.
    Watch(u8),
    /// Follower after a heartbeat read: its election timeout ran out.
    Stand(u8),
    /// Leader: refresh the heartbeat.
    Refresh(u8),
    /// Leader whose refresh no majority took for an election timeout.
    Overdue(u8),
    /// Leader whose window died: read the term register.
    CheckTerm(u8),
    /// Close a batch of the admitted requests and start serving it.
    Close(u8),
    /// The election operation in flight timed out (its outcome unknown).
    ElectTimeout(u8),
    /// The batch's operation timed out (its outcome unknown).
    ServeTimeout(u8),
    /// A client sends its next request.
    Request(u8),
    /// A client's request timed out: it sends it to the next broker (the first may
    /// still answer).
    Retry(u8),
}

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
    /// Adds the liveness property ([`props::LIVE`]): from every state the check reaches,
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

    fn majority(&self) -> usize {
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

/// The properties' names.
pub mod props {
    pub const UNIQUE: &str = "IDs are unique";
    pub const LINEARIZABLE: &str = "an ID requested after another returned is larger";
    pub const ONE_PER_TERM: &str = "at most one broker serves per term";
    pub const STEPPED_DOWN: &str = "a broker that does not lead starts no request";
    pub const TERMS_GROW: &str = "a broker's term never goes back";
    pub const REDIRECT_CURRENT: &str = "a redirect never names a superseded leader";
    pub const ANSWERED: &str = "a request is answered";
    pub const FROM_WINDOW: &str = "a request is answered from a confirmed window";
    pub const FAILOVER: &str = "a request is answered by a leader of term 2";
    /// Only with [`Config::liveness`](crate::Config::liveness).
    pub const LIVE: &str = "once faults stop, a request is answered within the bound";

    /// The safety properties (`always`).
    pub const SAFETY: [&str; 6] = [
        UNIQUE,
        LINEARIZABLE,
        ONE_PER_TERM,
        STEPPED_DOWN,
        TERMS_GROW,
        REDIRECT_CURRENT,
    ];
}

/// The safety properties that hold of `s`'s history so far: the names of those broken.
pub fn broken(s: &State) -> Vec<&'static str> {
    let g = &s.ghost;
    let flags = [
        g.duplicate,
        g.out_of_order,
        g.two_in_a_term,
        g.admitted_not_leading,
        g.term_went_back,
        g.stale_redirect,
    ];
    props::SAFETY
        .iter()
        .zip(flags)
        .filter(|(_, f)| *f)
        .map(|(p, _)| *p)
        .collect()
}

/// One state being changed by a step: sends go to the network, and the ghost notes.
struct Ctx<'a> {
    cfg: &'a Config,
    s: State,
}

impl Ctx<'_> {
    fn rules(&self) -> Rules {
        self.cfg.rules
    }

    fn send(&mut self, src: Addr, dst: Addr, msg: Msg) {
        let e = Env { src, dst, msg };
        let at = self.s.net.partition_point(|x| *x < e);
        self.s.net.insert(at, e);
    }

    fn send_nodes(&mut self, b: u8, msg: Msg) {
        for n in 0..self.cfg.nodes {
            self.send(Addr::Broker(b), Addr::Node(n), msg);
        }
    }

    fn next_tag(&mut self, b: u8) -> Tag {
        let br = &mut self.s.brokers[b as usize];
        br.tag = br.tag.wrapping_add(1);
        br.tag
    }

    fn set_term(&mut self, b: u8, term: u64) {
        let br = &mut self.s.brokers[b as usize];
        if term < br.term {
            self.s.ghost.term_went_back = true;
        }
        br.term = term;
    }

    // ---- nodes ----

    /// Node `n` applies `msg`: its answer.
    fn node(&mut self, n: u8, msg: Msg) -> Option<Msg> {
        let node = &mut self.s.nodes[n as usize];
        let reply = match msg {
            Msg::Write { tag, lo, hi } => {
                let ok = node.current < lo;
                if ok {
                    node.current = hi;
                }
                Msg::Wrote {
                    tag,
                    ok,
                    current: node.current,
                }
            }
            Msg::ReadMax { tag } => Msg::Max {
                tag,
                value: node.current,
            },
            Msg::ClaimTerm { tag, term } => {
                let ok = node.term < term;
                if ok {
                    node.term = term;
                }
                Msg::Claimed { tag, ok }
            }
            Msg::ReadTerm { tag } => Msg::TermIs {
                tag,
                value: node.term,
            },
            Msg::Refresh { tag, hb } => match node.hb {
                Some(held) if held.term > hb.term => Msg::Refreshed {
                    tag,
                    higher: Some(held),
                },
                _ => {
                    node.hb = Some(hb);
                    Msg::Refreshed { tag, higher: None }
                }
            },
            Msg::ReadHb { tag } => Msg::HbIs { tag, hb: node.hb },
            _ => return None,
        };
        Some(reply)
    }

    // ---- clients ----

    fn client(&mut self, c: u8, src: Addr, msg: Msg) {
        let Addr::Broker(from) = src else { return };
        let Some(p) = self.s.clients[c as usize].pending else {
            return;
        };
        match msg {
            Msg::Ids { req, id } if req == p.req => {
                let g = &mut self.s.ghost;
                if id <= p.floor {
                    g.out_of_order = true;
                }
                g.returned_max = g.returned_max.max(id);
                g.answered = g.answered.saturating_add(1);
                let cl = &mut self.s.clients[c as usize];
                cl.pending = None;
                cl.preferred = from;
            }
            Msg::Redirect { req, leader } if req == p.req => {
                if p.redirects >= MAX_REDIRECTS {
                    // Given up: the caller sees an error (the outcome of the earlier
                    // attempts unknown).
                    self.s.clients[c as usize].pending = None;
                    return;
                }
                let target = leader.unwrap_or((from + 1) % self.cfg.brokers);
                let cl = &mut self.s.clients[c as usize];
                cl.preferred = target;
                cl.pending = Some(Pending {
                    target,
                    redirects: p.redirects + 1,
                    ..p
                });
                self.send(Addr::Client(c), Addr::Broker(target), Msg::Next { req });
            }
            _ => {}
        }
    }

    fn request(&mut self, c: u8) {
        let floor = self.s.ghost.returned_max;
        let cl = &mut self.s.clients[c as usize];
        cl.sent += 1;
        let p = Pending {
            req: cl.sent,
            floor,
            target: cl.preferred,
            redirects: 0,
        };
        cl.pending = Some(p);
        self.send(
            Addr::Client(c),
            Addr::Broker(p.target),
            Msg::Next { req: p.req },
        );
    }

    fn retry(&mut self, c: u8) {
        self.s.retries_left = self.s.retries_left.saturating_sub(1);
        let brokers = self.cfg.brokers;
        let cl = &mut self.s.clients[c as usize];
        let Some(p) = cl.pending.as_mut() else { return };
        p.target = (p.target + 1) % brokers;
        let (target, req) = (p.target, p.req);
        cl.preferred = target;
        self.send(Addr::Client(c), Addr::Broker(target), Msg::Next { req });
    }

    // ---- brokers: requests and windows ----

    fn next_request(&mut self, b: u8, c: u8, req: u8) {
        let rules = self.rules();
        let br = &self.s.brokers[b as usize];
        let leading = br.role == Role::Leader;
        if rules.admits(leading) {
            let known = br.queue.iter().any(|q| (q.0, q.1) == (c, req))
                || br
                    .batch
                    .as_ref()
                    .is_some_and(|bt| bt.reqs.iter().any(|q| (q.0, q.1) == (c, req)));
            if !leading {
                self.s.ghost.admitted_not_leading = true;
            }
            if !known {
                let term = br.term;
                self.s.brokers[b as usize].queue.push((c, req, term));
            }
            return;
        }
        let named = if br.role == Role::Candidate {
            None
        } else {
            rules.redirect_names(br.term, br.leader.map(|l| (l.0, l)))
        };
        if named.is_some_and(|(t, _)| t < br.term) {
            self.s.ghost.stale_redirect = true;
        }
        let leader = named.map(|(_, l)| l);
        self.send(
            Addr::Broker(b),
            Addr::Client(c),
            Msg::Redirect { req, leader },
        );
    }

    fn close(&mut self, b: u8) {
        let rules = self.rules();
        let br = &mut self.s.brokers[b as usize];
        let reqs = std::mem::take(&mut br.queue);
        let tag = self.next_tag(b);
        let br = &mut self.s.brokers[b as usize];
        let n = reqs.len() as u64;
        let w = br.window;
        if br.broken || w.available() < n {
            br.batch = Some(Batch {
                reqs,
                tag,
                stage: Stage::Confirm {
                    lo: 0,
                    known_top: 0,
                    generation: 0,
                    answered: 0,
                    max: 0,
                },
            });
            return self.fresh(b);
        }
        // Set aside, before the read.
        let lo = w.next;
        br.window.next += n;
        let stage = Stage::Confirm {
            lo,
            known_top: w.top,
            generation: w.generation,
            answered: 0,
            max: 0,
        };
        br.batch = Some(Batch { reqs, tag, stage });
        if rules.serves_unconfirmed() {
            return self.hand_out(b, lo, true);
        }
        if let Some(stale) = br.last_read {
            if rules.read_usable(Read {
                max: stale,
                after_close: false,
            }) {
                return self.confirmed(b, stale);
            }
        }
        self.send_nodes(b, Msg::ReadMax { tag });
    }

    /// The batch's confirmation read found `max`.
    fn confirmed(&mut self, b: u8, max: u64) {
        let rules = self.rules();
        let br = &mut self.s.brokers[b as usize];
        br.last_read = Some(max);
        br.known = br.known.max(max);
        let Some(Batch {
            stage:
                Stage::Confirm {
                    lo,
                    known_top,
                    generation,
                    ..
                },
            ..
        }) = br.batch
        else {
            return;
        };
        let w = br.window;
        let live_top = (w.generation == generation && w.alive).then_some(w.top);
        match rules.confirm(max, known_top, live_top) {
            Confirm::Serve => self.hand_out(b, lo, true),
            Confirm::LostWrites => {
                br.broken = true;
                self.fresh(b);
            }
            Confirm::Dead => {
                if w.generation == generation && w.alive {
                    br.window_died = true;
                }
                self.fresh(b);
            }
        }
    }

    /// A fresh window: kill the old one, write `known+1 ..= known+n+window`.
    fn fresh(&mut self, b: u8) {
        let extra = self.cfg.window;
        let tag = self.next_tag(b);
        let br = &mut self.s.brokers[b as usize];
        if br.window.alive {
            br.window.alive = false;
            br.window.generation = br.window.generation.wrapping_add(1);
        }
        let Some(batch) = br.batch.as_mut() else {
            return;
        };
        let n = batch.reqs.len() as u64;
        let lo = br.known + 1;
        let hi = lo + n - 1 + if br.broken { 0 } else { extra };
        if hi > self.cfg.max_id {
            // Out of the model's IDs: the batch fails (its callers see an error).
            br.batch = None;
            return;
        }
        batch.tag = tag;
        batch.stage = Stage::Round {
            lo,
            hi,
            answered: 0,
            ok: 0,
            rejected_max: 0,
        };
        self.send_nodes(b, Msg::Write { tag, lo, hi });
    }

    fn hand_out(&mut self, b: u8, lo: u64, from_window: bool) {
        let br = &mut self.s.brokers[b as usize];
        let Some(batch) = br.batch.take() else { return };
        for (i, (c, req, term)) in batch.reqs.into_iter().enumerate() {
            let id = lo + i as u64;
            let g = &mut self.s.ghost;
            if g.handed.iter().any(|h| h.0 == id && (h.1, h.2) != (c, req)) {
                g.duplicate = true;
            }
            if !g.handed.contains(&(id, c, req)) {
                g.handed.push((id, c, req));
                g.handed.sort_unstable();
            }
            if g.served_in.iter().any(|&(t, o)| t == term && o != b) {
                g.two_in_a_term = true;
            }
            if !g.served_in.contains(&(term, b)) {
                g.served_in.push((term, b));
                g.served_in.sort_unstable();
            }
            g.answered_from_window |= from_window;
            g.answered_in_term_2 |= term == 2;
            self.send(Addr::Broker(b), Addr::Client(c), Msg::Ids { req, id });
        }
    }

    fn serve_reply(&mut self, b: u8, n: u8, msg: Msg) {
        let majority = self.cfg.majority() as u32;
        let nodes = self.cfg.nodes as u32;
        let bit = 1u8 << n;
        let br = &mut self.s.brokers[b as usize];
        let Some(batch) = br.batch.as_mut() else {
            return;
        };
        match (&mut batch.stage, msg) {
            (Stage::Confirm { answered, max, .. }, Msg::Max { tag, value })
                if tag == batch.tag && *answered & bit == 0 =>
            {
                *answered |= bit;
                *max = (*max).max(value);
                if answered.count_ones() >= majority {
                    let max = *max;
                    self.confirmed(b, max);
                }
            }
            (
                Stage::Round {
                    lo,
                    hi,
                    answered,
                    ok,
                    rejected_max,
                },
                Msg::Wrote {
                    tag,
                    ok: accepted,
                    current,
                },
            ) if tag == batch.tag && *answered & bit == 0 => {
                *answered |= bit;
                if accepted {
                    *ok += 1;
                } else {
                    *rejected_max = (*rejected_max).max(current);
                }
                let (lo, hi, ok, rejected) =
                    (*lo, *hi, *ok as u32, answered.count_ones() - *ok as u32);
                let rejected_max = *rejected_max;
                if ok >= majority {
                    let n = batch.reqs.len() as u64;
                    br.known = br.known.max(hi);
                    if hi >= lo + n {
                        br.window = Window {
                            alive: true,
                            next: lo + n,
                            top: hi,
                            generation: br.window.generation,
                        };
                    }
                    self.hand_out(b, lo, false);
                } else if rejected > nodes - majority {
                    // Lost to another writer: again, above what the rejects showed.
                    br.known = br.known.max(rejected_max);
                    self.fresh(b);
                }
            }
            _ => {}
        }
    }

    fn serve_timeout(&mut self, b: u8) {
        let br = &mut self.s.brokers[b as usize];
        let Some(batch) = br.batch.as_ref() else {
            return;
        };
        match batch.stage {
            // A read that fails: the IDs set aside are holes, the batch fails.
            Stage::Confirm { .. } => br.batch = None,
            // Outcome unknown: retry above it (idclient's round retries with a higher guess).
            Stage::Round { hi, .. } => {
                br.known = br.known.max(hi);
                self.fresh(b);
            }
        }
    }

    // ---- brokers: the election ----

    fn start_elect(&mut self, b: u8, kind: ElectKind, msg: impl Fn(Tag) -> Msg) {
        let tag = self.next_tag(b);
        self.s.brokers[b as usize].elect = Some(ElectOp {
            tag,
            answered: 0,
            ok: 0,
            kind,
        });
        self.send_nodes(b, msg(tag));
    }

    fn watch(&mut self, b: u8) {
        self.s.brokers[b as usize].may_stand = false;
        self.start_elect(b, ElectKind::ReadHb { newest: None }, |tag| Msg::ReadHb {
            tag,
        });
    }

    fn stand(&mut self, b: u8) {
        let br = &mut self.s.brokers[b as usize];
        br.role = Role::Candidate;
        br.may_stand = false;
        self.start_elect(
            b,
            ElectKind::ReadTerm {
                max: 0,
                check: false,
            },
            |tag| Msg::ReadTerm { tag },
        );
    }

    fn refresh(&mut self, b: u8) {
        let br = &mut self.s.brokers[b as usize];
        br.seq += 1;
        let hb = Hb {
            term: br.term,
            seq: br.seq,
            broker: b,
        };
        let tag = self.next_tag(b);
        self.s.brokers[b as usize].elect = Some(ElectOp {
            tag,
            answered: 0,
            ok: 0,
            kind: ElectKind::Refresh { higher: None },
        });
        self.send_nodes(b, Msg::Refresh { tag, hb });
    }

    /// Becomes a follower in `term` (the broker's `Machine::follow`).
    fn follow(&mut self, b: u8, term: u64, leader: Option<(u64, u8)>) {
        let br = &mut self.s.brokers[b as usize];
        if br.role == Role::Leader {
            let own = (br.term, br.seq);
            if br.newest.is_none_or(|n| own > n) {
                br.newest = Some(own);
            }
        }
        br.role = Role::Follower;
        br.elect = None;
        br.may_stand = false;
        if leader.is_some() {
            br.leader = leader;
        }
        let t = br.term.max(term);
        self.set_term(b, t);
    }

    fn elect_reply(&mut self, b: u8, n: u8, msg: Msg) {
        let majority = self.cfg.majority() as u32;
        let nodes = self.cfg.nodes as usize;
        let rules = self.rules();
        let bit = 1u8 << n;
        let br = &mut self.s.brokers[b as usize];
        let Some(op) = br.elect.as_mut() else { return };
        let tag = match msg {
            Msg::Claimed { tag, .. }
            | Msg::TermIs { tag, .. }
            | Msg::Refreshed { tag, .. }
            | Msg::HbIs { tag, .. } => tag,
            _ => return,
        };
        if tag != op.tag || op.answered & bit != 0 {
            return;
        }
        op.answered |= bit;
        let answers = op.answered.count_ones();
        match (&mut op.kind, msg) {
            (ElectKind::ReadHb { newest }, Msg::HbIs { hb, .. }) => {
                if let Some(hb) = hb {
                    if newest.is_none_or(|n| (hb.key(), hb.broker) > (n.key(), n.broker)) {
                        *newest = Some(hb);
                    }
                }
                if answers >= majority {
                    let newest = *newest;
                    br.elect = None;
                    br.may_stand = true;
                    if let Some(hb) = newest {
                        if rules.heartbeat_counts(hb.key(), br.term, br.newest) {
                            br.newest = Some(hb.key());
                            br.leader = Some((hb.term, hb.broker));
                            self.set_term(b, hb.term);
                        }
                    }
                }
            }
            (ElectKind::ReadTerm { max, check }, Msg::TermIs { value, .. }) => {
                *max = (*max).max(value);
                if answers < majority {
                    return;
                }
                let (register, check) = (*max, *check);
                br.elect = None;
                br.term_read = br.term_read.max(register);
                if check {
                    if br.role == Role::Leader
                        && rules.steps_down_after_dead_window(br.term, register)
                    {
                        self.follow(b, register, None);
                    }
                    return;
                }
                self.candidacy(b, register);
            }
            (ElectKind::Claim { term }, Msg::Claimed { ok, .. }) => {
                if ok {
                    op.ok += 1;
                }
                let (term, ok) = (*term, op.ok as usize);
                if rules.granted(ok, nodes) {
                    br.role = Role::Leader;
                    br.elect = None;
                    br.seq = 0;
                    br.leader = Some((term, b));
                    self.set_term(b, term);
                } else if answers as usize - ok > nodes - majority as usize {
                    let t = br.term;
                    self.follow(b, t, None);
                }
            }
            (ElectKind::Refresh { higher }, Msg::Refreshed { higher: h, .. }) => {
                if let Some(h) = h {
                    if higher.is_none_or(|x| h.key() > x.key()) {
                        *higher = Some(h);
                    }
                } else {
                    op.ok += 1;
                }
                let (higher, ok) = (*higher, op.ok as usize);
                match rules.after_refresh(higher.map(|h| h.term), ok, majority as usize, false) {
                    LeadStep::StepDown(t) => {
                        br.newest = higher.map(Hb::key);
                        let leader = higher.map(|h| (h.term, h.broker));
                        self.follow(b, t, leader);
                    }
                    LeadStep::Refreshed => br.elect = None,
                    LeadStep::Keep | LeadStep::StepDownUnrefreshed => {}
                }
            }
            _ => {}
        }
    }

    /// A candidate read `register` from the term register.
    fn candidacy(&mut self, b: u8, register: u64) {
        let rules = self.rules();
        let br = &mut self.s.brokers[b as usize];
        if br.role != Role::Candidate {
            return;
        }
        if rules.term_unclaimed(br.term, br.term_read) {
            br.newest = None;
            let read = br.term_read;
            self.set_term(b, read);
        }
        let term = self.s.brokers[b as usize].term;
        match rules.candidacy(term, register) {
            Candidacy::Follow(h) | Candidacy::Exhausted(h) => self.follow(b, h, None),
            Candidacy::Claim(t) if t > self.cfg.max_term => self.follow(b, term, None),
            Candidacy::Claim(t) => {
                self.start_elect(b, ElectKind::Claim { term: t }, |tag| Msg::ClaimTerm {
                    tag,
                    term: t,
                });
            }
        }
    }

    fn elect_timeout(&mut self, b: u8) {
        let br = &mut self.s.brokers[b as usize];
        let Some(op) = br.elect.take() else { return };
        let term = br.term;
        match op.kind {
            ElectKind::ReadTerm { check: false, .. } | ElectKind::Claim { .. } => {
                self.follow(b, term, None)
            }
            ElectKind::ReadHb { .. } | ElectKind::ReadTerm { .. } | ElectKind::Refresh { .. } => {}
        }
    }

    fn overdue(&mut self, b: u8) {
        let rules = self.rules();
        let majority = self.cfg.majority();
        let br = &self.s.brokers[b as usize];
        let Some(op) = br.elect else { return };
        if rules.after_refresh(None, op.ok as usize, majority, true)
            == LeadStep::StepDownUnrefreshed
        {
            let term = br.term;
            self.follow(b, term, None);
        }
    }

    /// Delivers `e`; a node's answer reaches its broker in the same step unless `lost`.
    fn deliver(&mut self, e: Env, lost: bool) {
        match (e.dst, e.src) {
            (Addr::Node(n), Addr::Broker(b)) => {
                if let Some(reply) = self.node(n, e.msg) {
                    if !lost {
                        self.broker_reply(b, n, reply);
                    }
                }
            }
            (Addr::Node(_), _) => {}
            (Addr::Client(c), src) => self.client(c, src, e.msg),
            (Addr::Broker(b), Addr::Client(c)) => {
                if let Msg::Next { req } = e.msg {
                    self.next_request(b, c, req);
                }
            }
            (Addr::Broker(_), _) => {}
        }
    }

    fn broker_reply(&mut self, b: u8, n: u8, msg: Msg) {
        match msg {
            Msg::Max { .. } | Msg::Wrote { .. } => self.serve_reply(b, n, msg),
            _ => self.elect_reply(b, n, msg),
        }
    }

    /// Forgets messages whose delivery can change nothing: reads of operations their
    /// broker no longer waits for, answers to requests their client no longer waits
    /// for. (Writes stay: a stale write landing late is what the model must try.)
    fn purge(&mut self) {
        let (brokers, clients) = (&self.s.brokers, &self.s.clients);
        self.s.net.retain(|e| match (e.src, e.dst, e.msg) {
            (
                Addr::Broker(b),
                _,
                Msg::ReadMax { tag } | Msg::ReadTerm { tag } | Msg::ReadHb { tag },
            ) => {
                let br = &brokers[b as usize];
                br.elect.is_some_and(|o| o.tag == tag)
                    || br.batch.as_ref().is_some_and(|bt| bt.tag == tag)
            }
            (_, Addr::Client(c), Msg::Ids { req, .. } | Msg::Redirect { req, .. }) => {
                clients[c as usize].pending.is_some_and(|p| p.req == req)
            }
            _ => true,
        });
    }
}

/// Whether a broker holds client `c`'s request `req`, admitted or in a batch.
fn held(s: &State, c: u8, req: u8) -> bool {
    s.brokers.iter().any(|b| {
        b.queue.iter().any(|q| (q.0, q.1) == (c, req))
            || b.batch
                .as_ref()
                .is_some_and(|bt| bt.reqs.iter().any(|q| (q.0, q.1) == (c, req)))
    })
}

impl Model for Config {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.from.clone().unwrap_or_else(|| self.initial())]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let faults = self.faults;
        let mut last = None;
        // Without faults, a timeout waits until nothing more can be delivered.
        let mut settled = true;
        for e in &s.net {
            if last == Some(e) {
                continue;
            }
            last = Some(e);
            if let Addr::Node(n) = e.dst {
                // A crashed node takes nothing: what is sent to it waits (or is lost).
                if !s.nodes[n as usize].up {
                    continue;
                }
                if faults && s.drops_left > 0 {
                    out.push(Action::Lose(*e));
                }
                if faults && s.dups_left > 0 {
                    out.push(Action::Duplicate(*e));
                }
            }
            settled = false;
            out.push(Action::Deliver(*e));
        }
        let may_time_out = faults || settled;
        for (i, n) in s.nodes.iter().enumerate() {
            let i = i as u8;
            if faults && n.up && s.crashes_left > 0 {
                out.push(Action::Crash(i));
            }
            if faults && !n.up {
                out.push(Action::Restart(i));
            }
        }
        for (i, b) in s.brokers.iter().enumerate() {
            let i = i as u8;
            match (b.role, b.elect) {
                (Role::Follower, None) => {
                    out.push(Action::Watch(i));
                    if b.may_stand && b.term < self.max_term {
                        out.push(Action::Stand(i));
                    }
                }
                (Role::Leader, None) => {
                    if b.seq < self.max_seq {
                        out.push(Action::Refresh(i));
                    }
                    if b.window_died {
                        out.push(Action::CheckTerm(i));
                    }
                }
                (
                    Role::Leader,
                    Some(ElectOp {
                        kind: ElectKind::Refresh { .. },
                        ..
                    }),
                ) if may_time_out => out.push(Action::Overdue(i)),
                _ => {}
            }
            let claim_stays = self.sabotage == Some(Sabotage::ClaimWithoutTimeout)
                && matches!(
                    b.elect,
                    Some(ElectOp {
                        kind: ElectKind::Claim { .. },
                        ..
                    })
                );
            if b.elect.is_some() && may_time_out && !claim_stays {
                out.push(Action::ElectTimeout(i));
            }
            if b.batch.is_none() && !b.queue.is_empty() {
                out.push(Action::Close(i));
            }
            if b.batch.is_some() && may_time_out {
                out.push(Action::ServeTimeout(i));
            }
        }
        for (i, c) in s.clients.iter().enumerate() {
            let i = i as u8;
            match c.pending {
                None if c.sent < self.requests => out.push(Action::Request(i)),
                Some(_) if faults && s.retries_left > 0 => out.push(Action::Retry(i)),
                // Quiet: the client's deadline runs out once no broker holds its request
                // (a batch that failed, a request a broker dropped): it tries the next.
                Some(p) if !faults && settled && !held(s, i, p.req) => out.push(Action::Retry(i)),
                _ => {}
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut cx = Ctx {
            cfg: self,
            s: s.clone(),
        };
        let take = |cx: &mut Ctx, e: &Env| -> bool {
            match cx.s.net.iter().position(|x| x == e) {
                Some(i) => {
                    cx.s.net.remove(i);
                    true
                }
                None => false,
            }
        };
        match action {
            Action::Deliver(e) => {
                if !take(&mut cx, &e) {
                    return None;
                }
                cx.deliver(e, false);
            }
            Action::Lose(e) => {
                if !take(&mut cx, &e) {
                    return None;
                }
                cx.s.drops_left -= 1;
                cx.deliver(e, true);
            }
            Action::Duplicate(e) => {
                cx.s.dups_left -= 1;
                cx.send(e.src, e.dst, e.msg);
            }
            Action::Crash(n) => {
                cx.s.crashes_left -= 1;
                let node = &mut cx.s.nodes[n as usize];
                node.up = false;
                node.hb = None;
            }
            Action::Restart(n) => cx.s.nodes[n as usize].up = true,
            Action::Watch(b) => cx.watch(b),
            Action::Stand(b) => cx.stand(b),
            Action::Refresh(b) => cx.refresh(b),
            Action::Overdue(b) => cx.overdue(b),
            Action::CheckTerm(b) => {
                cx.s.brokers[b as usize].window_died = false;
                cx.start_elect(
                    b,
                    ElectKind::ReadTerm {
                        max: 0,
                        check: true,
                    },
                    |tag| Msg::ReadTerm { tag },
                );
            }
            Action::Close(b) => cx.close(b),
            Action::ElectTimeout(b) => cx.elect_timeout(b),
            Action::ServeTimeout(b) => cx.serve_timeout(b),
            Action::Request(c) => cx.request(c),
            Action::Retry(c) => cx.retry(c),
        }
        cx.purge();
        Some(cx.s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut ps = vec![
            Property::always(props::UNIQUE, |_, s: &State| !s.ghost.duplicate),
            Property::always(props::LINEARIZABLE, |_, s: &State| !s.ghost.out_of_order),
            Property::always(props::ONE_PER_TERM, |_, s: &State| !s.ghost.two_in_a_term),
            Property::always(props::STEPPED_DOWN, |_, s: &State| {
                !s.ghost.admitted_not_leading
            }),
            Property::always(props::TERMS_GROW, |_, s: &State| !s.ghost.term_went_back),
            Property::always(props::REDIRECT_CURRENT, |_, s: &State| {
                !s.ghost.stale_redirect
            }),
            Property::sometimes(props::ANSWERED, |_, s: &State| s.ghost.answered > 0),
            Property::sometimes(props::FROM_WINDOW, |_, s: &State| {
                s.ghost.answered_from_window
            }),
            Property::sometimes(props::FAILOVER, |_, s: &State| s.ghost.answered_in_term_2),
        ];
        if self.liveness.is_some() {
            ps.push(Property::always(props::LIVE, |cfg: &Config, s: &State| {
                cfg.liveness
                    .is_none_or(|steps| cfg.quiet_run(s, steps).answered)
            }));
        }
        ps
    }
}

/// Scripts of common beginnings, for the checks that start deeper in a run.
pub mod script {
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
}

//! What the model holds: each actor's state and the ghost the properties read.

use super::{Env, Hb, Tag};

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
    pub(super) fn available(&self) -> u64 {
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

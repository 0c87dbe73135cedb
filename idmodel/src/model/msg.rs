//! The messages: who sends them, and what they say.

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

//! The follow model (issue #45, docs/model.md "The follow model"): producers that stamp
//! items with IDs from a linearizable generator, write them durably, publish them as
//! segments and checkpoints, crash and restart; and a follower that emits the records up
//! to the stable watermark W, the least claim over the shards.
//!
//! The generator is a counter. An ID request is explicit: it begins (the producer awaits
//! it), the generator applies it (the counter moves: the linearization point), and its
//! answer returns. A producer awaits up to [`Config::pipeline`] requests at once and
//! stamps each returned ID on its next item, in the order the answers arrive. A request
//! can time out at any moment, applied or not (unknown outcome); a request nobody awaits
//! any more may still be applied later, and its ID is a hole. A crash (with an immediate
//! restart: a pause is only a delay, which the interleavings already give) keeps the
//! durable items and loses the rest.
//!
//! Checked in every state: what the follower emitted is a prefix of the final list (all
//! items of all shards, by ID), W never goes back, and every segment a checkpoint names
//! is visible when the follower reads it. [`Mutant`] removes one guard at a time.

#![warn(missing_docs)]

use stateright::{Model, Property};

/// The claim of a finished shard: it never holds W back.
pub const INF: u8 = u8::MAX;

/// One guard removed (issue #45, "Proven"): each test must find the counterexample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutant {
    /// A producer claims while one of its ID requests is in flight.
    ClaimInFlight,
    /// A checkpoint names its new segment before the segment is visible; the upload
    /// follows (if the producer does not crash first).
    CheckpointBeforeSegment,
    /// The claim is the largest ID already written (durable), not the largest returned:
    /// items stamped with IDs returned since, not yet durable, are not waited for.
    ClaimLastWritten,
    /// The follower takes the least claim over the shards that have a checkpoint only.
    IgnoreShardWithoutCheckpoint,
}

/// What an ID request is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Its ID stamps the producer's next item.
    Stamp,
    /// An idle producer's fresh ID: it only advances the claim (a hole).
    Fresh,
}

/// An ID request on its way: sent, perhaps applied by the generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Req {
    /// The shard that sent it.
    pub producer: u8,
    /// Whether the producer still awaits the answer: not after a timeout or a crash.
    pub awaited: bool,
    /// What the ID is for.
    pub kind: Kind,
    /// The ID, once the generator applied the request.
    pub id: Option<u8>,
}

/// A shard's checkpoint in the shared store, replaced atomically.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Checkpoint {
    /// The seq ranges `[a, b)` of the published segments, in order.
    pub segments: Vec<(u8, u8)>,
    /// Items published: the end of the last segment.
    pub count: u8,
    /// The claim L ([`INF`] once finished).
    pub claim: u8,
    /// Every item of the shard is published.
    pub finished: bool,
}

/// A producer (shard) process and its local durable store.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Producer {
    /// The IDs of the durable items, by seq (survive a crash).
    pub durable: Vec<u8>,
    /// Items stamped (these IDs) but not yet durable, next seqs in order (lost in a crash).
    pub pending: Vec<u8>,
    /// The largest ID returned to this process; after a restart, the largest of its
    /// checkpoint's claim and its durable IDs (every later request begins after those
    /// returned). The claim is taken from it.
    pub returned: u8,
    /// The end of the segment `[checkpoint count, end)` made visible and not yet in a
    /// checkpoint.
    pub uploaded: Option<u8>,
    /// [`Mutant::CheckpointBeforeSegment`]: a segment a checkpoint names, not yet uploaded.
    pub owed: Option<(u8, u8)>,
    /// Stamp requests begun, over every incarnation (beyond [`Config::items`] they draw
    /// on [`State::spare`]).
    pub requests: u8,
}

/// The follower: the checkpoints it last read, W, and what it emitted.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Follower {
    /// Each shard's checkpoint as last read (`None`: none read yet).
    pub view: Vec<Option<Checkpoint>>,
    /// The watermark W of the last emission.
    pub w: u8,
    /// The IDs of the records emitted, in the order emitted.
    pub emitted: Vec<u8>,
}

/// What the history did that the state alone does not show.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Ghost {
    /// The follower's W went back.
    pub w_went_back: bool,
    /// A checkpoint the follower read named a segment that was not visible.
    pub segment_missing: bool,
}

/// The whole system: generator, network, producers, shared store, follower.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The generator's counter: the last ID it handed out.
    pub last_id: u8,
    /// ID requests in flight, sorted (a multiset).
    pub net: Vec<Req>,
    /// The producers, by shard.
    pub producers: Vec<Producer>,
    /// Each shard's checkpoint in the shared store.
    pub checkpoints: Vec<Option<Checkpoint>>,
    /// The visible segments `(shard, a, b)`, sorted.
    pub visible: Vec<(u8, u8, u8)>,
    /// The follower.
    pub follower: Follower,
    /// Stamp requests left beyond one per item ([`Config::spare`]).
    pub spare: u8,
    /// Fresh-ID requests left ([`Config::fresh`]).
    pub fresh: u8,
    /// Crashes left.
    pub crashes: u8,
    /// Timeouts left.
    pub timeouts: u8,
    /// History notes for the properties.
    pub ghost: Ghost,
}

/// One step. A request is named by its fields (the first equal one in flight).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Producer begins an ID request.
    Begin(u8, Kind),
    /// The generator applies a request: the next ID.
    Apply(Req),
    /// An applied request's answer reaches the producer awaiting it.
    Return(Req),
    /// The producer stops awaiting a request (timeout: outcome unknown).
    Timeout(Req),
    /// Producer makes its first pending item durable.
    Write(u8),
    /// Producer seals its durable, unpublished items into a segment and makes it visible.
    Upload(u8),
    /// Producer replaces its checkpoint (new segment, claim, finished).
    Checkpoint(u8),
    /// Producer is killed -9 and restarted.
    Crash(u8),
    /// The follower reads a shard's checkpoint, then computes W from the checkpoints it
    /// last read of every shard and emits the records in (previous W, W].
    Read(u8),
}

/// The bounds of one check, and the mutant under check.
#[derive(Clone, Debug)]
pub struct Config {
    /// Producers (shards): the follower expects them all.
    pub producers: u8,
    /// Items each producer writes.
    pub items: u8,
    /// Most ID requests a producer awaits at once.
    pub pipeline: u8,
    /// Stamp requests beyond one per item, over all producers and restarts: the retries.
    pub spare: u8,
    /// Fresh-ID requests in all (idle producers advancing their claims).
    pub fresh: u8,
    /// Crashes in all.
    pub crashes: u8,
    /// Timeouts in all.
    pub timeouts: u8,
    /// The guard removed, if any.
    pub mutant: Option<Mutant>,
}

/// The properties' names.
pub mod props {
    /// Safety: the follower's output is always a prefix of the final list.
    pub const PREFIX: &str = "what the follower emitted is a prefix of the final list";
    /// Safety: W never decreases.
    pub const W_GROWS: &str = "the follower's W never goes back";
    /// Safety: the follower finds every segment its checkpoints name.
    pub const SEGMENTS_FOUND: &str = "every segment a checkpoint names is visible";
    /// Reached (a finding, not a safety property the follower needs): pipelined answers
    /// stamped as they arrive put a shard's IDs out of seq order.
    pub const SHARD_DISORDER: &str = "a shard's IDs go against its seq";
    /// Reached: the follower emitted something while a shard was not finished.
    pub const EARLY: &str = "the follower emits before every shard finished";
    /// Reached: the follower emitted every item.
    pub const COMPLETE: &str = "the follower emits every item";

    /// The safety properties (`always`).
    pub const SAFETY: [&str; 3] = [PREFIX, W_GROWS, SEGMENTS_FOUND];
}

impl Config {
    /// The bounded check `cargo test` runs (docs/model.md, "The follow model"): 2
    /// producers of 2 items, 2 requests in flight, 1 retry, 1 crash, 1 timeout.
    pub fn small() -> Config {
        Config {
            producers: 2,
            items: 2,
            pipeline: 2,
            spare: 1,
            fresh: 0,
            crashes: 1,
            timeouts: 1,
            mutant: None,
        }
    }

    /// Idle producers: [`Config::small`] with one fresh ID (a producer with nothing to
    /// stamp advancing its claim) and no faults, which would multiply the states.
    pub fn idle() -> Config {
        Config {
            spare: 0,
            fresh: 1,
            crashes: 0,
            timeouts: 0,
            ..Config::small()
        }
    }

    /// The same bounds with `mutant`.
    pub fn with_mutant(mut self, mutant: Mutant) -> Config {
        self.mutant = Some(mutant);
        self
    }

    /// The start: nothing stamped, no checkpoint, nothing emitted.
    pub fn initial(&self) -> State {
        let k = self.producers as usize;
        State {
            last_id: 0,
            net: Vec::new(),
            producers: vec![Producer::default(); k],
            checkpoints: vec![None; k],
            visible: Vec::new(),
            follower: Follower {
                view: vec![None; k],
                w: 0,
                emitted: Vec::new(),
            },
            spare: self.spare,
            fresh: self.fresh,
            crashes: self.crashes,
            timeouts: self.timeouts,
            ghost: Ghost::default(),
        }
    }

    fn is(&self, m: Mutant) -> bool {
        self.mutant == Some(m)
    }

    /// The watermark the follower's view gives: the least claim over the expected
    /// shards, one without a checkpoint counting 0. `None`: no shard counted.
    pub fn watermark(&self, view: &[Option<Checkpoint>]) -> Option<u8> {
        let skip = self.is(Mutant::IgnoreShardWithoutCheckpoint);
        view.iter()
            .filter_map(|c| match c {
                Some(c) => Some(c.claim),
                None if skip => None,
                None => Some(0),
            })
            .min()
    }

    fn producer_actions(&self, s: &State, p: u8, out: &mut Vec<Action>) {
        let pr = &s.producers[p as usize];
        let ckpt = s.checkpoints[p as usize].clone().unwrap_or_default();
        if ckpt.finished {
            return;
        }
        let awaited = |k: Option<Kind>| {
            s.net
                .iter()
                .filter(|r| r.producer == p && r.awaited && k.is_none_or(|k| r.kind == k))
                .count()
        };
        if awaited(None) < self.pipeline as usize {
            let stamped = pr.durable.len() + pr.pending.len() + awaited(Some(Kind::Stamp));
            if stamped < self.items as usize && (pr.requests < self.items || s.spare > 0) {
                out.push(Action::Begin(p, Kind::Stamp));
            }
            // Idle: no request awaited, everything stamped published; only a fresh ID
            // moves its claim.
            let idle = awaited(None) == 0
                && pr.pending.is_empty()
                && pr.uploaded.is_none()
                && pr.durable.len() == ckpt.count as usize;
            if s.fresh > 0 && idle {
                out.push(Action::Begin(p, Kind::Fresh));
            }
        }
        if !pr.pending.is_empty() {
            out.push(Action::Write(p));
        }
        if pr.owed.is_some() || (pr.uploaded.is_none() && pr.durable.len() > ckpt.count as usize) {
            out.push(Action::Upload(p));
        }
        if self.next_checkpoint(s, p as usize).is_some() {
            out.push(Action::Checkpoint(p));
        }
        if s.crashes > 0 {
            out.push(Action::Crash(p));
        }
    }

    /// Whether producer `p` may claim now, its checkpoint to hold `count` items: none of
    /// its requests in flight, no item stamped and not durable, every durable item in
    /// the published segments.
    fn may_claim(&self, s: &State, p: usize, count: u8) -> bool {
        let pr = &s.producers[p];
        let in_flight = s.net.iter().any(|r| r.producer as usize == p && r.awaited);
        (!in_flight || self.is(Mutant::ClaimInFlight))
            && (pr.pending.is_empty() || self.is(Mutant::ClaimLastWritten))
            && pr.durable.len() == count as usize
    }

    /// The checkpoint producer `p` would write now, if it differs from its current one.
    fn next_checkpoint(&self, s: &State, p: usize) -> Option<(Checkpoint, Option<(u8, u8)>)> {
        let pr = &s.producers[p];
        let old = s.checkpoints[p].clone();
        let mut c = old.clone().unwrap_or_default();
        let mut owed = None;
        let durable = pr.durable.len() as u8;
        if let Some(b) = pr.uploaded {
            c.segments.push((c.count, b));
            c.count = b;
        } else if self.is(Mutant::CheckpointBeforeSegment) && pr.owed.is_none() && durable > c.count
        {
            owed = Some((c.count, durable));
            c.segments.push((c.count, durable));
            c.count = durable;
        }
        if c.count == self.items {
            c.finished = true;
            c.claim = INF;
        } else if self.may_claim(s, p, c.count) {
            let value = if self.is(Mutant::ClaimLastWritten) {
                pr.durable.last().copied().unwrap_or(0)
            } else {
                pr.returned
            };
            c.claim = c.claim.max(value);
        }
        // A first checkpoint that says nothing new is not written.
        (c != old.unwrap_or_default()).then_some((c, owed))
    }

    fn net_actions(&self, s: &State, out: &mut Vec<Action>) {
        let mut last = None;
        for r in &s.net {
            if last == Some(r) {
                continue;
            }
            last = Some(r);
            match r.id {
                None => out.push(Action::Apply(*r)),
                Some(_) => out.push(Action::Return(*r)),
            }
            if r.awaited && s.timeouts > 0 {
                out.push(Action::Timeout(*r));
            }
        }
    }

    fn follower_actions(&self, s: &State, out: &mut Vec<Action>) {
        for p in 0..self.producers {
            if s.follower.view[p as usize] != s.checkpoints[p as usize] {
                out.push(Action::Read(p));
            }
        }
    }
}

fn take(net: &mut Vec<Req>, r: &Req) -> bool {
    match net.iter().position(|x| x == r) {
        Some(i) => {
            net.remove(i);
            true
        }
        None => false,
    }
}

fn put(net: &mut Vec<Req>, r: Req) {
    // A request nobody awaits is forgotten: its ID, if the generator applies it now or
    // later, never reaches an item or a claim, and a hole changes no other ID's order.
    if r.awaited {
        let i = net.partition_point(|x| *x <= r);
        net.insert(i, r);
    }
}

impl Config {
    fn apply(&self, s: &mut State, r: Req) -> bool {
        if !take(&mut s.net, &r) {
            return false;
        }
        s.last_id += 1;
        put(
            &mut s.net,
            Req {
                id: Some(s.last_id),
                ..r
            },
        );
        true
    }

    fn answer(&self, s: &mut State, r: Req) -> bool {
        if !take(&mut s.net, &r) {
            return false;
        }
        let id = r.id.expect("only applied requests return");
        let pr = &mut s.producers[r.producer as usize];
        pr.returned = pr.returned.max(id);
        let stamped = pr.durable.len() + pr.pending.len();
        if r.kind == Kind::Stamp && stamped < self.items as usize {
            pr.pending.push(id);
        }
        true
    }

    fn timeout(&self, s: &mut State, r: Req) -> bool {
        if !take(&mut s.net, &r) {
            return false;
        }
        s.timeouts -= 1;
        put(
            &mut s.net,
            Req {
                awaited: false,
                ..r
            },
        );
        true
    }

    fn crash(&self, s: &mut State, p: usize) {
        s.crashes -= 1;
        let net = std::mem::take(&mut s.net);
        for r in net {
            let awaited = r.awaited && r.producer as usize != p;
            put(&mut s.net, Req { awaited, ..r });
        }
        let claim = s.checkpoints[p].as_ref().map_or(0, |c| c.claim);
        let pr = &mut s.producers[p];
        pr.pending.clear();
        pr.uploaded = None;
        pr.owed = None;
        pr.returned = claim.max(pr.durable.last().copied().unwrap_or(0));
    }

    fn upload(&self, s: &mut State, p: usize) {
        let count = s.checkpoints[p].as_ref().map_or(0, |c| c.count);
        let pr = &mut s.producers[p];
        let (a, b) = match pr.owed.take() {
            Some(seg) => seg,
            None => {
                let b = pr.durable.len() as u8;
                pr.uploaded = Some(b);
                (count, b)
            }
        };
        let seg = (p as u8, a, b);
        if let Err(i) = s.visible.binary_search(&seg) {
            s.visible.insert(i, seg);
        }
    }

    fn checkpoint(&self, s: &mut State, p: usize) -> bool {
        let Some((c, owed)) = self.next_checkpoint(s, p) else {
            return false;
        };
        s.checkpoints[p] = Some(c);
        let pr = &mut s.producers[p];
        pr.uploaded = None;
        if owed.is_some() {
            pr.owed = owed;
        }
        true
    }

    /// The follower's step: W from its view, then the records in (previous W, W] from
    /// the segments its view names, in ID order.
    fn emit(&self, s: &mut State) {
        let Some(w) = self.watermark(&s.follower.view) else {
            return;
        };
        let old = s.follower.w;
        if w < old {
            s.ghost.w_went_back = true;
            s.follower.w = w;
            return;
        }
        let mut out: Vec<u8> = Vec::new();
        for (p, c) in s.follower.view.iter().enumerate() {
            let Some(c) = c else { continue };
            for &(a, b) in &c.segments {
                if s.visible.binary_search(&(p as u8, a, b)).is_err() {
                    s.ghost.segment_missing = true;
                    continue;
                }
                let ids = &s.producers[p].durable[a as usize..b as usize];
                out.extend(ids.iter().filter(|&&id| id > old && id <= w));
            }
        }
        out.sort_unstable();
        s.follower.emitted.extend(out);
        s.follower.w = w;
    }
}

/// Calls `f` on every ID the state holds (claims and W included; 0 and [`INF`] too).
fn each_id(s: &mut State, f: &mut impl FnMut(&mut u8)) {
    s.net
        .iter_mut()
        .filter_map(|r| r.id.as_mut())
        .for_each(&mut *f);
    for p in &mut s.producers {
        p.durable.iter_mut().chain(&mut p.pending).for_each(&mut *f);
        f(&mut p.returned);
    }
    let views = s.follower.view.iter_mut();
    for c in s.checkpoints.iter_mut().chain(views).flatten() {
        f(&mut c.claim);
    }
    f(&mut s.follower.w);
    s.follower.emitted.iter_mut().for_each(&mut *f);
}

/// Renumbers the IDs densely, keeping their order: every step only compares IDs, and
/// takes a new one above all, so states that differ only by holes are one state.
fn compact(s: &mut State) {
    let mut used = Vec::new();
    each_id(s, &mut |id| used.push(*id));
    used.retain(|&id| id != 0 && id != INF);
    used.sort_unstable();
    used.dedup();
    each_id(s, &mut |id| {
        if let Ok(i) = used.binary_search(id) {
            *id = i as u8 + 1;
        }
    });
    s.last_id = used.len() as u8;
}

/// Whether the follower's output is a prefix of the final list in `s`: strictly
/// increasing, and every durable item (each is in the final list) with an ID up to the
/// last emitted is emitted. Durable items only grow, so a violation shows in the state
/// where it happens.
pub fn emitted_is_a_prefix(s: &State) -> bool {
    let e = &s.follower.emitted;
    if !e.windows(2).all(|w| w[0] < w[1]) {
        return false;
    }
    let Some(&top) = e.last() else {
        return true;
    };
    s.producers
        .iter()
        .flat_map(|p| &p.durable)
        .all(|&id| id > top || e.binary_search(&id).is_ok())
}

/// Whether every shard's durable IDs increase with their seq.
pub fn shards_in_order(s: &State) -> bool {
    s.producers
        .iter()
        .all(|p| p.durable.windows(2).all(|w| w[0] < w[1]))
}

impl Model for Config {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        for p in 0..self.producers {
            self.producer_actions(s, p, out);
        }
        self.net_actions(s, out);
        self.follower_actions(s, out);
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut s = s.clone();
        let ok = match action {
            Action::Begin(p, kind) => {
                let pr = &mut s.producers[p as usize];
                if kind == Kind::Fresh {
                    s.fresh -= 1;
                } else if pr.requests >= self.items {
                    s.spare -= 1;
                } else {
                    pr.requests += 1;
                }
                let r = Req {
                    producer: p,
                    awaited: true,
                    kind,
                    id: None,
                };
                put(&mut s.net, r);
                true
            }
            Action::Apply(r) => self.apply(&mut s, r),
            Action::Return(r) => self.answer(&mut s, r),
            Action::Timeout(r) => self.timeout(&mut s, r),
            Action::Write(p) => {
                let pr = &mut s.producers[p as usize];
                let id = pr.pending.remove(0);
                pr.durable.push(id);
                true
            }
            Action::Upload(p) => {
                self.upload(&mut s, p as usize);
                true
            }
            Action::Checkpoint(p) => self.checkpoint(&mut s, p as usize),
            Action::Crash(p) => {
                self.crash(&mut s, p as usize);
                true
            }
            Action::Read(p) => {
                s.follower.view[p as usize] = s.checkpoints[p as usize].clone();
                self.emit(&mut s);
                true
            }
        };
        if ok {
            s.net.sort_unstable();
            compact(&mut s);
        }
        ok.then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(props::PREFIX, |_, s: &State| emitted_is_a_prefix(s)),
            Property::always(props::W_GROWS, |_, s: &State| !s.ghost.w_went_back),
            Property::always(props::SEGMENTS_FOUND, |_, s: &State| {
                !s.ghost.segment_missing
            }),
            Property::sometimes(props::SHARD_DISORDER, |_, s: &State| !shards_in_order(s)),
            Property::sometimes(props::EARLY, |_, s: &State| {
                !s.follower.emitted.is_empty()
                    && s.checkpoints
                        .iter()
                        .any(|c| !c.as_ref().is_some_and(|c| c.finished))
            }),
            Property::sometimes(props::COMPLETE, |cfg: &Config, s: &State| {
                s.follower.emitted.len() == cfg.producers as usize * cfg.items as usize
            }),
        ]
    }
}

/// The safety properties broken in `s` (by name).
pub fn broken(s: &State) -> Vec<&'static str> {
    let flags = [
        !emitted_is_a_prefix(s),
        s.ghost.w_went_back,
        s.ghost.segment_missing,
    ];
    props::SAFETY
        .iter()
        .zip(flags)
        .filter(|(_, f)| *f)
        .map(|(p, _)| *p)
        .collect()
}

//! A broker's election: heartbeats, candidacy, claims, refreshes, stepping down.

use super::ctx::Ctx;
use super::{ElectKind, ElectOp, Hb, Msg, Role, Tag};
use broker::serve::rules::{Candidacy, LeadStep};

impl Ctx<'_> {
    pub(super) fn start_elect(&mut self, b: u8, kind: ElectKind, msg: impl Fn(Tag) -> Msg) {
        let tag = self.next_tag(b);
        self.s.brokers[b as usize].elect = Some(ElectOp {
            tag,
            answered: 0,
            ok: 0,
            kind,
        });
        self.send_nodes(b, msg(tag));
    }

    pub(super) fn watch(&mut self, b: u8) {
        self.s.brokers[b as usize].may_stand = false;
        self.start_elect(b, ElectKind::ReadHb { newest: None }, |tag| Msg::ReadHb {
            tag,
        });
    }

    pub(super) fn stand(&mut self, b: u8) {
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

    /// A leader whose window died reads the term register.
    pub(super) fn check_term(&mut self, b: u8) {
        self.s.brokers[b as usize].window_died = false;
        self.start_elect(
            b,
            ElectKind::ReadTerm {
                max: 0,
                check: true,
            },
            |tag| Msg::ReadTerm { tag },
        );
    }

    pub(super) fn refresh(&mut self, b: u8) {
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
    pub(super) fn follow(&mut self, b: u8, term: u64, leader: Option<(u64, u8)>) {
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

    /// A node's answer to the election operation in flight: counted once per node, then
    /// taken by the step of its kind.
    pub(super) fn elect_reply(&mut self, b: u8, n: u8, msg: Msg) {
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
        match (op.kind, msg) {
            (ElectKind::ReadHb { .. }, Msg::HbIs { hb, .. }) => self.hb_read(b, answers, hb),
            (ElectKind::ReadTerm { .. }, Msg::TermIs { value, .. }) => {
                self.term_read(b, answers, value)
            }
            (ElectKind::Claim { .. }, Msg::Claimed { ok, .. }) => {
                self.claim_answered(b, answers, ok)
            }
            (ElectKind::Refresh { .. }, Msg::Refreshed { higher, .. }) => {
                self.refresh_answered(b, higher)
            }
            _ => {}
        }
    }

    /// The heartbeat read's `answers`th answer, `hb`: once a majority answered, the
    /// newest heartbeat names the leader if it counts, and the broker may stand.
    fn hb_read(&mut self, b: u8, answers: u32, hb: Option<Hb>) {
        let majority = self.cfg.majority() as u32;
        let rules = self.rules();
        let br = &mut self.s.brokers[b as usize];
        let Some(ElectOp {
            kind: ElectKind::ReadHb { newest },
            ..
        }) = br.elect.as_mut()
        else {
            return;
        };
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

    /// The term register read's `answers`th answer, `value`: once a majority answered, a
    /// leader whose window died checks it still leads; a candidate goes on.
    fn term_read(&mut self, b: u8, answers: u32, value: u64) {
        let majority = self.cfg.majority() as u32;
        let rules = self.rules();
        let br = &mut self.s.brokers[b as usize];
        let Some(ElectOp {
            kind: ElectKind::ReadTerm { max, check },
            ..
        }) = br.elect.as_mut()
        else {
            return;
        };
        *max = (*max).max(value);
        if answers < majority {
            return;
        }
        let (register, check) = (*max, *check);
        br.elect = None;
        br.term_read = br.term_read.max(register);
        if check {
            if br.role == Role::Leader && rules.steps_down_after_dead_window(br.term, register) {
                self.follow(b, register, None);
            }
            return;
        }
        self.candidacy(b, register);
    }

    /// The claim's `answers`th answer: leads once granted, follows once a majority can
    /// no longer accept.
    fn claim_answered(&mut self, b: u8, answers: u32, accepted: bool) {
        let majority = self.cfg.majority();
        let nodes = self.cfg.nodes as usize;
        let rules = self.rules();
        let br = &mut self.s.brokers[b as usize];
        let Some(op) = br.elect.as_mut() else { return };
        let ElectKind::Claim { term } = op.kind else {
            return;
        };
        if accepted {
            op.ok += 1;
        }
        let ok = op.ok as usize;
        if rules.granted(ok, nodes) {
            br.role = Role::Leader;
            br.elect = None;
            br.seq = 0;
            br.leader = Some((term, b));
            self.set_term(b, term);
        } else if answers as usize - ok > nodes - majority {
            let t = br.term;
            self.follow(b, t, None);
        }
    }

    /// A refresh's answer, `higher` the heartbeat of a higher term a node holds: the
    /// leader steps down to it, or counts the refresh.
    fn refresh_answered(&mut self, b: u8, h: Option<Hb>) {
        let majority = self.cfg.majority();
        let rules = self.rules();
        let br = &mut self.s.brokers[b as usize];
        let Some(op) = br.elect.as_mut() else { return };
        let ElectKind::Refresh { higher } = &mut op.kind else {
            return;
        };
        if let Some(h) = h {
            if higher.is_none_or(|x| h.key() > x.key()) {
                *higher = Some(h);
            }
        } else {
            op.ok += 1;
        }
        let (higher, ok) = (*higher, op.ok as usize);
        match rules.after_refresh(higher.map(|h| h.term), ok, majority, false) {
            LeadStep::StepDown(t) => {
                br.newest = higher.map(Hb::key);
                let leader = higher.map(|h| (h.term, h.broker));
                self.follow(b, t, leader);
            }
            LeadStep::Refreshed => br.elect = None,
            LeadStep::Keep | LeadStep::StepDownUnrefreshed => {}
        }
    }

    /// A candidate read `register` from the term register.
    pub(super) fn candidacy(&mut self, b: u8, register: u64) {
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

    pub(super) fn elect_timeout(&mut self, b: u8) {
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

    pub(super) fn overdue(&mut self, b: u8) {
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
}

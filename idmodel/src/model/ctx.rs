//! One state being changed by a step: the network's sends and deliveries.

use super::{Addr, Config, Env, Msg, State, Tag};
use broker::serve::rules::Rules;

/// One state being changed by a step: sends go to the network, and the ghost notes.
pub(super) struct Ctx<'a> {
    pub(super) cfg: &'a Config,
    pub(super) s: State,
}

impl Ctx<'_> {
    pub(super) fn rules(&self) -> Rules {
        self.cfg.rules
    }

    pub(super) fn send(&mut self, src: Addr, dst: Addr, msg: Msg) {
        let e = Env { src, dst, msg };
        let at = self.s.net.partition_point(|x| *x < e);
        self.s.net.insert(at, e);
    }

    pub(super) fn send_nodes(&mut self, b: u8, msg: Msg) {
        for n in 0..self.cfg.nodes {
            self.send(Addr::Broker(b), Addr::Node(n), msg);
        }
    }

    pub(super) fn next_tag(&mut self, b: u8) -> Tag {
        let br = &mut self.s.brokers[b as usize];
        br.tag = br.tag.wrapping_add(1);
        br.tag
    }

    pub(super) fn set_term(&mut self, b: u8, term: u64) {
        let br = &mut self.s.brokers[b as usize];
        if term < br.term {
            self.s.ghost.term_went_back = true;
        }
        br.term = term;
    }

    /// Delivers `e`; a node's answer reaches its broker in the same step unless `lost`.
    pub(super) fn deliver(&mut self, e: Env, lost: bool) {
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

    pub(super) fn broker_reply(&mut self, b: u8, n: u8, msg: Msg) {
        match msg {
            Msg::Max { .. } | Msg::Wrote { .. } => self.serve_reply(b, n, msg),
            _ => self.elect_reply(b, n, msg),
        }
    }

    /// Forgets messages whose delivery can change nothing: reads of operations their
    /// broker no longer waits for, answers to requests their client no longer waits
    /// for. (Writes stay: a stale write landing late is what the model must try.)
    pub(super) fn purge(&mut self) {
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
pub(super) fn held(s: &State, c: u8, req: u8) -> bool {
    s.brokers.iter().any(|b| {
        b.queue.iter().any(|q| (q.0, q.1) == (c, req))
            || b.batch
                .as_ref()
                .is_some_and(|bt| bt.reqs.iter().any(|q| (q.0, q.1) == (c, req)))
    })
}

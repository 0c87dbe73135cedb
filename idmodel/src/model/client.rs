//! A client's side: requests, redirects, retries.

use super::ctx::Ctx;
use super::{Addr, Msg, Pending};

/// Most redirects one client request follows before it gives up (idclient's
/// `MAX_REDIRECTS` bounds the chained ones; here every redirect counts, which bounds
/// the model too).
pub const MAX_REDIRECTS: u8 = 3;

impl Ctx<'_> {
    pub(super) fn client(&mut self, c: u8, src: Addr, msg: Msg) {
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

    pub(super) fn request(&mut self, c: u8) {
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

    pub(super) fn retry(&mut self, c: u8) {
        self.s.retries_left = self.s.retries_left.saturating_sub(1);
        let brokers = self.cfg.brokers;
        let cl = &mut self.s.clients[c as usize];
        let Some(p) = cl.pending.as_mut() else { return };
        p.target = (p.target + 1) % brokers;
        let (target, req) = (p.target, p.req);
        cl.preferred = target;
        self.send(Addr::Client(c), Addr::Broker(target), Msg::Next { req });
    }
}

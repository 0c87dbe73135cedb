//! A broker serving requests: batches, the confirmed window, fresh rounds.

use super::ctx::Ctx;
use super::{Addr, Batch, Msg, Role, Stage, Window};
use broker::serve::rules::{Confirm, Read};

impl Ctx<'_> {
    pub(super) fn next_request(&mut self, b: u8, c: u8, req: u8) {
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

    pub(super) fn close(&mut self, b: u8) {
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
    pub(super) fn confirmed(&mut self, b: u8, max: u64) {
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
    pub(super) fn fresh(&mut self, b: u8) {
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

    pub(super) fn hand_out(&mut self, b: u8, lo: u64, from_window: bool) {
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

    pub(super) fn serve_reply(&mut self, b: u8, n: u8, msg: Msg) {
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

    pub(super) fn serve_timeout(&mut self, b: u8) {
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
}

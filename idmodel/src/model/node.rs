//! A Redis node's side: the conditional writes and the registers.

use super::ctx::Ctx;
use super::Msg;

impl Ctx<'_> {
    /// Node `n` applies `msg`: its answer.
    pub(super) fn node(&mut self, n: u8, msg: Msg) -> Option<Msg> {
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

    /// Node `n` crashes: its durable registers stay, its heartbeat is lost.
    pub(super) fn crash(&mut self, n: u8) {
        self.s.crashes_left -= 1;
        let node = &mut self.s.nodes[n as usize];
        node.up = false;
        node.hb = None;
    }
}

//! The transitions: which steps are enabled in a state, and what one does ([`Model`] for
//! [`Config`]).

use super::ctx::{held, Ctx};
use super::{props, Action, Addr, Broker, Config, ElectKind, ElectOp, Env, Role, Sabotage, State};
use stateright::{Model, Property};

impl Model for Config {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.from.clone().unwrap_or_else(|| self.initial())]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let settled = self.network_steps(s, out);
        // Without faults, a timeout waits until nothing more can be delivered.
        let may_time_out = self.faults || settled;
        self.node_steps(s, out);
        for (i, b) in s.brokers.iter().enumerate() {
            self.broker_steps(i as u8, b, may_time_out, out);
        }
        self.client_steps(s, settled, out);
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
            Action::Crash(n) => cx.crash(n),
            Action::Restart(n) => cx.s.nodes[n as usize].up = true,
            Action::Watch(b) => cx.watch(b),
            Action::Stand(b) => cx.stand(b),
            Action::Refresh(b) => cx.refresh(b),
            Action::Overdue(b) => cx.overdue(b),
            Action::CheckTerm(b) => cx.check_term(b),
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
        props::all(self)
    }
}

impl Config {
    /// The network's steps: deliver each message in flight (once per distinct message),
    /// or to an up node lose its answer or duplicate it. Whether nothing is deliverable.
    fn network_steps(&self, s: &State, out: &mut Vec<Action>) -> bool {
        let faults = self.faults;
        let mut last = None;
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
        settled
    }

    /// Nodes crash and restart, with faults only.
    fn node_steps(&self, s: &State, out: &mut Vec<Action>) {
        for (i, n) in s.nodes.iter().enumerate() {
            let i = i as u8;
            if self.faults && n.up && s.crashes_left > 0 {
                out.push(Action::Crash(i));
            }
            if self.faults && !n.up {
                out.push(Action::Restart(i));
            }
        }
    }

    /// Broker `i`'s own steps: by its role and the election operation in flight, then
    /// its timeouts and batches.
    fn broker_steps(&self, i: u8, b: &Broker, may_time_out: bool, out: &mut Vec<Action>) {
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

    /// The clients' steps: a next request, or a retry.
    fn client_steps(&self, s: &State, settled: bool, out: &mut Vec<Action>) {
        let faults = self.faults;
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
}

//! The broker's decisions as pure functions: no tokio, no sockets, no Redis. The
//! election ([`crate::serve::election`]), window serving ([`crate::serve::window`]) and
//! admission ([`crate::serve::leader_source`]) call these, and so does the model checker
//! (`idmodel/`, docs/model.md), which therefore checks this very logic, not a copy.
//!
//! Every function is a method of [`Rules`], which carries an optional [`Mutant`]: one
//! guard removed, so the model's tests can show, guard by guard, the counterexample the
//! checker finds without it, or that it finds none and why (docs/model.md, "Mutants").
//! The broker always passes [`RULES`], which breaks nothing.

/// Which rules to apply: [`RULES`] (every guard kept) in the broker; a [`Mutant`] only
/// in the model's negative tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Rules {
    /// The guard removed, if any.
    pub mutant: Option<Mutant>,
}

/// The rules the broker runs: every guard kept.
pub const RULES: Rules = Rules { mutant: None };

/// One guard removed (model tests only; the broker never makes one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutant {
    /// Hands out the IDs set aside for a batch without waiting for its confirmation read.
    ServeBeforeConfirm,
    /// Confirms a batch with a read that started before the batch closed.
    AcceptStaleConfirm,
    /// Keeps serving a window that a read found another writer above.
    KeepDeadWindow,
    /// A follower adopts a heartbeat whatever its term: its term can go back.
    IgnoreHeartbeatTerm,
    /// A redirect names the leader it knows even when that leader's term is older than
    /// the newest term the broker has seen.
    RedirectToOlderTerm,
    /// A candidate leads a term that fewer than a majority of nodes accepted.
    GrantWithoutMajority,
    /// A broker that does not lead starts requests instead of redirecting them.
    AdmitWhileNotLeading,
    /// A leader whose refresh met a heartbeat of a higher term keeps leading (it steps
    /// down only once no majority took its refresh for an election timeout).
    IgnoreHigherTermOnRefresh,
    /// A leader whose window died keeps leading whatever term the term register holds.
    KeepLeadingAfterDeadWindow,
    /// A confirmation read below the TOP a majority accepted (a node lost acknowledged
    /// writes) confirms the batch like any other: windows stay on.
    IgnoreLostWrites,
    /// A reservation that won extends the window even if it does not start right above
    /// TOP (another writer got in between).
    ExtendNonContiguous,
    /// A candidate keeps a heartbeat term above the term register's highest (one no
    /// election produced) and claims the term after it.
    KeepUnclaimedTerm,
}

/// What a candidate does after reading the term register ([`Rules::candidacy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidacy {
    /// A term above every one it saw exists: follow it (its leader may be alive) and give
    /// its heartbeat an election timeout to show.
    Follow(u64),
    /// Claim this term (the highest seen + 1) with one conditional write.
    Claim(u64),
    /// The register holds `u64::MAX`: no election can follow it.
    Exhausted(u64),
}

/// What a leader does after one heartbeat refresh ([`Rules::after_refresh`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeadStep {
    /// A node holds a (trusted) heartbeat of this higher term: step down and follow it.
    StepDown(u64),
    /// No majority took the heartbeat for an election timeout: step down.
    StepDownUnrefreshed,
    /// A majority took it: the lead is fresh again.
    Refreshed,
    /// Neither: keep leading, the timeout has not run out.
    Keep,
}

/// What a confirmation read decides for the IDs a batch set aside ([`Rules::confirm`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirm {
    /// Hand them out.
    Serve,
    /// Another writer got past the window: they are holes; serve the batch from a newer
    /// window.
    Dead,
    /// The read found less than a TOP a majority accepted: a node lost acknowledged
    /// writes; windows go off for good.
    LostWrites,
}

/// A finished confirmation read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// The largest register value among a majority of answers.
    pub max: u64,
    /// Whether every read of it started after the batch closed (only such a read can
    /// see every ID returned before the batch's requests were sent).
    pub after_close: bool,
}

impl Rules {
    /// The rules with `mutant`'s guard removed.
    pub const fn with(mutant: Mutant) -> Rules {
        Rules {
            mutant: Some(mutant),
        }
    }

    fn broken(self, m: Mutant) -> bool {
        self.mutant == Some(m)
    }

    /// How many of `nodes` make a majority.
    pub const fn majority(nodes: usize) -> usize {
        nodes / 2 + 1
    }

    /// Election, follower: whether the newest trusted heartbeat it read, `hb` =
    /// `(term, seq)`, is news of a live leader to follow. Only one of the highest term
    /// seen counts (an older term's leader has been superseded), and only a change from
    /// the newest seen (`newest`) shows a leader alive.
    pub fn heartbeat_counts(
        self,
        hb: (u64, u64),
        known_term: u64,
        newest: Option<(u64, u64)>,
    ) -> bool {
        let current = hb.0 >= known_term || self.broken(Mutant::IgnoreHeartbeatTerm);
        current && newest.is_none_or(|n| hb > n)
    }

    /// Election, candidate: whether its term `known_term` must be forgotten, being above
    /// `register`, the highest term it ever read from the term register (any of its
    /// majority reads, the one just made included). Such a term came from a heartbeat
    /// that no election produced: every leader claims its term on a majority first, and
    /// two majorities share a node. A term the register itself showed (a claim only a
    /// minority took, followed) is at or below `register`, so it is kept: comparing with
    /// the latest read alone would take it back (the model checker found that).
    pub fn term_unclaimed(self, known_term: u64, register: u64) -> bool {
        known_term > register && !self.broken(Mutant::KeepUnclaimedTerm)
    }

    /// Election, candidate: what to do once the term register read `register`, having
    /// seen `known_term` (after [`Rules::term_unclaimed`] was applied).
    pub fn candidacy(self, known_term: u64, register: u64) -> Candidacy {
        let highest = register.max(known_term);
        if highest > known_term {
            return Candidacy::Follow(highest);
        }
        match highest.checked_add(1) {
            Some(term) => Candidacy::Claim(term),
            None => Candidacy::Exhausted(highest),
        }
    }

    /// Election, candidate: whether `accepted` of `nodes` accepting the claim of a term
    /// makes it the leader of that term (two majorities share a node, which accepts a
    /// term once: no two candidates win one term).
    pub fn granted(self, accepted: usize, nodes: usize) -> bool {
        if self.broken(Mutant::GrantWithoutMajority) {
            return accepted >= 1;
        }
        accepted >= Self::majority(nodes)
    }

    /// Election, leader: what one refresh of its heartbeat means. `higher`: the term of
    /// a trusted heartbeat above its own that a node holds; `acked` of a `majority`
    /// took the refresh; `overdue`: no majority took one for an election timeout.
    pub fn after_refresh(
        self,
        higher: Option<u64>,
        acked: usize,
        majority: usize,
        overdue: bool,
    ) -> LeadStep {
        if let Some(t) = higher {
            if !self.broken(Mutant::IgnoreHigherTermOnRefresh) {
                return LeadStep::StepDown(t);
            }
        }
        if acked >= majority {
            LeadStep::Refreshed
        } else if overdue {
            LeadStep::StepDownUnrefreshed
        } else {
            LeadStep::Keep
        }
    }

    /// Election, leader: whether it steps down after its window died and the term
    /// register read `register` (a higher term: a newer leader reserved past it).
    pub fn steps_down_after_dead_window(self, term: u64, register: u64) -> bool {
        register > term && !self.broken(Mutant::KeepLeadingAfterDeadWindow)
    }

    /// The leader a redirect names: the one a broker knows, `leader` = `(its term, its
    /// address)`, only if that term is the newest the broker has seen, `known_term` (a
    /// leader of an older term has been superseded; a client sent there would be sent
    /// on, or served by a broker about to step down).
    pub fn redirect_names<A>(self, known_term: u64, leader: Option<(u64, A)>) -> Option<A> {
        let (term, addr) = leader?;
        (term >= known_term || self.broken(Mutant::RedirectToOlderTerm)).then_some(addr)
    }

    /// Whether a broker starts a request (else it redirects it): only while it leads.
    /// A request started while leading is served even if the broker stepped down since:
    /// the window's confirmation, not the lead, makes it safe.
    pub fn admits(self, leading: bool) -> bool {
        leading || self.broken(Mutant::AdmitWhileNotLeading)
    }

    /// Window: whether IDs set aside for a batch may be handed out before its
    /// confirmation read has returned. Never: the read is what shows that no other writer
    /// got past the window since the batch's requests were sent.
    pub fn serves_unconfirmed(self) -> bool {
        self.broken(Mutant::ServeBeforeConfirm)
    }

    /// Window: whether a finished read may confirm a batch at all: only one started
    /// after the batch closed.
    pub fn read_usable(self, read: Read) -> bool {
        read.after_close || self.broken(Mutant::AcceptStaleConfirm)
    }

    /// Window: whether a read of `max` below `known_top` (the TOP a majority accepted
    /// before the read started) shows a node lost acknowledged writes.
    pub fn lost_writes(self, max: u64, known_top: u64) -> bool {
        max < known_top && !self.broken(Mutant::IgnoreLostWrites)
    }

    /// Window: what a usable read of `max` decides for IDs set aside under a window
    /// whose TOP was `known_top`; `live_top`: the TOP of that same window now, if it is
    /// still alive (one of its reservations may have won meanwhile).
    pub fn confirm(self, max: u64, known_top: u64, live_top: Option<u64>) -> Confirm {
        if self.lost_writes(max, known_top) {
            return Confirm::LostWrites;
        }
        let confirmed = max <= known_top || live_top.is_some_and(|top| max <= top);
        if confirmed || self.broken(Mutant::KeepDeadWindow) {
            Confirm::Serve
        } else {
            Confirm::Dead
        }
    }

    /// Window: whether a reservation of `lo..` that `won` extends the window (alive,
    /// TOP `top`): only if it starts right above TOP (windows are contiguous; a
    /// reservation that cannot start there means another writer got in between).
    pub fn reservation_extends(self, won: bool, alive: bool, top: u64, lo: u64) -> bool {
        won && alive && (top.checked_add(1) == Some(lo) || self.broken(Mutant::ExtendNonContiguous))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_adopts_only_news_of_the_highest_term() {
        assert!(RULES.heartbeat_counts((2, 1), 2, None));
        assert!(RULES.heartbeat_counts((2, 5), 1, Some((1, 9))));
        assert!(
            !RULES.heartbeat_counts((1, 9), 2, Some((1, 5))),
            "an older term"
        );
        assert!(
            !RULES.heartbeat_counts((2, 5), 2, Some((2, 5))),
            "no change"
        );
        let m = Rules::with(Mutant::IgnoreHeartbeatTerm);
        assert!(m.heartbeat_counts((1, 9), 2, Some((1, 5))));
    }

    #[test]
    fn a_candidate_follows_a_newer_term_or_claims_the_next() {
        assert_eq!(RULES.candidacy(3, 5), Candidacy::Follow(5));
        assert_eq!(RULES.candidacy(5, 5), Candidacy::Claim(6));
        assert_eq!(RULES.candidacy(0, 0), Candidacy::Claim(1));
        assert_eq!(
            RULES.candidacy(u64::MAX, u64::MAX),
            Candidacy::Exhausted(u64::MAX)
        );
        assert!(RULES.term_unclaimed(7, 5) && !RULES.term_unclaimed(5, 5));
        assert!(!Rules::with(Mutant::KeepUnclaimedTerm).term_unclaimed(7, 5));
    }

    #[test]
    fn a_term_takes_a_majority() {
        assert!(!RULES.granted(1, 3) && RULES.granted(2, 3) && RULES.granted(3, 5));
        assert!(!RULES.granted(2, 5));
        assert!(Rules::with(Mutant::GrantWithoutMajority).granted(1, 3));
    }

    #[test]
    fn a_leader_steps_down_on_a_higher_term_or_when_unrefreshed() {
        assert_eq!(
            RULES.after_refresh(Some(4), 3, 2, false),
            LeadStep::StepDown(4)
        );
        assert_eq!(RULES.after_refresh(None, 2, 2, true), LeadStep::Refreshed);
        assert_eq!(RULES.after_refresh(None, 1, 2, false), LeadStep::Keep);
        assert_eq!(
            RULES.after_refresh(None, 1, 2, true),
            LeadStep::StepDownUnrefreshed
        );
        assert!(RULES.steps_down_after_dead_window(2, 3));
        assert!(!RULES.steps_down_after_dead_window(3, 3));
        let m = Rules::with(Mutant::IgnoreHigherTermOnRefresh);
        assert_eq!(m.after_refresh(Some(4), 3, 2, false), LeadStep::Refreshed);
        assert_eq!(m.after_refresh(Some(4), 1, 2, false), LeadStep::Keep);
        assert_eq!(
            m.after_refresh(Some(4), 1, 2, true),
            LeadStep::StepDownUnrefreshed
        );
        let m = Rules::with(Mutant::KeepLeadingAfterDeadWindow);
        assert!(!m.steps_down_after_dead_window(2, 3));
    }

    #[test]
    fn a_redirect_never_names_a_superseded_leader() {
        assert_eq!(RULES.redirect_names(3, Some((3, "a"))), Some("a"));
        assert_eq!(RULES.redirect_names(3, Some((2, "a"))), None);
        assert_eq!(RULES.redirect_names::<&str>(3, None), None);
        let m = Rules::with(Mutant::RedirectToOlderTerm);
        assert_eq!(m.redirect_names(3, Some((2, "a"))), Some("a"));
    }

    #[test]
    fn a_window_serves_only_what_a_fresh_read_confirms() {
        assert!(!RULES.serves_unconfirmed());
        assert!(!RULES.read_usable(Read {
            max: 0,
            after_close: false
        }));
        assert_eq!(RULES.confirm(10, 10, Some(10)), Confirm::Serve);
        assert_eq!(RULES.confirm(12, 10, Some(20)), Confirm::Serve);
        assert_eq!(RULES.confirm(12, 10, None), Confirm::Dead);
        assert_eq!(RULES.confirm(9, 10, Some(10)), Confirm::LostWrites);
        let m = Rules::with(Mutant::KeepDeadWindow);
        assert_eq!(m.confirm(12, 10, None), Confirm::Serve);
        assert!(RULES.reservation_extends(true, true, 10, 11));
        assert!(!RULES.reservation_extends(true, true, 10, 12));
        assert!(!RULES.reservation_extends(true, false, 10, 11));
        let m = Rules::with(Mutant::IgnoreLostWrites);
        assert!(!m.lost_writes(9, 10));
        assert_eq!(m.confirm(9, 10, Some(10)), Confirm::Serve);
        let m = Rules::with(Mutant::ExtendNonContiguous);
        assert!(m.reservation_extends(true, true, 10, 12));
        assert!(!m.reservation_extends(true, false, 10, 11));
    }

    #[test]
    fn only_a_leader_admits() {
        assert!(RULES.admits(true) && !RULES.admits(false));
        assert!(Rules::with(Mutant::AdmitWhileNotLeading).admits(false));
    }
}

//! Leader election among window-serving brokers (DESIGN.md, "Leader and followers").
//!
//! Brokers serving from windows would kill each other's windows (safe, but holes and
//! extra fsync rounds), so they elect one leader through the same quorum, in terms:
//!
//! - Term register: the key `<key>:term` on every node is an ID register like `<key>`
//!   itself. A candidate proposes `T` = (highest term it has seen) + 1 with the
//!   conditional write "if term < T then term = T" ([`ElectionQuorum::claim_term`]); a
//!   majority accepting makes it leader of `T`. Two candidates never both win `T` (any two
//!   majorities share a node, which accepts `T` once), terms are fsync'd and never reused.
//! - Heartbeat: the leader refreshes the volatile key `<key>:leader` = `TERM SEQ ADDR` on
//!   every node every [`ElectionConfig::heartbeat`] ([`idclient::refresh_heartbeat`]; no
//!   fsync). A follower reads it from a majority at the same pace and counts the leader
//!   alive while the newest heartbeat it sees keeps CHANGING (a later `SEQ` or term). When
//!   it sees no change for its election timeout (randomized in `[t, 2t)` for
//!   `t` = [`ElectionConfig::election_timeout`], redrawn on every change, so followers
//!   rarely stand at once) it becomes a candidate. A follower that finds no heartbeat
//!   at all on a majority (a fresh quorum, or a leader that resigned on shutdown,
//!   [`LeaderSource::resign`](crate::LeaderSource::resign)) stands after two heartbeat intervals: there is no leader
//!   to wait for.
//! - Step down: a leader becomes a follower when a refresh finds the heartbeat of a higher
//!   term on a node, when it could not refresh a majority for `t`, or when its window died
//!   (another writer got past it: the new leader's reservation, or a direct client) and
//!   the term register shows a higher term.
//!
//! Only the leader serves; a follower or candidate answers `NextIds` with a redirect to
//! the leader it knows ([`LeaderSource`](crate::LeaderSource)). Safety never depends on any of this:
//! windows stay safe with two leaders (they only cost holes), so timing only decides who
//! serves and how fast a failover is.

mod quorum;

pub use quorum::{ElectionQuorum, QuorumElection};

use crate::serve::rules::{Candidacy, LeadStep, RULES};
use crate::serve::source::{Leadership, Role, Status};
use idclient::Heartbeat;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, Instant};

/// Default base election timeout (`--election-timeout-ms`): a follower waits `[t, 2t)`.
pub const ELECTION_TIMEOUT: Duration = Duration::from_millis(200);

/// Default heartbeat interval (`--heartbeat-ms`): the leader's refresh and the
/// followers' read pace.
pub const HEARTBEAT: Duration = Duration::from_millis(50);

/// The election's timing and this broker's address.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// The address clients reach this broker at (`--advertise`), sent in redirects.
    pub advertise: String,
    /// Base election timeout `t`: a follower stands after `[t, 2t)` without a change of
    /// heartbeat; a leader steps down after `t` without refreshing a majority.
    pub election_timeout: Duration,
    /// The leader's refresh interval, and the followers' read interval.
    pub heartbeat: Duration,
    /// Seeds the timeout jitter (tests replay exactly); `None`: from the OS.
    pub seed: Option<u64>,
}

impl ElectionConfig {
    /// Defaults ([`ELECTION_TIMEOUT`], [`HEARTBEAT`]) for a broker reached at `advertise`.
    pub fn new(advertise: impl Into<String>) -> ElectionConfig {
        ElectionConfig {
            advertise: advertise.into(),
            election_timeout: ELECTION_TIMEOUT,
            heartbeat: HEARTBEAT,
            seed: None,
        }
    }

    /// Checks that the timing makes sense.
    ///
    /// # Errors
    /// A message naming the bad setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.heartbeat.is_zero() {
            return Err("the heartbeat interval must be positive".into());
        }
        if self.election_timeout < self.heartbeat * 2 {
            return Err(format!(
                "the election timeout ({:?}) must be at least twice the heartbeat interval ({:?})",
                self.election_timeout, self.heartbeat
            ));
        }
        if self.election_timeout > Duration::from_secs(3600) {
            return Err("the election timeout must be at most an hour".into());
        }
        if self.advertise.trim().is_empty() {
            return Err("the advertised address must not be empty".into());
        }
        // The heartbeat carries it; a node keeps only printable ASCII (no blanks) there.
        if !self.advertise.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "the advertised address {:?} must be printable ASCII without blanks (host:port)",
                self.advertise
            ));
        }
        Ok(())
    }

    /// How long the heartbeat key lives: several timeouts, so a follower still finds its
    /// leader's address after a few missed refreshes. Liveness is judged by change.
    fn ttl(&self) -> Duration {
        self.election_timeout * 4
    }
}

/// The election's state, shared by its task and the serving path.
pub struct Election {
    status: Mutex<Status>,
    /// `status.role == Leader`, readable without the lock on every request.
    leading: AtomicBool,
    redirects: AtomicU64,
    elections: AtomicU64,
    /// This broker's own address (`--advertise`): never a leader to forward to while it
    /// does not lead (a heartbeat of its own from before a restart can name it).
    advertise: String,
    /// Every change of `status`, for whoever waits for a leader (RESP forwarding).
    changes: watch::Sender<Status>,
    /// A live leader's heartbeat (one that changed since this broker started) names this
    /// broker's own address while it does not lead: a wrong `--advertise` on one of the
    /// two. RESP requests are then answered at once, not left to wait for a leader.
    own_address_named: AtomicBool,
    /// Set when this broker resigned ([`LeaderSource::resign`](crate::LeaderSource::resign)): until then, RESP
    /// requests it forwards wait for the next leader; after it, they are answered.
    handoff_until: Mutex<Option<Instant>>,
}

impl Election {
    pub(crate) fn new(advertise: String) -> Election {
        let status = Status {
            role: Role::Follower,
            term: 0,
            leader: None,
        };
        Election {
            status: Mutex::new(status.clone()),
            leading: AtomicBool::new(false),
            redirects: AtomicU64::new(0),
            elections: AtomicU64::new(0),
            advertise,
            changes: watch::channel(status).0,
            own_address_named: AtomicBool::new(false),
            handoff_until: Mutex::new(None),
        }
    }

    /// Whether this broker leads now: read without the lock, on every request.
    pub(crate) fn leading(&self) -> bool {
        self.leading.load(Relaxed)
    }

    /// The leader a request is redirected to (`None`: none known), counted as a redirect.
    pub(crate) fn redirect(&self) -> Option<String> {
        let leader = self.lock().leader.clone();
        self.redirects.fetch_add(1, Relaxed);
        leader
    }

    /// Requests redirected so far.
    pub fn redirects(&self) -> u64 {
        self.redirects.load(Relaxed)
    }

    /// This broker resigned: requests wait for the next leader until `until`, no longer.
    pub(crate) fn hand_off_until(&self, until: Instant) {
        *self.handoff_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
    }

    /// When this broker resigned: until when a request waits for the next leader
    /// (then it is answered "no leader known" at once: this broker stands no more).
    pub fn handoff_until(&self) -> Option<Instant> {
        *self.handoff_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This broker's advertised address.
    pub fn advertise(&self) -> &str {
        &self.advertise
    }

    /// Whether a live leader's heartbeat names this broker's own address while it does
    /// not lead (a wrong `--advertise` on one of the two).
    pub fn own_address_named(&self) -> bool {
        self.own_address_named.load(Relaxed)
    }

    #[cfg(test)]
    pub(crate) fn set_own_address_named(&self, named: bool) {
        self.own_address_named.store(named, Relaxed);
    }

    /// Sees every later change of [`Election::status`] (the current one is marked seen).
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.changes.subscribe()
    }

    /// Where the election stands now.
    pub fn status(&self) -> Status {
        self.lock().clone()
    }

    /// Elections this broker stood in (won or lost).
    pub fn elections(&self) -> u64 {
        self.elections.load(Relaxed)
    }

    /// Waits until this broker leads or knows a leader, at most `limit`: whether it
    /// does. (idbroker waits for this before it says it is listening, so a client that
    /// connects at once is served or redirected to a leader, not told "no leader yet".)
    pub async fn wait_settled(&self, limit: Duration) -> bool {
        let settled =
            |s: &Status| s.role == Role::Leader || (s.role == Role::Follower && s.leader.is_some());
        let end = Instant::now() + limit;
        // Subscribed before looking: a change after the look is seen.
        let mut changes = self.subscribe();
        loop {
            if settled(&self.status()) {
                return true;
            }
            match tokio::time::timeout_at(end, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => return settled(&self.status()),
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Status> {
        // Plain assignments: a panic elsewhere cannot leave it inconsistent.
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set(&self, role: Role, term: u64, leader: Option<String>) {
        let mut s = self.lock();
        if s.role != role || s.term != term || s.leader != leader {
            tracing::info!(
                role = role.name(),
                term,
                leader = leader.as_deref().unwrap_or("(none)"),
                "election"
            );
        }
        let new = Status { role, term, leader };
        if *s != new {
            // Under the lock, so waiters see changes in the order they were made.
            self.changes.send_replace(new.clone());
        }
        *s = new;
        self.leading.store(role == Role::Leader, Relaxed);
    }
}

impl Leadership for Election {
    fn status(&self) -> Status {
        Election::status(self)
    }

    fn subscribe(&self) -> watch::Receiver<Status> {
        Election::subscribe(self)
    }

    fn advertise(&self) -> &str {
        Election::advertise(self)
    }

    fn own_address_named(&self) -> bool {
        Election::own_address_named(self)
    }

    fn handoff_until(&self) -> Option<Instant> {
        Election::handoff_until(self)
    }
}

/// Starts the election task of `shared` over `quorum`: it follows, stands and leads
/// until aborted; `window_died` is the hint that a newer leader may exist
/// ([`WindowSource::died`](crate::serve::window::WindowSource::died)).
pub(crate) fn spawn<E: ElectionQuorum>(
    quorum: Arc<E>,
    config: ElectionConfig,
    shared: Arc<Election>,
    window_died: Arc<Notify>,
) -> JoinHandle<()> {
    tokio::spawn(Machine::new(quorum, config, shared, window_died).run())
}

/// Starts an election task that only watches, from `term` on (a broker that resigned):
/// it learns the next leader, and never stands.
pub(crate) fn spawn_watcher<E: ElectionQuorum>(
    quorum: Arc<E>,
    config: ElectionConfig,
    shared: Arc<Election>,
    term: u64,
) -> JoinHandle<()> {
    let mut m = Machine::new(quorum, config, shared, Arc::new(Notify::new()));
    m.resigned = true;
    m.term = term;
    tokio::spawn(m.run())
}

/// The election task's own state.
struct Machine<E> {
    quorum: Arc<E>,
    config: ElectionConfig,
    shared: Arc<Election>,
    window_died: Arc<Notify>,
    rng: StdRng,
    role: Role,
    term: u64,
    /// The highest term read from the term register (any of its majority reads): a term
    /// at or below it came from the register (perhaps a claim only a minority took), not
    /// from a heartbeat, so it is never forgotten as unclaimed.
    term_read: u64,
    leader: Option<String>,
    /// Follower: the newest heartbeat seen, and when it last changed.
    newest: Option<(u64, u64)>,
    changed: Instant,
    timeout: Duration,
    /// Leader: the refresh counter and the last refresh a majority took.
    seq: u64,
    refreshed: Instant,
    /// This broker resigned: it only watches (learns the next leader), never stands.
    resigned: bool,
    /// What was logged already, so each trouble is logged once, not every heartbeat.
    warned: Warned,
}

/// The troubles the election logs once (at warn or error), then at debug.
#[derive(Default)]
struct Warned {
    forged: bool,
    own_address: bool,
    /// The heartbeat term above the term register last reported.
    unclaimed: Option<u64>,
    exhausted: bool,
}

/// Longest part of an address from a node shown in a log line (a forged one is
/// anything a writer to the nodes chose).
const SHOWN_ADDR: usize = 64;

fn shown(addr: &str) -> String {
    addr.chars().take(SHOWN_ADDR).collect()
}

impl<E: ElectionQuorum> Machine<E> {
    /// A follower that has seen nothing yet.
    fn new(
        quorum: Arc<E>,
        config: ElectionConfig,
        shared: Arc<Election>,
        window_died: Arc<Notify>,
    ) -> Machine<E> {
        let rng = match config.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        let now = Instant::now();
        let mut machine = Machine {
            quorum,
            shared,
            window_died,
            rng,
            role: Role::Follower,
            term: 0,
            term_read: 0,
            leader: None,
            newest: None,
            changed: now,
            timeout: config.election_timeout,
            seq: 0,
            refreshed: now,
            resigned: false,
            warned: Warned::default(),
            config,
        };
        machine.timeout = machine.draw_timeout();
        machine
    }

    fn draw_timeout(&mut self) -> Duration {
        let t = self.config.election_timeout;
        let jitter = self.rng.gen_range(0..t.as_micros().max(1) as u64);
        t + Duration::from_micros(jitter)
    }

    fn publish(&self) {
        self.shared.set(self.role, self.term, self.leader.clone());
    }

    /// Whether `hb` is authentic: signed with the brokers' key, when they have one.
    fn trusts(&self, hb: &Heartbeat) -> bool {
        self.quorum.auth().is_none_or(|auth| auth.verify(hb))
    }

    /// Logs (once) heartbeats of a higher term that the brokers' key does not
    /// authenticate: `forged` (the highest) on `nodes` nodes. They are ignored.
    fn note_forged(&mut self, forged: &Heartbeat, nodes: usize, overwritten: bool) {
        let what = if overwritten {
            "ignored, and overwritten with this leader's"
        } else {
            "ignored"
        };
        if std::mem::replace(&mut self.warned.forged, true) {
            tracing::debug!(
                term = forged.term,
                nodes,
                "unauthenticated heartbeat {what}"
            );
            return;
        }
        tracing::warn!(
            term = forged.term,
            addr = %shown(&forged.addr),
            nodes,
            "a heartbeat on the nodes is not authenticated by the brokers' token (written by \
             someone with write access to the nodes, or by a broker with another \
             --auth-token-file): {what}; no broker follows it or sends its token to its address"
        );
    }

    /// Logs (once) a live leader's heartbeat naming this broker's own address while it
    /// does not lead: the leader's `--advertise` names this broker (or this one's names
    /// the leader), so clients redirected there come back here.
    fn note_own_address(&mut self, hb: &Heartbeat) {
        if std::mem::replace(&mut self.warned.own_address, true) {
            return;
        }
        tracing::warn!(
            term = hb.term,
            addr = %shown(&hb.addr),
            "the leader's heartbeat names this broker's own address while it does not lead: \
             one of the two has a wrong --advertise; clients redirected to the leader reach \
             this follower instead, and RESP requests here find no leader to forward to"
        );
    }

    /// Becomes a follower of `leader` (if known) in `term`, with a fresh timeout.
    fn follow(&mut self, term: u64, leader: Option<String>, why: &str) {
        if self.role == Role::Leader {
            tracing::warn!(term = self.term, new_term = term, "stepping down: {why}");
            // Its own last heartbeat is no sign of a live leader to itself.
            let own = (self.term, self.seq);
            if self.newest.is_none_or(|n| own > n) {
                self.newest = Some(own);
            }
        }
        self.role = Role::Follower;
        self.term = self.term.max(term);
        self.leader = RULES.redirect_names(self.term, leader.map(|l| (term, l)));
        self.changed = Instant::now();
        self.timeout = self.draw_timeout();
        self.publish();
    }

    /// Runs forever (the owner aborts the task).
    async fn run(mut self) {
        self.publish();
        loop {
            match self.role {
                Role::Follower => self.watch().await,
                Role::Candidate => self.stand().await,
                Role::Leader => self.lead().await,
            }
        }
    }

    /// One follower step: read the heartbeats, note a change, stand after a timeout.
    async fn watch(&mut self) {
        let tick = Instant::now() + self.config.heartbeat;
        let mut nobody = false;
        // Stand only on what a majority showed just now: a broker that cannot read a
        // majority cannot win a term anyway, and once it can again (a partition healing),
        // its first read must show it the leader elected meanwhile before it may stand.
        let mut read = false;
        match self.quorum.read_heartbeats(tick).await {
            Ok(seen) => {
                read = true;
                // A forged heartbeat is no leader, but not "nobody" either: the leader
                // overwrites it within a heartbeat; meanwhile nothing changes.
                nobody = seen.iter().all(Option::is_none);
                let (trusted, forged): (Vec<Heartbeat>, Vec<Heartbeat>) =
                    seen.into_iter().flatten().partition(|hb| self.trusts(hb));
                if let Some(f) = forged.iter().max_by_key(|hb| hb.key()) {
                    self.note_forged(f, forged.len(), false);
                }
                let newest = trusted.into_iter().max_by_key(Heartbeat::key);
                // Only a leader of the highest term seen counts: one of an older term has
                // been superseded (it steps down once it sees the newer term).
                if let Some(hb) = newest {
                    if RULES.heartbeat_counts(hb.key(), self.term, self.newest) {
                        // The first heartbeat seen may be this broker's own from before a
                        // restart; one that changes is a live leader's.
                        let own = hb.addr == self.config.advertise && self.newest.is_some();
                        if own {
                            self.note_own_address(&hb);
                        }
                        self.shared.own_address_named.store(own, Relaxed);
                        self.newest = Some(hb.key());
                        self.changed = Instant::now();
                        self.timeout = self.draw_timeout();
                        self.term = hb.term;
                        self.leader = Some(hb.addr);
                        self.publish();
                    }
                }
            }
            Err(e) => tracing::debug!("heartbeat read failed: {e}"),
        }
        // A majority showing no heartbeat at all has no leader to wait for (a fresh
        // quorum, or a leader that resigned): stand after two heartbeats, time enough for
        // a leader just elected to show itself.
        let quiet = self.changed.elapsed();
        let nobody = nobody && quiet >= self.config.heartbeat * 2;
        if read && !self.resigned && (nobody || quiet >= self.timeout) {
            if nobody {
                tracing::info!("no heartbeat on a majority: standing for election");
            } else {
                tracing::info!(
                    term = self.term,
                    timeout = ?self.timeout,
                    "no change of heartbeat for the election timeout: standing for election"
                );
            }
            self.role = Role::Candidate;
            self.leader = None;
            self.publish();
            return;
        }
        sleep_until(tick).await;
    }

    /// One candidate step: claim the next term; leader on a win, follower otherwise.
    async fn stand(&mut self) {
        self.shared.elections.fetch_add(1, Relaxed);
        let deadline = Instant::now() + self.config.election_timeout;
        let register = match self.quorum.read_term(deadline).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!("election: cannot read the term register: {e}");
                return self.follow(self.term, None, "no term");
            }
        };
        self.term_read = self.term_read.max(register);
        if RULES.term_unclaimed(self.term, self.term_read) {
            self.forget_unclaimed_term(self.term_read);
        }
        let term = match RULES.candidacy(self.term, register) {
            // A term we never saw a heartbeat of: its leader may be alive (we were cut
            // off while it was elected). Follow that term and give its heartbeat one
            // election timeout to show before claiming the next one.
            Candidacy::Follow(highest) => {
                return self.follow(highest, None, "a newer term exists");
            }
            Candidacy::Exhausted(highest) => {
                self.note_exhausted(highest);
                return self.follow(highest, None, "terms exhausted");
            }
            Candidacy::Claim(term) => term,
        };
        let highest = self.term;
        match self.quorum.claim_term(term, deadline).await {
            Ok(true) => {
                tracing::info!(term, "won the election: leading");
                self.role = Role::Leader;
                self.term = term;
                self.leader = Some(self.config.advertise.clone());
                self.seq = 0;
                self.refreshed = Instant::now();
                self.publish();
            }
            // Lost (or the outcome is unknown): whoever won shows up as a heartbeat of a
            // term above `highest`; a leader of `highest` that is still alive is followed.
            Ok(false) => self.follow(highest, None, "lost the election"),
            Err(e) => {
                tracing::warn!(term, "election: claiming the term failed: {e}");
                self.follow(highest, None, "claim failed");
            }
        }
    }

    /// A heartbeat showed term `self.term`, above `register`, the highest term this
    /// broker ever read from the term register: no election produced it (every leader
    /// claims its term on a majority first, and any two majorities share a node), so it
    /// was written by hand or forged. Forgets it, so it stops no election, and says so
    /// (once per term).
    fn forget_unclaimed_term(&mut self, register: u64) {
        if self.warned.unclaimed != Some(self.term) {
            self.warned.unclaimed = Some(self.term);
            tracing::warn!(
                heartbeat_term = self.term,
                term_register = register,
                "a heartbeat on the nodes named term {}, above the highest term of the term \
                 register {} ({register}): no election produced it (written by someone with \
                 write access to the nodes); ignoring it{}",
                self.term,
                self.quorum.term_register(),
                if self.quorum.auth().is_some() {
                    ""
                } else {
                    ". Without --auth-token-file heartbeats are not authenticated"
                }
            );
        }
        self.term = register;
        self.newest = None;
    }

    /// The term register holds the largest term: says what it is and how to fix it
    /// (once; every later attempt at debug).
    fn note_exhausted(&mut self, highest: u64) {
        if std::mem::replace(&mut self.warned.exhausted, true) {
            tracing::debug!("election: the term register still holds the largest term");
            return;
        }
        let register = self.quorum.term_register();
        let heartbeat = format!("{}:leader", register.trim_end_matches(":term"));
        tracing::error!(
            "election: the term register {register} holds {highest} on a majority of the \
             nodes, the largest term; no election can follow it, and no broker will lead. \
             Someone with write access to the nodes wrote it (elections only ever add one). \
             To fix: stop every broker of this register, DEL {register} {heartbeat} on every \
             node, then start them again (terms only order leaders: IDs never depend on them)"
        );
    }

    /// One leader step: refresh the heartbeat; step down on a higher term or a lost
    /// majority; between refreshes, a dead window makes it look at the term register.
    async fn lead(&mut self) {
        let tick = Instant::now() + self.config.heartbeat;
        self.seq += 1;
        let mut hb = Heartbeat::new(self.term, self.seq, self.config.advertise.clone());
        if let Some(auth) = self.quorum.auth() {
            hb = auth.sign(hb);
        }
        let refresh = self.quorum.refresh(hb, self.config.ttl(), tick).await;
        if let Some((forged, nodes)) = &refresh.forged {
            self.note_forged(forged, *nodes, true);
        }
        let overdue = self.refreshed.elapsed() >= self.config.election_timeout;
        let higher = refresh.higher.as_ref().map(|hb| hb.term);
        match RULES.after_refresh(higher, refresh.acked, self.quorum.majority(), overdue) {
            LeadStep::StepDown(term) => {
                let why = format!("a node holds the heartbeat of term {term}");
                let addr = refresh.higher.map(|newer| {
                    self.newest = Some(newer.key());
                    newer.addr
                });
                return self.follow(term, addr, &why);
            }
            LeadStep::StepDownUnrefreshed => {
                let why = format!(
                    "no majority took the heartbeat for {:?} ({} of {} failed)",
                    self.config.election_timeout,
                    refresh.failures.len(),
                    refresh.acked + refresh.failures.len()
                );
                return self.follow(self.term, None, &why);
            }
            LeadStep::Refreshed => self.refreshed = Instant::now(),
            LeadStep::Keep => {}
        }
        // Biased: the simulation replays a seed exactly only if nothing here draws from
        // tokio's own (unseeded) RNG. A notification not taken now stays stored.
        tokio::select! {
            biased;
            () = sleep_until(tick) => {}
            () = self.window_died.notified() => {
                let deadline = Instant::now() + self.config.election_timeout;
                let read = self.quorum.read_term(deadline).await;
                if let Ok(t) = read {
                    self.term_read = self.term_read.max(t);
                }
                match read {
                    Ok(t) if RULES.steps_down_after_dead_window(self.term, t) => {
                        self.follow(t, None, "the window died and the term register is higher");
                    }
                    Ok(_) => tracing::debug!("window died; still the leader of the highest term"),
                    Err(e) => tracing::warn!("window died; cannot read the term register: {e}"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;

//! One request across the brokers: failing over when a connection breaks, following
//! redirects to the leader (bounded by [`MAX_REDIRECTS`]), and the leaders outside the
//! list the client learned ([`MAX_LEARNED`] at most).

use super::exchange::Attempt;
use super::{too_many, IdError, IdRange, Inner};
use idproto::NodeFailure;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::MutexGuard;
use std::time::Duration;
use tokio::time::Instant;

/// Most redirects one request follows (each to the leader a broker named): enough for a
/// stale follower, then the broker it named, to lead the way to a new leader. Beyond
/// it the brokers disagree or one advertises a wrong address: more redirects would only
/// open connections.
pub const MAX_REDIRECTS: usize = 3;

/// Most leader addresses outside the list a client remembers (the oldest is replaced):
/// bounds what brokers naming ever new leaders can make it keep.
pub const MAX_LEARNED: usize = 8;

/// First pause between failovers after the first one, doubling up to [`FAILOVER_PAUSE_CAP`].
pub const FAILOVER_PAUSE_BASE: Duration = Duration::from_millis(5);

/// Longest pause between two failovers of one request.
pub const FAILOVER_PAUSE_CAP: Duration = Duration::from_millis(200);

/// Leader addresses outside the list that brokers redirected the client to: a ring of
/// at most [`MAX_LEARNED`], so the index of an address (`addrs.len() + i`) stays valid
/// for as long as a connection to it may live.
#[derive(Default)]
pub(super) struct Learned {
    pub(super) addrs: Vec<String>,
    /// The entry replaced next once the ring is full.
    next: usize,
    /// Where a pass goes on when the learned leader cannot be reached: the broker of the
    /// list after the one that redirected there (as if the redirect had not been
    /// followed, so a leader listed under another name is still found).
    fallback: usize,
}

impl Inner {
    /// One request for `n` IDs, failing over between brokers until `deadline`.
    pub(super) async fn request(&self, n: u64, deadline: Instant) -> Result<IdRange, IdError> {
        let inner = self;
        let mut failures: Vec<NodeFailure> = Vec::new();
        let mut failovers: u32 = 0;
        // Redirects naming a leader that count: the first, then those from a broker an
        // earlier one named (a chain; who named whom, at most MAX_REDIRECTS + 1). A
        // follower naming a leader that cannot be reached (killed, its heartbeat not yet
        // expired) again and again is no chain: the request goes on, paced, until its
        // deadline or the next leader.
        let mut redirects: Vec<String> = Vec::new();
        let mut named: Vec<usize> = Vec::new();
        loop {
            let slot = inner.next_slot.fetch_add(1, Relaxed) % inner.slots.len();
            let conn = inner.conn(slot, deadline, &mut failures).await?;
            if n > conn.max_count {
                return Err(too_many(n, conn.max_count));
            }
            match inner.attempt(&conn, n, deadline).await {
                Attempt::Done(result) => return result,
                Attempt::Failover(failure) => {
                    tracing::debug!(broker = %failure.addr, "failing over: {}", failure.reason);
                    inner.move_on_from(conn.broker);
                    note(&mut failures, failure);
                }
                Attempt::Redirect { from, leader } => {
                    let chained = redirects.is_empty() || named.contains(&conn.broker);
                    if let (Some(l), true) = (&leader, chained) {
                        redirects.push(format!("{from} named {l}"));
                    }
                    let (said, target) = inner.follow(conn.broker, from, leader);
                    named.extend(target.filter(|t| !named.contains(t)));
                    note(&mut failures, said);
                    if redirects.len() > MAX_REDIRECTS {
                        failures.push(too_many_redirects(&redirects, target.is_some()));
                        return Err(unavailable(&failures));
                    }
                }
            }
            // The first failover or redirect goes at once (the next broker is likely
            // fine); after that, pause, so a broker that accepts and then drops every
            // request, or brokers that disagree on the leader, cannot pull callers into a
            // reconnect storm.
            failovers += 1;
            tokio::time::sleep_until(
                (Instant::now() + inner.failover_pause(failovers)).min(deadline),
            )
            .await;
        }
    }
}

/// The request was redirected more than [`MAX_REDIRECTS`] times: `redirects` says
/// which broker named which leader, in order; `followed`: the last one was followed
/// (else the reason is the closed list, said by the broker's own entry).
fn too_many_redirects(redirects: &[String], followed: bool) -> NodeFailure {
    let hint = if followed {
        ": the brokers disagree about the leader, or a leader advertises an address that \
         does not reach it (check each idbroker's --advertise)"
    } else {
        ""
    };
    NodeFailure {
        addr: "broker client".into(),
        reason: format!(
            "redirected {} times in one request ({}), more than the {MAX_REDIRECTS} allowed{hint}",
            redirects.len(),
            redirects.join(", ")
        ),
    }
}

/// Records `failure`, keeping one entry per broker (the latest) so the list stays short.
pub(super) fn note(failures: &mut Vec<NodeFailure>, failure: NodeFailure) {
    failures.retain(|f| f.addr != failure.addr);
    failures.push(failure);
}

/// Notes an attempt the request's deadline cut short: it says less than an earlier
/// failure of the same broker (a refused token, a refused connection), whose cause is
/// kept, with the cut said after it.
pub(super) fn note_cut(failures: &mut Vec<NodeFailure>, failure: NodeFailure) {
    match failures.iter_mut().find(|f| f.addr == failure.addr) {
        Some(earlier) if !earlier.reason.contains("(the last attempt: ") => {
            earlier.reason = format!("{} (the last attempt: {})", earlier.reason, failure.reason);
        }
        Some(_) => {}
        None => failures.push(failure),
    }
}

/// Every broker failed: the error, with what each one did.
pub(super) fn unavailable(failures: &[NodeFailure]) -> IdError {
    IdError::BrokersUnavailable {
        failures: failures.to_vec(),
    }
}

impl Inner {
    /// None before the first failover of a request, then jittered and doubling from
    /// [`FAILOVER_PAUSE_BASE`] up to [`FAILOVER_PAUSE_CAP`].
    fn failover_pause(&self, failovers: u32) -> Duration {
        match failovers.checked_sub(2) {
            None => Duration::ZERO,
            Some(k) => self.failover_backoff.pause(FAILOVER_PAUSE_BASE, k),
        }
    }

    /// After broker `b` redirected a request: new connections go to the leader it named
    /// if that is one of our brokers (the same `host:port`, or the same socket address)
    /// or, unless the list is closed, wherever it is (remembered, see [`Learned`]); else
    /// to the broker after `b`. Returns what to note about `b`, and the broker the
    /// redirect was followed to (the leader it names), if it was.
    fn follow(
        &self,
        b: usize,
        from: String,
        leader: Option<String>,
    ) -> (NodeFailure, Option<usize>) {
        let target = leader.as_deref().and_then(|l| {
            self.index_of(l)
                .or_else(|| (!self.config.closed_list).then(|| self.learn(l, b)))
        });
        tracing::debug!(broker = %from, ?leader, found = target.is_some(), "redirected");
        match target {
            Some(t) => self.preferred.store(t, Relaxed),
            None => self.move_on_from(b),
        }
        let reason = match (&leader, target) {
            (None, _) => "not the leader; no leader known (election under way)".to_string(),
            (Some(l), Some(_)) => format!("not the leader; redirected to {l}"),
            (Some(l), None) => format!(
                "not the leader; the leader {l} is not among the --broker addresses \
                 (--broker-closed-list: add it to --broker, or drop --broker-closed-list \
                 to follow redirects)"
            ),
        };
        (NodeFailure { addr: from, reason }, target)
    }

    pub(super) fn learned(&self) -> MutexGuard<'_, Learned> {
        // Plain field updates: a poisoned lock is still consistent.
        self.learned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers `addr`, a leader outside the list that broker `b` named; its index.
    fn learn(&self, addr: &str, b: usize) -> usize {
        let fallback = self.after(b); // Locks `learned` for a learned `b`: first.
        let mut learned = self.learned();
        learned.fallback = fallback;
        let i = if learned.addrs.len() < MAX_LEARNED {
            learned.addrs.push(addr.to_string());
            learned.addrs.len() - 1
        } else {
            let i = learned.next;
            learned.next = (i + 1) % MAX_LEARNED;
            learned.addrs[i] = addr.to_string();
            i
        };
        tracing::info!(leader = %addr, "following a redirect to a leader outside the broker list");
        self.addrs.len() + i
    }

    /// The address of broker `b`: one of the list, or a learned leader.
    pub(super) fn addr_of(&self, b: usize) -> Option<String> {
        match b.checked_sub(self.addrs.len()) {
            None => self.addrs.get(b).cloned(),
            Some(i) => self.learned().addrs.get(i).cloned(),
        }
    }

    /// The index of the broker at `addr` (listed or learned): the same string, or the
    /// same socket address.
    fn index_of(&self, addr: &str) -> Option<usize> {
        let parsed = addr.parse::<std::net::SocketAddr>().ok();
        let same = |a: &String| {
            a == addr || parsed.is_some_and(|p| a.parse::<std::net::SocketAddr>().ok() == Some(p))
        };
        self.addrs.iter().position(same).or_else(|| {
            let learned = self.learned();
            let i = learned.addrs.iter().position(same)?;
            Some(self.addrs.len() + i)
        })
    }

    /// The broker of the list after broker `b`; after a learned leader, the one after
    /// the broker that redirected there (the list's brokers name the next leader).
    fn after(&self, b: usize) -> usize {
        if b < self.addrs.len() {
            (b + 1) % self.addrs.len()
        } else {
            self.learned().fallback
        }
    }

    /// After broker `b` failed, new connections start at the next one.
    pub(super) fn move_on_from(&self, b: usize) {
        let next = self.after(b);
        let _ = self.preferred.compare_exchange(b, next, Relaxed, Relaxed);
    }

    /// The brokers one pass tries, in order: from the preferred one on through the list
    /// (a learned leader first, then the whole list from the one [`Inner::after`] it).
    pub(super) fn pass_order(&self) -> Vec<usize> {
        let n = self.addrs.len();
        let p = self.preferred.load(Relaxed);
        let (first, from) = if p < n {
            (None, p)
        } else {
            (Some(p), self.after(p))
        };
        first
            .into_iter()
            .chain((0..n).map(|k| (from + k) % n))
            .collect()
    }
}

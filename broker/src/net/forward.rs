//! RESP on a follower: `QLIST.NEXT` forwarded to the leader (DESIGN.md, "Leader and
//! followers"; docs/wire-protocol.md, RESP).
//!
//! A binary client that asks a follower is redirected and resends to the leader itself
//! ([`BrokerClient`] does). Plain Redis clients follow no redirect, so a
//! follower serves their `QLIST.NEXT` by asking the leader over the binary protocol, with
//! a [`BrokerClient`] it keeps per leader (made on first use, replaced when the election
//! names another leader), presenting its own `--auth-token-file` token (the brokers of
//! one quorum share it) and the request's remaining deadline. The cost is one extra hop.
//!
//! Where a request goes is decided from the election's status ([`route`]): this broker
//! leads: its own batcher; a leader other than itself is known: forwarded; none is known
//! (an election under way), or only this broker's own address (a heartbeat from before
//! a restart): it waits, within the deadline, for the status to change. A forward in
//! flight is abandoned when the status names another route (a new leader, or this broker
//! itself) and the request goes there: its first wire request's outcome is unknown, so its
//! IDs, if any, become a hole and are never handed out (the [`BrokerClient`] drops a
//! reply no caller waits for).
//!
//! No forwarding loop is possible: only RESP requests are forwarded, and they reach the
//! leader over the BINARY protocol, which a broker never forwards: a broker that is not
//! the leader (anymore) answers a binary request with a redirect, which the
//! [`BrokerClient`] follows or, naming nobody it knows, retries within the deadline.
//!
//! Bounded (a misadvertised leader must not turn each request into dozens of
//! connections): before its first forward to a newly named leader, the follower asks it
//! once for its stats (one connection) and forwards only if it says it leads. If it
//! cannot be reached, does not complete the handshake, or is not the leader (its
//! `--advertise` names another broker, or a port nothing serves), that failure is kept
//! for [`RETRY_AFTER`]: every request meanwhile is answered at once with it (naming the
//! address and saying to check `--advertise`), logged once per address, and no new
//! connection is made. So a burst of requests to a broken address costs one connection
//! per [`RETRY_AFTER`], not one or more per request.
//!
//! Order and guarantees: the forwarded request is sent after the RESP request arrived and
//! its reply is written after the leader answered, so the leader's real-time order holds
//! for it as for any client; the RESP connection puts the reply back in request order.

use crate::config::BrokerConfig;
use crate::serve::source::{Leadership, Role, Status};
use idclient::broker_client::{fetch_stats_with, BrokerClient, BrokerClientConfig};
use idclient::{IdError, IdRange, NodeFailure};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, OnceCell};
use tokio::time::{timeout_at, Instant};

/// Where a `QLIST.NEXT` goes, given the election's status.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// This broker leads: its own batcher serves it.
    Local,
    /// Forwarded to this leader (its advertised binary address).
    Forward(String),
    /// No leader to ask (an election is under way): wait for one.
    Wait,
}

/// The route for `status`, on the broker advertised as `own`. Never forwards to `own`:
/// a broker that does not lead would only redirect the request back (to itself).
pub(crate) fn route(status: &Status, own: &str) -> Route {
    match (&status.role, &status.leader) {
        (Role::Leader, _) => Route::Local,
        (_, Some(leader)) if leader != own => Route::Forward(leader.clone()),
        _ => Route::Wait,
    }
}

/// How a forwarded request ended.
#[derive(Debug)]
pub(crate) enum Forwarded {
    /// The leader's IDs.
    Ids(IdRange),
    /// The leader's error, or no answer from it within the deadline.
    Failed(IdError),
    /// No leader was known before the deadline.
    NoLeader,
    /// This broker leads now: its own batcher must serve the request.
    Local,
}

/// The client config forwarding uses: the broker's token (brokers of one quorum share
/// it), TLS to the leader when brokers listen with TLS (`--peer-tls-ca`), one
/// connection (it pipelines and coalesces every forwarded request), and a closed list:
/// the token goes only to the leader an authenticated heartbeat named, never on to an
/// address a redirect names (the target is re-chosen from the heartbeats instead).
pub(crate) fn forward_client_config(config: &BrokerConfig) -> BrokerClientConfig {
    BrokerClientConfig {
        token: config.auth_token.clone(),
        tls: config.peer_tls.clone(),
        connections: 1,
        deadline: config.default_deadline,
        closed_list: true,
        ..BrokerClientConfig::default()
    }
}

/// How long a leader address that failed its check (unreachable, no handshake, not the
/// leader) is not tried again: requests meanwhile get that failure at once.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The election's status as one request sees it: the latest value and every change
/// since the request arrived.
struct StatusWatch<'e> {
    changes: watch::Receiver<Status>,
    status: Status,
    /// This broker's own advertised address.
    own: &'e str,
}

impl<'e> StatusWatch<'e> {
    /// Subscribes first, then reads the status: no change after it is missed.
    fn new(election: &'e dyn Leadership) -> StatusWatch<'e> {
        let changes = election.subscribe();
        let own = election.advertise();
        let status = election.status();
        StatusWatch {
            changes,
            status,
            own,
        }
    }

    fn route(&self) -> Route {
        route(&self.status, self.own)
    }

    /// Waits until `until` for the status to change, and takes the new one. False if it
    /// did not change by then, or the election is gone (its channel closed).
    async fn changed(&mut self, until: Instant) -> bool {
        match timeout_at(until, self.changes.changed()).await {
            Ok(Ok(())) => {
                self.status = self.changes.borrow_and_update().clone();
                true
            }
            Ok(Err(_)) | Err(_) => false,
        }
    }
}

/// The forward `attempt` to `leader`: `Some` with its answer when it ends, `None` when
/// the status routed the request elsewhere first (the attempt dropped: its IDs, if
/// any, become a hole).
async fn unless_rerouted(
    attempt: impl std::future::Future<Output = Forwarded>,
    leader: &str,
    watch: &mut StatusWatch<'_>,
    deadline: Instant,
) -> Option<Forwarded> {
    tokio::pin!(attempt);
    // Runs the attempt until it ends, or the status routes the request elsewhere.
    // A status without a leader (a follower standing for election) keeps it: the
    // leader may well answer.
    loop {
        tokio::select! {
            r = &mut attempt => return Some(r),
            changed = watch.changed(deadline) => {
                if !changed {
                    // Deadline or no election: the attempt ends by the deadline.
                    return Some(attempt.await);
                }
                match watch.route() {
                    Route::Forward(l) if l == leader => {}
                    Route::Wait => {}
                    Route::Local | Route::Forward(_) => return None,
                }
            }
        }
    }
}

/// The client of the current leader, connected on first use.
struct Target {
    leader: String,
    client: Arc<OnceCell<BrokerClient>>,
    /// Its last failed check: when, and why (shared by the requests waiting on it).
    failed: Arc<Mutex<Option<(Instant, String)>>>,
}

/// A follower's forwarding of RESP `QLIST.NEXT` requests (one per broker).
pub(crate) struct Forwarder {
    election: Arc<dyn Leadership>,
    config: BrokerClientConfig,
    target: Mutex<Option<Target>>,
}

impl Forwarder {
    pub(crate) fn new(election: Arc<dyn Leadership>, config: &BrokerConfig) -> Forwarder {
        Forwarder {
            election,
            config: forward_client_config(config),
            target: Mutex::new(None),
        }
    }

    /// Whether this broker leads now (its own batcher serves the request).
    pub(crate) fn leading(&self) -> bool {
        self.election.status().role == Role::Leader
    }

    /// The client of `leader` and its failure record: the ones kept if it is the
    /// current target, else new (not yet connected) ones replacing them.
    #[allow(clippy::type_complexity)]
    fn client(
        &self,
        leader: &str,
    ) -> (
        Arc<OnceCell<BrokerClient>>,
        Arc<Mutex<Option<(Instant, String)>>>,
    ) {
        // Plain replacements: a panic elsewhere cannot leave it inconsistent.
        let mut target = self.target.lock().unwrap_or_else(|p| p.into_inner());
        match &*target {
            Some(t) if t.leader == leader => (t.client.clone(), t.failed.clone()),
            _ => {
                let t = Target {
                    leader: leader.to_string(),
                    client: Arc::new(OnceCell::new()),
                    failed: Arc::default(),
                };
                let out = (t.client.clone(), t.failed.clone());
                *target = Some(t);
                out
            }
        }
    }

    /// Checks that `leader` answers and leads (one connection), then connects a client
    /// to it; a failure is recorded in `failed` (logged the first time) and, while it is
    /// recent, returned at once without connecting.
    async fn connect(
        &self,
        leader: &str,
        failed: &Mutex<Option<(Instant, String)>>,
        deadline: Instant,
    ) -> Result<BrokerClient, IdError> {
        let lock = || failed.lock().unwrap_or_else(|p| p.into_inner());
        let unavailable = |reason: String| IdError::BrokersUnavailable {
            failures: vec![NodeFailure {
                addr: leader.to_string(),
                reason,
            }],
        };
        if let Some((at, why)) = lock().as_ref() {
            if at.elapsed() < RETRY_AFTER {
                return Err(unavailable(why.clone()));
            }
        }
        let checked = self.check(leader, deadline).await;
        let result = match checked {
            Ok(()) => {
                let mut config = self.config.clone();
                // Connecting (the handshake included) may take what is left.
                config.deadline = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1));
                BrokerClient::connect(vec![leader.to_string()], config)
                    .await
                    .map_err(|e| format!("cannot connect: {e}"))
            }
            Err(why) => Err(why),
        };
        result.map_err(|why| {
            let why = format!(
                "the leader's heartbeat names {leader}, but {why} (is the leader's --advertise \
                 right?); not tried again for {RETRY_AFTER:?}"
            );
            let first = lock().replace((Instant::now(), why.clone())).is_none();
            if first {
                tracing::warn!(leader = %leader, "cannot forward RESP requests: {why}");
            }
            unavailable(why)
        })
    }

    /// One connection to `leader`: does it answer, and does it say it leads?
    async fn check(&self, leader: &str, deadline: Instant) -> Result<(), String> {
        let (token, tls) = (self.config.token.as_ref(), self.config.tls.as_ref());
        let until = deadline.min(Instant::now() + self.config.connect_timeout);
        let stats = timeout_at(until, fetch_stats_with(leader, token, tls)).await;
        match stats {
            Ok(Ok(s)) if s.role == "leader" => Ok(()),
            Ok(Ok(s)) => Err(format!(
                "the broker there is not the leader (it is a {} of term {}{})",
                s.role,
                s.term,
                s.leader
                    .map(|l| format!(", following {l}"))
                    .unwrap_or_default()
            )),
            Ok(Err(e)) => Err(format!("it cannot be asked: {e}")),
            Err(_) => Err(format!(
                "it did not answer within {:?}",
                self.config.connect_timeout
            )),
        }
    }

    /// `count` IDs from the leader, giving up at `deadline`; `requested` is the deadline
    /// as a duration, for the error message.
    pub(crate) async fn next_ids(
        &self,
        count: u64,
        deadline: Instant,
        requested: Duration,
    ) -> Forwarded {
        let mut watch = StatusWatch::new(&*self.election);
        loop {
            let leader = match self.leader_to_ask(&mut watch, deadline).await {
                Ok(leader) => leader,
                Err(answer) => return answer,
            };
            let attempt = self.ask(&leader, count, deadline, requested);
            if let Some(answer) = unless_rerouted(attempt, &leader, &mut watch, deadline).await {
                return answer;
            }
            tracing::debug!(
                from = %leader,
                "leader changed while forwarding: the request goes to the new one"
            );
        }
    }

    /// The leader to forward to, waiting (within `deadline`) while none is known; or the
    /// request's answer when it is not to be forwarded.
    async fn leader_to_ask(
        &self,
        watch: &mut StatusWatch<'_>,
        deadline: Instant,
    ) -> Result<String, Forwarded> {
        loop {
            match watch.route() {
                Route::Local => return Err(Forwarded::Local),
                Route::Forward(leader) => return Ok(leader),
                Route::Wait
                    if watch.status.leader.as_deref() == Some(watch.own)
                        && self.election.own_address_named() =>
                {
                    // No election will change this: answer now, saying what to fix.
                    return Err(Forwarded::Failed(IdError::Config(format!(
                        "the leader's heartbeat names this broker's own address {} (its \
                         --advertise): one of the two brokers has a wrong --advertise, so \
                         there is no leader to forward to; fix it and restart that broker",
                        watch.own
                    ))));
                }
                Route::Wait => {
                    // A broker that resigned waits for the next leader only so long: it
                    // stands no more, and its shutdown waits for these answers.
                    let until = self
                        .election
                        .handoff_until()
                        .map_or(deadline, |h| h.min(deadline));
                    // Changes after `subscribe` are seen, so none is missed since `status`.
                    // The election outlives every connection; a closed channel would
                    // mean it is gone: nobody will name a leader.
                    if !watch.changed(until).await {
                        return Err(Forwarded::NoLeader);
                    }
                }
            }
        }
    }

    /// One forward to `leader`, connecting its client if needed.
    async fn ask(
        &self,
        leader: &str,
        count: u64,
        deadline: Instant,
        requested: Duration,
    ) -> Forwarded {
        let (cell, failed) = self.client(leader);
        let attempt = async {
            let client = cell
                .get_or_try_init(|| self.connect(leader, &failed, deadline))
                .await?;
            client.next_ids_until(count, deadline).await
        };
        match timeout_at(deadline, attempt).await {
            Ok(Ok(range)) => Forwarded::Ids(range),
            Ok(Err(e)) => Forwarded::Failed(e),
            Err(_) => Forwarded::Failed(IdError::Deadline {
                deadline: requested,
                rounds: 0,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::election::Election;

    fn status(role: Role, leader: Option<&str>) -> Status {
        Status {
            role,
            term: 1,
            leader: leader.map(str::to_string),
        }
    }

    #[test]
    fn routes_follow_the_election() {
        let own = "me:1";
        assert_eq!(route(&status(Role::Leader, Some(own)), own), Route::Local);
        assert_eq!(
            route(&status(Role::Follower, Some("other:2")), own),
            Route::Forward("other:2".into())
        );
        assert_eq!(route(&status(Role::Follower, None), own), Route::Wait);
        assert_eq!(route(&status(Role::Candidate, None), own), Route::Wait);
        // Never to itself: a follower would only redirect the request back to itself.
        assert_eq!(route(&status(Role::Follower, Some(own)), own), Route::Wait);
    }

    fn forwarder(election: &Arc<Election>) -> Forwarder {
        Forwarder::new(election.clone(), &BrokerConfig::default())
    }

    #[tokio::test(start_paused = true)]
    async fn no_leader_within_the_deadline_is_no_leader() {
        let election = Arc::new(Election::new("me:1".into()));
        let f = forwarder(&election);
        let requested = Duration::from_secs(2);
        let start = Instant::now();
        let r = f.next_ids(1, start + requested, requested).await;
        assert!(matches!(r, Forwarded::NoLeader), "{r:?}");
        assert_eq!(start.elapsed(), requested);
        // Its own address named as leader while not leading is no leader either.
        election.set(Role::Follower, 3, Some("me:1".into()));
        let r = f.next_ids(1, Instant::now() + requested, requested).await;
        assert!(matches!(r, Forwarded::NoLeader), "{r:?}");
        // Named by a live leader (a wrong --advertise): answered at once, saying so.
        election.set_own_address_named(true);
        let start = Instant::now();
        let r = f.next_ids(1, start + requested, requested).await;
        let Forwarded::Failed(e) = r else {
            panic!("expected a failure naming --advertise, got {r:?}");
        };
        assert!(
            e.to_string().contains("me:1") && e.to_string().contains("--advertise"),
            "{e}"
        );
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waiting_for_a_leader_is_served_locally_once_it_leads() {
        let election = Arc::new(Election::new("me:1".into()));
        let f = forwarder(&election);
        let requested = Duration::from_secs(5);
        let wait = f.next_ids(1, Instant::now() + requested, requested);
        let elect = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            election.set(Role::Candidate, 1, None);
            tokio::time::sleep(Duration::from_millis(300)).await;
            election.set(Role::Leader, 1, Some("me:1".into()));
        };
        let (r, ()) = tokio::join!(wait, elect);
        assert!(matches!(r, Forwarded::Local), "{r:?}");
        assert!(f.leading());
    }

    #[tokio::test]
    async fn a_leader_that_cannot_be_reached_fails_within_the_deadline() {
        // A port nobody listens on: bound, then closed.
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").to_string()
        };
        let election = Arc::new(Election::new("me:1".into()));
        election.set(Role::Follower, 1, Some(addr.clone()));
        let f = forwarder(&election);
        let requested = Duration::from_millis(300);
        let r = f.next_ids(1, Instant::now() + requested, requested).await;
        let Forwarded::Failed(e) = r else {
            panic!("forwarding to {addr} gave {r:?}");
        };
        assert!(e.to_string().contains(&addr), "{e}");
    }

    /// A named leader that closes every connection (a wrong `--advertise`): checked
    /// once, then every request within [`RETRY_AFTER`] fails at once with that reason,
    /// making no new connection.
    #[tokio::test]
    async fn a_leader_failing_its_check_is_not_asked_again_for_a_while() {
        use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let sink = tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                count.fetch_add(1, Relaxed);
                drop(s);
            }
        });
        let election = Arc::new(Election::new("me:1".into()));
        election.set(Role::Follower, 1, Some(addr.clone()));
        let f = forwarder(&election);
        let requested = Duration::from_secs(2);
        let start = Instant::now();
        for _ in 0..5 {
            let r = f.next_ids(1, Instant::now() + requested, requested).await;
            let Forwarded::Failed(e) = r else {
                panic!("forwarding to {addr} gave {r:?}");
            };
            let e = e.to_string();
            assert!(e.contains(&addr) && e.contains("--advertise"), "{e}");
        }
        assert!(start.elapsed() < RETRY_AFTER, "{:?}", start.elapsed());
        assert_eq!(accepted.load(Relaxed), 1);
        sink.abort();
    }

    #[test]
    fn the_forwarding_client_presents_the_broker_token() {
        let token = idproto::auth::Token::new("s3cret").expect("a token");
        let config = BrokerConfig {
            auth_token: Some(token),
            ..BrokerConfig::default()
        };
        let client = forward_client_config(&config);
        assert!(client.token.as_ref().is_some_and(|t| t.matches(b"s3cret")));
        assert_eq!(client.deadline, config.default_deadline);
    }
}

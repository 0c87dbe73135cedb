//! The accept loop: connection slots, eviction of the longest-idle connection at the
//! cap, and refusals; each connection is served by a task of its own.

use crate::config::BrokerConfig;
use crate::net::refuse::{self, Protocol};
use crate::net::session::{Admission, Ctx, SlotHolder};
use crate::net::{binary, forward, resp};
use crate::serve::queue::IdRequest;
use crate::stats::Stats;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How long a connection admitted at the cap waits for its evicted victim's slot before
/// it is refused (an idle victim hands its slot over as soon as its task runs; this
/// only bounds a stalled one). The wait is the admission's own task's, never the
/// accept loop's.
const EVICT_WAIT: Duration = Duration::from_secs(1);

/// Connections waiting at the cap for a slot at once (each evicted a victim); beyond
/// that a new connection at the cap is refused at once.
const MAX_ADMITTING: usize = 64;

/// Connections being refused at the cap at once (each is told why, then closed);
/// beyond that a refused connection is just closed.
const MAX_REFUSING: usize = 64;

/// The accept loop's state: what every connection shares, and the connection slots.
/// Shared (behind an `Arc`) with the tasks admitting connections at the cap.
pub(crate) struct Acceptor {
    config: Arc<BrokerConfig>,
    stats: Arc<Stats>,
    batch_tx: mpsc::Sender<IdRequest>,
    stopping: watch::Receiver<bool>,
    /// Every connection task holds a clone; the receiver's `recv()` returning `None`
    /// means all of them are done.
    done: mpsc::Sender<()>,
    /// One permit per connection slot.
    limit: Arc<Semaphore>,
    /// One permit per connection being told it was refused at the cap.
    refusing: Arc<Semaphore>,
    /// One permit per connection waiting at the cap for an evicted victim's slot.
    admitting: Arc<Semaphore>,
    conns: Conns,
    next_conn: AtomicU64,
    /// The source's admission check, asked before each request is queued.
    admit: Admission,
    /// Forwarding of RESP requests to the leader, when the source takes part in an
    /// election.
    pub(crate) forward: Option<Arc<forward::Forwarder>>,
}

impl Acceptor {
    pub(crate) fn new(
        config: Arc<BrokerConfig>,
        stats: Arc<Stats>,
        batch_tx: mpsc::Sender<IdRequest>,
        stopping: watch::Receiver<bool>,
        done: mpsc::Sender<()>,
        admit: Admission,
    ) -> Acceptor {
        Acceptor {
            limit: Arc::new(Semaphore::new(config.max_connections)),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            admitting: Arc::new(Semaphore::new(MAX_ADMITTING)),
            conns: Arc::default(),
            next_conn: AtomicU64::new(0),
            admit,
            forward: None,
            config,
            stats,
            batch_tx,
            stopping,
            done,
        }
    }

    /// Accepts connections (binary on `listener`, RESP on `resp`) until `shutdown`
    /// completes. Never waits for anything but the next connection: at the cap, room
    /// is made by a task of the new connection's own ([`Acceptor::admit_at_cap`]).
    pub(crate) async fn serve(
        self: &Arc<Self>,
        listener: &TcpListener,
        resp: Option<&TcpListener>,
        shutdown: impl Future,
    ) {
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                biased;
                _ = &mut shutdown => return,
                accepted = listener.accept() => (accepted, Protocol::Binary),
                accepted = accept_resp(resp) => (accepted, Protocol::Resp),
            };
            let (accepted, protocol) = accepted;
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Typically EMFILE: pausing lets connections close instead of spinning.
                    tracing::warn!("accept failed: {e}; pausing 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            match self.limit.clone().try_acquire_owned() {
                Ok(slot) => self.spawn_conn(stream, peer, slot, protocol),
                Err(_) => self.admit_at_cap(stream, peer, protocol),
            }
        }
    }

    /// At the cap: evicts a victim (see [`choose_victim`]) and, in a task of its own,
    /// waits for the victim's slot for the new connection; refuses it at once when no
    /// connection may be evicted or too many already wait, and once the victim turns
    /// out busy or its slot does not come within [`EVICT_WAIT`].
    fn admit_at_cap(self: &Arc<Self>, stream: TcpStream, peer: SocketAddr, protocol: Protocol) {
        let Ok(waiting) = self.admitting.clone().try_acquire_owned() else {
            return self.refuse(stream, peer, protocol);
        };
        let now = Instant::now();
        let Some((_, inherits)) = choose_victim(&self.conns, self.config.evict_min_idle, now)
        else {
            return self.refuse(stream, peer, protocol);
        };
        let this = self.clone();
        tokio::spawn(async move {
            let slot = tokio::time::timeout(EVICT_WAIT, inherits).await;
            drop(waiting);
            match slot {
                Ok(Ok(slot)) => this.spawn_conn(stream, peer, slot, protocol),
                _ => this.refuse(stream, peer, protocol),
            }
        });
    }

    /// Tells a connection over the cap that it is refused, in its protocol.
    fn refuse(&self, stream: TcpStream, peer: SocketAddr, protocol: Protocol) {
        let cap = refuse::Cap {
            max_connections: self.config.max_connections,
            evict_min_idle: self.config.evict_min_idle,
            tls: self.config.tls.is_some(),
        };
        refuse::at_cap(stream, peer, protocol, &self.refusing, cap, &self.stats);
    }

    /// Serves `stream` in its own task; the connection holds the slot `slot` until it
    /// ends or leaves ([`SlotHolder::release_slot`]).
    fn spawn_conn(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        slot: OwnedSemaphorePermit,
        protocol: Protocol,
    ) {
        let ctx = Ctx {
            config: self.config.clone(),
            stats: self.stats.clone(),
            batch_tx: self.batch_tx.clone(),
            stopping: self.stopping.clone(),
            admit: self.admit.clone(),
        };
        let state = Arc::new(SlotHolder::new(self.config.max_in_flight_per_conn));
        state.hold_slot(slot);
        let key = self.next_conn.fetch_add(1, Relaxed);
        lock(&self.conns).insert(key, state.clone());
        let conns = self.conns.clone();
        let done = self.done.clone();
        let forward = self.forward.clone();
        tokio::spawn(async move {
            match protocol {
                Protocol::Resp => resp::serve(stream, peer, ctx, state.clone(), forward).await,
                Protocol::Binary => binary::serve(stream, peer, ctx, state.clone()).await,
            }
            lock(&conns).remove(&key);
            state.release_slot();
            drop(done);
        });
    }
}

/// The next connection on the RESP listener; never, without one.
async fn accept_resp(resp: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match resp {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// The open connections, by a broker-local key, for eviction at the cap.
type Conns = Arc<Mutex<HashMap<u64, Arc<SlotHolder>>>>;

fn lock(conns: &Conns) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<SlotHolder>>> {
    // Plain inserts and removes: a panic elsewhere cannot leave the map inconsistent.
    conns.lock().unwrap_or_else(|p| p.into_inner())
}

/// At the cap, at `now`: asks one connection idle at least `min_idle` to leave, and
/// returns how long it was idle and the slot it will hand over (to the newcomer that
/// chose it, and no other); `None` (the newcomer is refused) if every connection
/// is busy (a request in flight, a partial frame), was active less than `min_idle`
/// ago, or is already leaving. Connections not yet admitted (no handshake, or no token
/// yet; idle since they connected, whatever they sent) go first, then the longest
/// idle. Each victim is chosen once (under the lock), so concurrent admissions evict
/// different connections. The policy of docs/broker.md, "Connection slots".
fn choose_victim(
    conns: &Conns,
    min_idle: Duration,
    now: Instant,
) -> Option<(Duration, oneshot::Receiver<OwnedSemaphorePermit>)> {
    let conns = lock(conns);
    let (_, idle, victim) = conns
        .values()
        .filter_map(|c| c.idle_for(now).map(|idle| (c.admitted(), idle, c)))
        .filter(|(_, idle, _)| *idle >= min_idle)
        .filter(|(_, _, c)| !c.leaving())
        .min_by_key(|(admitted, idle, _)| (*admitted, std::cmp::Reverse(*idle)))?;
    let inherits = victim.choose_to_evict()?;
    tracing::info!(
        ?idle,
        admitted = victim.admitted(),
        "connection cap reached: evicting the longest-idle connection"
    );
    victim.evict();
    Some((idle, inherits))
}

#[cfg(test)]
mod tests {
    //! The eviction policy (docs/broker.md, "Connection slots") on connections whose idle
    //! times are set, not waited for: no timing in these tests.

    use super::*;

    const MIN: Duration = Duration::from_secs(1);

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// A clock far enough from the process start that `now - idle` exists.
    fn now() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    /// Connections of the given idle times at `now` (`admitted` each), by key.
    fn conns(now: Instant, idle: &[(f64, bool)]) -> (Conns, Vec<Arc<SlotHolder>>) {
        let holders: Vec<_> = idle
            .iter()
            .map(|&(s, admitted)| Arc::new(SlotHolder::idle_at(now, secs(s), admitted)))
            .collect();
        let map = holders
            .iter()
            .enumerate()
            .map(|(k, h)| (k as u64, h.clone()))
            .collect();
        (Arc::new(Mutex::new(map)), holders)
    }

    /// The victims `choose_victim` picks at `now`, one call each, until it refuses.
    fn victims(conns: &Conns, min_idle: Duration, now: Instant) -> Vec<Duration> {
        std::iter::from_fn(|| choose_victim(conns, min_idle, now).map(|(idle, _)| idle))
            .take(100)
            .collect()
    }

    #[test]
    fn idle_at_least_min_idle_is_evicted_longest_first_each_once() {
        let now = now();
        let (c, held) = conns(now, &[(5.0, true), (1.0, true), (30.0, true), (0.5, true)]);
        // 1.0 is exactly the minimum: evicted; 0.5 is not idle long enough.
        assert_eq!(victims(&c, MIN, now), [secs(30.0), secs(5.0), secs(1.0)]);
        let leaving: Vec<bool> = held.iter().map(|h| h.leaving()).collect();
        assert_eq!(leaving, [true, true, true, false]);
        assert_eq!(
            choose_victim(&c, MIN, now).map(|v| v.0),
            None,
            "no victim twice"
        );
    }

    #[test]
    fn connections_not_yet_admitted_go_first() {
        let now = now();
        // Not admitted (no handshake or no token): idle since connect, evicted before
        // any admitted connection however long that one has been idle; but only once
        // it has been connected for the minimum.
        let (c, _) = conns(
            now,
            &[(600.0, true), (2.0, false), (0.5, false), (3.0, false)],
        );
        assert_eq!(victims(&c, MIN, now), [secs(3.0), secs(2.0), secs(600.0)]);
    }

    #[test]
    fn busy_or_recently_active_connections_are_never_evicted() {
        let now = now();
        let (c, held) = conns(now, &[(60.0, true), (60.0, true), (0.2, true)]);
        // A partial frame, and a request in flight: busy however long ago they began.
        held[0].partial.store(true, Relaxed);
        let _in_flight = held[1]
            .in_flight
            .clone()
            .try_acquire_owned()
            .expect("permit");
        assert_eq!(choose_victim(&c, MIN, now).map(|v| v.0), None, "refused");
        assert!(held.iter().all(|h| !h.leaving()));
        // With no minimum the idle one goes; the busy ones still do not.
        assert_eq!(victims(&c, Duration::ZERO, now), [secs(0.2)]);
        // An unadmitted connection is idle whatever it sends.
        let (c, held) = conns(now, &[(60.0, false)]);
        held[0].partial.store(true, Relaxed);
        assert_eq!(victims(&c, MIN, now), [secs(60.0)]);
    }

    #[test]
    fn a_victim_found_busy_may_be_chosen_again() {
        let now = now();
        let (c, held) = conns(now, &[(10.0, true)]);
        assert_eq!(choose_victim(&c, MIN, now).map(|v| v.0), Some(secs(10.0)));
        assert_eq!(
            choose_victim(&c, MIN, now).map(|v| v.0),
            None,
            "already leaving"
        );
        // Its reader woke to a request before the eviction: it stays, and is a
        // candidate again; once it leaves (its slot released) it is not.
        held[0].stay();
        assert_eq!(choose_victim(&c, MIN, now).map(|v| v.0), Some(secs(10.0)));
        held[0].release_slot();
        assert_eq!(choose_victim(&c, MIN, now).map(|v| v.0), None, "it left");
    }

    #[test]
    fn the_victims_slot_goes_to_the_newcomer_that_chose_it_not_the_pool() {
        let now = now();
        let pool = Arc::new(Semaphore::new(2));
        let (c, held) = conns(now, &[(10.0, true), (20.0, true)]);
        for h in &held {
            h.hold_slot(pool.clone().try_acquire_owned().expect("slot"));
        }
        let (_, mut first) = choose_victim(&c, MIN, now).expect("a victim");
        let (_, mut second) = choose_victim(&c, MIN, now).expect("a victim");
        // The victim leaves: its slot is the newcomer's, and the pool stays empty, so a
        // connection accepted meanwhile cannot take it.
        held[1].release_slot();
        let slot = first.try_recv().expect("the slot of the one idle 20 s");
        assert_eq!(pool.available_permits(), 0);
        // A victim that woke up busy keeps its slot; its newcomer learns at once.
        held[0].stay();
        assert!(matches!(
            second.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
        assert_eq!(pool.available_permits(), 0);
        // A newcomer that gave up waiting: the slot goes back to the pool.
        let (_, gave_up) = choose_victim(&c, MIN, now).expect("chosen again");
        drop(gave_up);
        held[0].release_slot();
        assert_eq!(pool.available_permits(), 1);
        drop(slot);
        assert_eq!(pool.available_permits(), 2);
    }

    #[test]
    fn with_no_connection_there_is_no_victim() {
        let (c, _) = conns(now(), &[]);
        assert_eq!(choose_victim(&c, Duration::ZERO, now()).map(|v| v.0), None);
    }
}

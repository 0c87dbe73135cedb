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
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// How long a connection admitted at the cap waits for its evicted victim's slot before
/// it is refused (an idle victim frees its slot at once; this only bounds a race). The
/// wait is the admission's own task's, never the accept loop's.
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
    /// waits for a free slot for the new connection, or refuses it at once when no
    /// connection may be evicted or too many already wait.
    fn admit_at_cap(self: &Arc<Self>, stream: TcpStream, peer: SocketAddr, protocol: Protocol) {
        let Ok(waiting) = self.admitting.clone().try_acquire_owned() else {
            return self.refuse(stream, peer, protocol);
        };
        if choose_victim(&self.conns, self.config.evict_min_idle).is_none() {
            return self.refuse(stream, peer, protocol);
        }
        let this = self.clone();
        tokio::spawn(async move {
            let slot = tokio::time::timeout(EVICT_WAIT, this.limit.clone().acquire_owned()).await;
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

/// At the cap: asks one connection idle at least `min_idle` to leave, and returns how
/// long it was idle; `None` if every connection is busy, was active more recently, or
/// is already leaving. Connections not yet admitted (no handshake, or no token yet)
/// go first, then the longest idle. Each victim is chosen once (under the lock), so
/// concurrent admissions evict different connections.
fn choose_victim(conns: &Conns, min_idle: Duration) -> Option<Duration> {
    let now = Instant::now();
    let conns = lock(conns);
    let (_, idle, victim) = conns
        .values()
        .filter_map(|c| c.idle_for(now).map(|idle| (c.admitted(), idle, c)))
        .filter(|(_, idle, _)| *idle >= min_idle)
        .filter(|(_, _, c)| !c.leaving())
        .min_by_key(|(admitted, idle, _)| (*admitted, std::cmp::Reverse(*idle)))?;
    if !victim.choose_to_evict() {
        return None;
    }
    tracing::info!(
        ?idle,
        admitted = victim.admitted(),
        "connection cap reached: evicting the longest-idle connection"
    );
    victim.evict();
    Some(idle)
}

//! The broker client: IDs from one or more `idbroker`s, with failover.
//!
//! [`BrokerClient`] multiplexes any number of concurrent callers over a few TCP
//! connections (requests are pipelined, matched to replies by request id, and written in
//! batches by one writer task per connection). Connections are idproto's framed
//! connection ([`idproto::framed`]), the one the broker uses: a broker that leaves a
//! reply half-sent (frame timeout) or stops reading requests (write timeout) breaks the
//! connection, like a close does. It holds a list of brokers: when a
//! connection breaks it reconnects to the next broker and resends, within the caller's
//! deadline. That is the ONLY retry here: quorum trouble is retried by the broker, and
//! its typed error is returned as is (DESIGN.md: one retrying layer).
//!
//! Leaders: window-serving brokers elect one leader; the others answer every request
//! with a redirect naming it (its advertised address; the request was not started: no
//! ID was reserved). The client then sends it, and moves its connections, to that
//! broker, whether or not it is in the list: one address (a DNS name, a load balancer,
//! a Kubernetes Service, any one broker) is enough to reach the leader, as with etcd's
//! or TiKV PD's clients. A leader not in the list is remembered (at most
//! [`MAX_LEARNED`] such addresses) so the client's connections go to it and stay there,
//! pooled like any other; it is reached with the same token and TLS settings, its
//! certificate checked for the redirect's host (or the pinned server name). When it
//! fails, the client goes back to its own list, whose brokers name the next leader.
//! With [`BrokerClientConfig::closed_list`] the client never leaves its list: a leader
//! outside it is an error (and the client moves on to the next broker of the list).
//! "No leader known" (an election under way) moves on to the next broker.
//!
//! Redirects are bounded: one request follows at most [`MAX_REDIRECTS`] of them, then
//! fails with the addresses it was sent through, so brokers that disagree about the
//! leader, or a leader advertising a wrong address (one that leads to a follower), cost
//! a few connections per request instead of a storm until the deadline. Redirects also
//! count as failovers for the pause between tries; a caller still waiting at its
//! deadline gets [`IdError::BrokersUnavailable`] listing what each broker said.
//!
//! Never returning an ID twice: a request whose connection broke has an unknown outcome
//! (the broker may have reserved IDs for it); it is resent as a new request, and the old
//! one's reply can never arrive because its connection is gone. A request abandoned at
//! its deadline is removed from the pending table first, so a late reply finds no taker
//! and is dropped. Either way the first request's IDs, if any, become a hole.
//!
//! Coalescing (as TiKV's client batches timestamp requests): a client keeps at most
//! [`BrokerClientConfig::in_flight`] wire requests out. Callers that arrive while all are
//! out wait in one queue; when a request comes back, every caller waiting goes out as ONE
//! request for their total count (at most the broker's `max_count`, else the rest waits
//! for the next), and its range is split among them in queue order. This keeps the
//! guarantee: a coalesced request is sent only after every caller in it invoked, so the
//! range it gets lies above every ID returned before any of them invoked, exactly as if
//! each had sent its own request at that moment. Each caller keeps its own deadline: the
//! wire request carries the latest one; a caller whose deadline passes first is answered
//! [`IdError::Deadline`] then, and its share, should the reply come later, is burned (a
//! hole). A failed request's error goes to each of its callers; failover and resending
//! happen per wire request, as for a single caller.
//!
//! The pieces, one idea a file: `pool` (the connection slots, and opening a connection
//! on a pass over the brokers), `coalesce` (the queue of waiting callers and its
//! dispatcher), `failover` (one request across brokers: failovers, redirects and the
//! learned leaders), `conn` (one framed connection: handshake, reader, writer, its table
//! of waiting requests), `exchange` (one request and its reply on a connection), `stats`
//! ([`fetch_stats`]).

mod coalesce;
mod conn;
mod exchange;
mod failover;
mod pool;
mod stats;

pub use failover::{FAILOVER_PAUSE_BASE, FAILOVER_PAUSE_CAP, MAX_LEARNED, MAX_REDIRECTS};
pub use stats::{fetch_stats, fetch_stats_with, fetch_stats_with_token, STATS_TIMEOUT};

use crate::backoff::Backoff;
use crate::{BrokerTls, IdError, IdRange, IdSource};
use coalesce::{coalesced, Queue};
use failover::Learned;
use idproto::auth::Token;
use idproto::framed::{self, Timeouts};
use pool::{Slot, MAX_RECONNECT_PAUSE};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Default total time one `next_ids` call may take, failovers included.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// Default time to open a connection and finish the handshake with one broker. Short:
/// a broker that does not answer promptly is skipped for the next one.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Default number of connections. One pipelined connection carries 100k+ requests/s;
/// a second spreads the decoding over both of the broker's threads.
pub const DEFAULT_CONNECTIONS: usize = 2;

/// Default number of wire requests a client keeps out while coalescing: one. A window
/// broker pipelines confirmations itself (`idbroker --pipeline`), so a second request out
/// buys little latency, and one request carrying every waiting caller costs the client,
/// the broker and the nodes the least per ID: at 1, 16, 64 and 256 callers, 1 beat 2 and
/// 4 in IDs/s and in p50 (BENCHMARKS.md, "Pipelined confirmations").
pub const DEFAULT_IN_FLIGHT: usize = 1;

/// Configuration of a [`BrokerClient`].
#[derive(Debug, Clone)]
pub struct BrokerClientConfig {
    /// Total time one `next_ids` call may take, reconnects and failovers included.
    pub deadline: Duration,
    /// Time to connect and handshake with one broker before trying the next.
    pub connect_timeout: Duration,
    /// Connections kept open (all to the preferred broker; callers are spread over them).
    pub connections: usize,
    /// Seeds the jitter of failover and reconnect pauses, so a simulation replays
    /// exactly; `None` (the default) uses the thread RNG.
    pub jitter_seed: Option<u64>,
    /// How long a reply may take from its first byte to its last before the connection
    /// counts as broken (default [`framed::FRAME_TIMEOUT`]).
    pub frame_timeout: Duration,
    /// How long a write of requests may block before the connection counts as broken
    /// (default [`framed::WRITE_TIMEOUT`]).
    pub write_timeout: Duration,
    /// Wire requests out at once (default [`DEFAULT_IN_FLIGHT`]): callers that arrive
    /// while all are out go together as one request (see the module docs). 0 turns
    /// coalescing off: every call is its own request, sent at once.
    pub in_flight: usize,
    /// The brokers' shared secret (their `--auth-token-file`), sent in every Hello;
    /// `None` sends none. Its `Debug` never shows it.
    pub token: Option<Token>,
    /// TLS to brokers that listen with it (`idbroker --listen-tls-cert`); `None`: plain
    /// TCP. Set it whenever a token is: otherwise the token travels in clear text.
    pub tls: Option<BrokerTls>,
    /// Never connect to a broker outside the list (`--broker-closed-list`): a redirect
    /// to a leader not in it is an error instead of followed. Default `false`: follow
    /// it, with the same token and TLS settings (over plain TCP that sends the token to
    /// whatever address a broker names; TLS checks the target's certificate).
    pub closed_list: bool,
}

impl BrokerClientConfig {
    fn timeouts(&self) -> Timeouts {
        Timeouts {
            frame: self.frame_timeout,
            write: self.write_timeout,
        }
    }
}

impl Default for BrokerClientConfig {
    fn default() -> BrokerClientConfig {
        BrokerClientConfig {
            deadline: DEFAULT_DEADLINE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            connections: DEFAULT_CONNECTIONS,
            jitter_seed: None,
            frame_timeout: framed::FRAME_TIMEOUT,
            write_timeout: framed::WRITE_TIMEOUT,
            in_flight: DEFAULT_IN_FLIGHT,
            token: None,
            tls: None,
            closed_list: false,
        }
    }
}

/// What every clone of a client shares. Its methods live with their idea: `request`
/// in `failover`, `conn` in `pool`, `attempt` in `exchange`.
struct Inner {
    /// The configured brokers (`--broker`), in failover order.
    addrs: Vec<String>,
    /// Leaders outside `addrs` (index `addrs.len() + i`); never tried in failover.
    learned: Mutex<Learned>,
    config: BrokerClientConfig,
    slots: Vec<Slot>,
    next_slot: AtomicUsize,
    /// The broker new connections go to first; moves on when one fails.
    preferred: AtomicUsize,
    next_request: AtomicU64,
    /// Pauses between failovers of one request.
    failover_backoff: Backoff,
    /// Pauses between passes over brokers that all refused to connect.
    reconnect_backoff: Backoff,
    /// The `max_count` of the broker connected last: the most one coalesced request asks.
    max_count: AtomicU64,
    /// Wire requests sent by the coalescing path, and callers they carried.
    wire_requests: AtomicU64,
    wire_callers: AtomicU64,
}

/// What coalescing did so far ([`BrokerClient::coalescing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Coalescing {
    /// Wire requests sent for coalesced callers (each for one or more callers).
    pub requests: u64,
    /// Callers answered through them: `callers / requests` is the mean per request.
    pub callers: u64,
}

/// A client of one or more `idbroker`s. Cheap to share: wrap it in an `Arc`, or clone it
/// (clones share connections).
#[derive(Clone)]
pub struct BrokerClient {
    inner: Arc<Inner>,
    /// The coalescing queue (`None` with `in_flight` 0). Its dispatcher ends when the
    /// last clone of the client is dropped.
    queue: Option<Arc<Queue>>,
}

impl std::fmt::Debug for BrokerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerClient")
            .field("addrs", &self.inner.addrs)
            .finish_non_exhaustive()
    }
}

impl BrokerClient {
    /// Connects to the first broker of `addrs` (`host:port`) that answers, trying them
    /// in order. More connections are opened on demand.
    ///
    /// # Errors
    /// [`IdError::Config`] for an empty list or zero connections;
    /// [`IdError::BrokersUnavailable`] if no broker completes a handshake within
    /// `config.deadline` (a broker speaking another protocol version counts as failed).
    pub async fn connect(
        addrs: Vec<String>,
        config: BrokerClientConfig,
    ) -> Result<BrokerClient, IdError> {
        let addrs: Vec<String> = addrs
            .into_iter()
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
        if addrs.is_empty() {
            return Err(IdError::Config("no broker address given".into()));
        }
        if config.connections == 0 {
            return Err(IdError::Config(
                "a broker client needs at least one connection".into(),
            ));
        }
        let slots = (0..config.connections).map(|_| Slot::default()).collect();
        let mut failover_backoff = Backoff::new(FAILOVER_PAUSE_CAP);
        let mut reconnect_backoff = Backoff::new(MAX_RECONNECT_PAUSE);
        if let Some(seed) = config.jitter_seed {
            failover_backoff = failover_backoff.seeded(seed);
            reconnect_backoff = reconnect_backoff.seeded(seed.wrapping_add(1));
        }
        let client = BrokerClient {
            inner: Arc::new(Inner {
                addrs,
                learned: Mutex::new(Learned::default()),
                config,
                slots,
                next_slot: AtomicUsize::new(0),
                preferred: AtomicUsize::new(0),
                next_request: AtomicU64::new(1),
                failover_backoff,
                reconnect_backoff,
                max_count: AtomicU64::new(0),
                wire_requests: AtomicU64::new(0),
                wire_callers: AtomicU64::new(0),
            }),
            queue: None,
        };
        let deadline = Instant::now() + client.inner.config.deadline;
        let mut failures = Vec::new();
        client.inner.conn(0, deadline, &mut failures).await?;
        let in_flight = client.inner.config.in_flight;
        if in_flight == 0 {
            return Ok(client);
        }
        let queue = Queue::start(client.inner.clone(), in_flight);
        Ok(BrokerClient {
            queue: Some(Arc::new(queue)),
            ..client
        })
    }

    /// What coalescing did so far.
    pub fn coalescing(&self) -> Coalescing {
        Coalescing {
            requests: self.inner.wire_requests.load(Relaxed),
            callers: self.inner.wire_callers.load(Relaxed),
        }
    }

    /// The broker addresses, in failover order.
    pub fn addrs(&self) -> &[String] {
        &self.inner.addrs
    }

    /// Leader addresses outside [`BrokerClient::addrs`] that brokers redirected the
    /// client to (empty with [`BrokerClientConfig::closed_list`]).
    pub fn learned(&self) -> Vec<String> {
        self.inner.learned().addrs.clone()
    }

    /// Reserves `n` IDs, giving up at `deadline`.
    ///
    /// # Errors
    /// As [`IdSource::next_ids`]; [`IdError::BrokersUnavailable`] when no broker could
    /// be reached (or none replied) before the deadline.
    pub async fn next_ids_until(&self, n: u64, deadline: Instant) -> Result<IdRange, IdError> {
        self.next_ids_between(n, Instant::now(), deadline).await
    }

    /// [`BrokerClient::next_ids_until`] for a caller that invoked at `invoked` (read
    /// once by `next_ids`: clock reads were a tenth of a busy client's CPU).
    async fn next_ids_between(
        &self,
        n: u64,
        invoked: Instant,
        deadline: Instant,
    ) -> Result<IdRange, IdError> {
        if n == 0 {
            return Err(IdError::BadRequest("count must be at least 1".into()));
        }
        let max_count = self.inner.max_count.load(Relaxed);
        if n > max_count {
            return Err(too_many(n, max_count));
        }
        match &self.queue {
            Some(queue) => coalesced(queue, n, invoked, deadline).await,
            None => self.inner.request(n, deadline).await,
        }
    }
}

fn too_many(n: u64, max_count: u64) -> IdError {
    IdError::BadRequest(format!(
        "count {n} exceeds the broker's limit of {max_count}"
    ))
}

impl IdSource for BrokerClient {
    async fn next_ids(&self, n: u64) -> Result<IdRange, IdError> {
        let invoked = Instant::now();
        self.next_ids_between(n, invoked, invoked + self.inner.config.deadline)
            .await
    }
}

/// The client against a scripted fake broker: a loopback listener in the test that
/// speaks the wire protocol and answers every request as its `Script` says.
#[cfg(test)]
mod tests;

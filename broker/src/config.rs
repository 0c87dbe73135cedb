//! The broker's limits and timeouts: [`BrokerConfig`], whose defaults are the named
//! constants here, each with the reason for its value.

use crate::listen_tls::ListenTls;
use std::time::Duration;

/// Default cap on open connections. Each costs ~100 KiB of buffers at most; clients
/// multiplex many callers over one or two connections, so a thousand is plenty.
pub const MAX_CONNECTIONS: usize = 1024;

/// Default cap on unanswered requests per connection. Above the largest batch a single
/// connection usefully contributes to one round, small enough to bound memory.
pub const MAX_IN_FLIGHT_PER_CONN: usize = 4096;

/// Default cap on IDs per broker request (`--max-count`): a producer reserving a batch
/// asks for thousands, not billions; the cap keeps a round's total far from u64 overflow.
/// (The quorum client's own hard cap per round, `idclient::MAX_COUNT`, is 2^32.)
pub const DEFAULT_MAX_COUNT: u64 = 1 << 20;

/// Default cap on requests per round: bounds the work of fanning one round out, while
/// being well above what a round collects at the target load.
pub const MAX_BATCH: usize = 16 * 1024;

/// Default cap on IDs per round; a larger batch is split over rounds.
pub const MAX_ROUND_IDS: u64 = idclient::MAX_COUNT;

/// Deadline used when a client sends 0 ("broker's default").
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(5);

/// The longest deadline a client may ask for: a round that cannot reach a quorum holds
/// up every later request until its deadline, so one client must not pick hours.
pub const MAX_DEADLINE: Duration = Duration::from_secs(60);

/// No configuration may allow deadlines beyond this: an ID request that may wait a day
/// is a mistake, and `now + deadline` must never overflow.
pub const LONGEST_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// How long a reply write may block before the client is deemed not to read (dropped).
/// The framed connection's default, which the broker client uses too.
pub const WRITE_TIMEOUT: Duration = idproto::framed::WRITE_TIMEOUT;

/// How long the handshake (connect to complete `Hello`) may take: a client that connects
/// and says nothing must not hold a connection slot.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long any frame may take from its first byte (header included) to its last: a
/// half-sent frame must not hold a connection slot forever. A frame is at most 64 KiB,
/// so a live client sends one in far less. The framed connection's default.
pub const FRAME_TIMEOUT: Duration = idproto::framed::FRAME_TIMEOUT;

/// A connection with no request in flight and no partial frame for this long is closed
/// (its client reconnects when it needs to). Long enough that a client calling every
/// few seconds keeps its connections; short enough that forgotten ones free their slot.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// At the connection cap, a new connection evicts the longest-idle one if it has been
/// idle at least this long. Not zero: two clients that together want more than the cap
/// would otherwise evict each other on every call.
pub const EVICT_MIN_IDLE: Duration = Duration::from_secs(1);

/// Wrong tokens a RESP connection may send (`AUTH`, `HELLO .. AUTH`) before it is
/// closed; a binary connection has one try, its Hello. Client libraries try at most
/// two forms of `AUTH`, so three is never reached by a client that has the token.
pub const MAX_AUTH_FAILURES: u32 = 3;

/// Pause after each wrong token before the client hears of it: with the cap on tries,
/// a guesser gets a few guesses a second per connection slot. Well under the broker
/// client's connect timeout (`idclient::broker_client::DEFAULT_CONNECT_TIMEOUT`, 500
/// ms, which covers the Hello), so a client with a wrong token is still told so, and
/// fails at once instead of retrying until its deadline.
pub const AUTH_FAILURE_PAUSE: Duration = Duration::from_millis(200);

/// How often the counters are logged (at info level).
pub const STATS_INTERVAL: Duration = Duration::from_secs(60);

/// Capacity of the queue in front of the batcher. Connections wait (and so stop
/// reading) when it is full: backpressure, not an unbounded queue.
pub const QUEUE_CAPACITY: usize = 64 * 1024;

/// Window confirmations in flight at once by default (`idbroker --pipeline`).
pub const DEFAULT_PIPELINE: usize = 4;

/// The broker's limits and timeouts.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Open client connections at most (`--max-connections`, [`MAX_CONNECTIONS`]).
    pub max_connections: usize,
    /// Unanswered requests per connection before the broker stops reading it
    /// (`--max-in-flight`, sent in `Welcome`; must fit in u32).
    pub max_in_flight_per_conn: usize,
    /// Largest `count` of one request (`--max-count`, sent in `Welcome`).
    pub max_count: u64,
    /// Requests served by one round at most ([`MAX_BATCH`]).
    pub max_batch: usize,
    /// IDs reserved by one round at most, at least `max_count`; a larger batch is split.
    pub max_round_ids: u64,
    /// Batches whose rounds run at once (`--pipeline`): 1 for `--serve rounds`, more
    /// to pipeline window confirmations.
    pub pipeline: usize,
    /// Deadline of a request that sends `deadline_ms` 0 (`--deadline-ms`, 5 s).
    pub default_deadline: Duration,
    /// Longest deadline a client gets; longer ones are capped (`--max-deadline-ms`, 60 s).
    pub max_deadline: Duration,
    /// How long a reply write may block before the client is dropped (`--write-timeout-ms`).
    pub write_timeout: Duration,
    /// Time from connect to a complete `Hello` (`--handshake-timeout-ms`, 5 s).
    pub handshake_timeout: Duration,
    /// Time from a frame's first byte to its last (`--frame-timeout-ms`).
    pub frame_timeout: Duration,
    /// A connection with nothing in flight is closed after this (`--idle-timeout-ms`, 60 s).
    pub idle_timeout: Duration,
    /// Least idle time of a connection evicted at the cap (`--evict-min-idle-ms`, 1 s).
    pub evict_min_idle: Duration,
    /// How often the counters are logged at info level (`--stats-interval-secs`, 60 s).
    pub stats_interval: Duration,
    /// Requests queued in front of the batcher at most; then connections wait.
    pub queue_capacity: usize,
    /// The shared secret clients must present (`--auth-token-file`): in the binary
    /// Hello, and with `AUTH` on RESP. `None`: no authentication.
    pub auth_token: Option<idproto::auth::Token>,
    /// TLS on both listeners (`--listen-tls-cert`, `--listen-tls-key`); `None`: plain
    /// TCP.
    pub tls: Option<ListenTls>,
    /// How a follower reaches the leader when it forwards RESP requests, when brokers
    /// listen with TLS (`--peer-tls-ca`); `None`: plain TCP.
    pub peer_tls: Option<idclient::BrokerTls>,
}

impl Default for BrokerConfig {
    fn default() -> BrokerConfig {
        BrokerConfig {
            max_connections: MAX_CONNECTIONS,
            max_in_flight_per_conn: MAX_IN_FLIGHT_PER_CONN,
            max_count: DEFAULT_MAX_COUNT,
            max_batch: MAX_BATCH,
            max_round_ids: MAX_ROUND_IDS,
            pipeline: 1,
            default_deadline: DEFAULT_DEADLINE,
            max_deadline: MAX_DEADLINE,
            write_timeout: WRITE_TIMEOUT,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            frame_timeout: FRAME_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            evict_min_idle: EVICT_MIN_IDLE,
            stats_interval: STATS_INTERVAL,
            queue_capacity: QUEUE_CAPACITY,
            auth_token: None,
            tls: None,
            peer_tls: None,
        }
    }
}

/// What can stop the broker from starting.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A limit is unusable (zero, above its bound, ...); the text names the field.
    #[error("invalid broker configuration: {0}")]
    Config(String),
    /// A listener could not be bound or accept.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
}

impl BrokerConfig {
    /// Checks that every limit is usable.
    ///
    /// # Errors
    /// [`BrokerError::Config`] naming the first bad field.
    pub fn validate(&self) -> Result<(), BrokerError> {
        let positive = [
            ("max_connections", self.max_connections as u64),
            ("max_in_flight_per_conn", self.max_in_flight_per_conn as u64),
            ("max_count", self.max_count),
            ("max_batch", self.max_batch as u64),
            ("pipeline", self.pipeline as u64),
            ("queue_capacity", self.queue_capacity as u64),
            ("max_deadline", self.max_deadline.as_millis() as u64),
            ("default_deadline", self.default_deadline.as_millis() as u64),
            ("write_timeout", self.write_timeout.as_millis() as u64),
            (
                "handshake_timeout",
                self.handshake_timeout.as_millis() as u64,
            ),
            ("frame_timeout", self.frame_timeout.as_millis() as u64),
            ("idle_timeout", self.idle_timeout.as_millis() as u64),
            ("stats_interval", self.stats_interval.as_millis() as u64),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(BrokerError::Config(format!("{name} must be positive")));
        }
        if self.max_round_ids > idclient::MAX_COUNT {
            return Err(BrokerError::Config(format!(
                "max_round_ids {} exceeds what one quorum round may reserve ({})",
                self.max_round_ids,
                idclient::MAX_COUNT
            )));
        }
        if self.max_deadline > LONGEST_DEADLINE {
            return Err(BrokerError::Config(format!(
                "max_deadline {:?} exceeds {LONGEST_DEADLINE:?}",
                self.max_deadline
            )));
        }
        if self.max_round_ids < self.max_count {
            return Err(BrokerError::Config(format!(
                "max_round_ids {} is below max_count {}",
                self.max_round_ids, self.max_count
            )));
        }
        if self.default_deadline > self.max_deadline {
            return Err(BrokerError::Config(
                "default_deadline exceeds max_deadline".into(),
            ));
        }
        if u32::try_from(self.max_in_flight_per_conn).is_err() {
            return Err(BrokerError::Config(
                "max_in_flight_per_conn must fit in u32".into(),
            ));
        }
        Ok(())
    }
}

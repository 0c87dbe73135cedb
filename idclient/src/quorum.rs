//! The direct quorum client. (Being written: signatures are final, bodies are not.)

use crate::{IdError, IdRange, IdSource};
use std::time::Duration;

/// Which round protocol to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    /// Read a majority, then conditional write of max+1: the algorithm as first published.
    Classic,
    /// Conditional write straight away with a guess; a reject carries the next guess.
    #[default]
    Fast,
}

/// Configuration of a [`QuorumClient`].
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `redis://host:port` URLs, an odd number >= 3 (1 is allowed for tests only).
    pub nodes: Vec<String>,
    /// The register key on every node.
    pub key: String,
    pub protocol: Protocol,
    /// Total time one `next_ids` call may take, all retries included.
    pub deadline: Duration,
    pub connect_timeout: Duration,
    pub reply_timeout: Duration,
    /// Accept nodes that do not fsync every write. Can repeat IDs after a crash.
    pub unsafe_skip_durability_check: bool,
}

impl ClientConfig {
    pub fn new(nodes: Vec<String>) -> ClientConfig {
        ClientConfig {
            nodes,
            key: "current".to_string(),
            protocol: Protocol::Fast,
            deadline: Duration::from_secs(5),
            connect_timeout: Duration::from_millis(500),
            reply_timeout: Duration::from_millis(500),
            unsafe_skip_durability_check: false,
        }
    }
}

/// Counters for benchmarks and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub requests: u64,
    pub rounds: u64,
    pub rejects: u64,
    pub retries: u64,
    pub burned: u64,
    pub errors: u64,
}

/// The direct client: talks to all nodes in parallel.
pub struct QuorumClient {
    _private: (),
}

impl QuorumClient {
    /// Connects to every node and checks its durability configuration.
    ///
    /// # Errors
    /// Bad URLs, an unsafe node, or fewer than a majority reachable.
    pub async fn connect(_config: ClientConfig) -> Result<QuorumClient, IdError> {
        todo!()
    }

    /// Reserves `n` IDs, giving up at `deadline` (the broker passes its caller's deadline).
    ///
    /// # Errors
    /// As [`IdSource::next_ids`].
    pub async fn next_ids_until(&self, _n: u64, _deadline: tokio::time::Instant) -> Result<IdRange, IdError> {
        todo!()
    }

    pub fn counters(&self) -> Counters {
        todo!()
    }
}

impl IdSource for QuorumClient {
    async fn next_ids(&self, _n: u64) -> Result<IdRange, IdError> {
        todo!()
    }
}

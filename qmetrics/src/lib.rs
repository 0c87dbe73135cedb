//! qmetrics: the metrics and health endpoint shared by `idbroker` and `producer`
//! (`--metrics-listen ADDR`), so both serve the same three paths the same way.
//!
//! - `GET /metrics`: the Prometheus text format (version 0.0.4), encoded by the official
//!   `prometheus-client` crate from the [`Endpoints::registry`] the binary fills (usually one
//!   collector that reads its counters at scrape time).
//! - `GET /healthz`: 200 while the process serves.
//! - `GET /readyz`: 200 when the binary's readiness check passes, else 503 with a
//!   one-line reason.
//!
//! `/metrics` also carries the endpoint's own counters of connections it refused (over a
//! peer's limit or the cap) or closed by a deadline (`qlist_metrics_connections_*`).
//!
//! Main items: [`serve`] (the server, bounded by [`Limits`]), [`Endpoints`] (what it
//! serves), [`Histogram`] (a lock-free latency histogram for hot paths), and [`get`], a
//! one-shot HTTP client for tests and tools. The HTTP is hyper's, never hand-written.

mod client;
mod histogram;
mod server;

pub use client::{get, promtool_check, GetError};
pub use histogram::{Histogram, LATENCY_BUCKETS};
pub use prometheus_client;
pub use server::{
    bind, serve, Endpoints, Limits, ReadyCheck, CONNECTION_LIFETIME, HEADER_READ_TIMEOUT,
    MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER, READY_TIMEOUT,
};

/// What can stop the endpoint from starting.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The listening socket could not be bound (address in use, no permission, ...).
    #[error("--metrics-listen {addr}: cannot bind: {source}")]
    Bind {
        /// The `--metrics-listen` address, as given.
        addr: String,
        /// The operating system's error.
        source: std::io::Error,
    },
}

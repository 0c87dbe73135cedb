//! broker: the idbroker ID server.
//!
//! Clients send `NextIds` requests over TCP (protocol: [`idproto::wire`],
//! `docs/wire-protocol.md`); the [batcher](serve::batcher) runs ONE quorum round at a
//! time and serves every request queued when the round starts from the single range it
//! reserves (group commit), split in arrival order. Requests arriving during a round wait
//! for the next one; nothing is ever reserved ahead for later requests, which is what
//! keeps IDs in real-time order across several brokers (DESIGN.md, "The broker").
//!
//! Two sides, and the rule between them: [`serve`] (the batcher, windows, the election;
//! no socket code) and `net` (listeners, connections, both protocols, TLS, forwarding;
//! no ID logic). `net` reaches `serve` only through the batch queue and the source's
//! trait ([`RoundSource`]); `serve` never imports `net`. This root wires them together.
//!
//! Main items:
//! - [`run`]: the server, generic over a [`RoundSource`] (production passes
//!   [`idclient::QuorumClient`]; tests pass fakes), stopped by a future; [`run_with`]
//!   also serves RESP (any Redis client, `QLIST.NEXT`) on a second listener.
//! - [`BrokerConfig`]: every limit, with defaults from the named constants below, the
//!   token, and [`ListenTls`] (TLS on both listeners, `--listen-tls-cert`).
//! - [`Stats`]: counters, readable over the wire (`ClientMsg::Stats`) and logged.
//! - [`WindowSource`] (`--serve window`): batches served from confirmed windows; wrapped
//!   in a [`LeaderSource`] ([`serve::election`]) it serves only while elected, and
//!   otherwise answers each request with a redirect to the leader.
//!
//! Limits: at most [`BrokerConfig::max_connections`] connections (at the cap, a new
//! connection evicts the longest-idle one, those not yet authenticated first, or is
//! refused if none has been idle for [`BrokerConfig::evict_min_idle`]; the accept loop
//! never waits for an eviction), a handshake and token within
//! [`BrokerConfig::handshake_timeout`] of the connect, [`MAX_AUTH_FAILURES`] wrong
//! tokens per connection, at most [`BrokerConfig::max_in_flight_per_conn`]
//! unanswered requests per connection (then the broker stops reading it), frames of at
//! most [`idproto::wire::MAX_FRAME_LEN`] bytes, each completed within
//! [`BrokerConfig::frame_timeout`] of its first byte, an idle timeout, and a write timeout
//! that drops a client that does not read. Memory is therefore bounded by connections x
//! (buffers + in-flight), and no connection holds its slot without doing something.

mod config;
mod listen_tls;
pub mod metrics;
mod net;
pub mod serve;
pub mod stats;

pub use config::*;
pub use idproto::wire::BrokerStats;
pub use listen_tls::ListenTls;
pub use net::resp::MAX_REQUEST_LEN as MAX_RESP_REQUEST_LEN;
pub use serve::election::{ElectionConfig, ElectionQuorum, QuorumElection};
pub use serve::leader_source::LeaderSource;
pub use serve::source::{Admit, Leadership, RoundSource};
#[cfg(feature = "test-hooks")]
pub use serve::window::WindowMutant;
pub use serve::window::{WindowQuorum, WindowSource, WindowStats};
pub use stats::Stats;

/// What `--version` prints: the crate's version, and a warning in a build with the
/// `test-hooks` feature ([`qcli::version!`]).
pub const VERSION: &str = qcli::version!();

use net::accept::Acceptor;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

/// Serves `listener` until `shutdown` completes, then shuts down gracefully: stops
/// accepting, stops reading requests, lets the round in flight finish and answers its
/// requests, refuses every queued request (retryable: it was never started), flushes the
/// replies and returns the final counters.
///
/// # Errors
/// Only an invalid `config`; accept errors (e.g. out of file descriptors) are logged and
/// retried after a pause.
pub async fn run<S: RoundSource>(
    listener: TcpListener,
    source: Arc<S>,
    config: BrokerConfig,
    shutdown: impl Future,
) -> Result<BrokerStats, BrokerError> {
    run_with(listener, None, Arc::default(), source, config, shutdown).await
}

/// [`run`], also serving the RESP protocol (any Redis client, `docs/wire-protocol.md`)
/// on `resp` when given (both listeners share the batcher, the counters and the
/// connection slots), and counting into `stats`, which the caller may read while the
/// broker serves (the metrics endpoint, [`metrics`]). `stats` should be fresh: one
/// broker, one [`Stats`].
///
/// # Errors
/// As [`run`].
pub async fn run_with<S: RoundSource>(
    listener: TcpListener,
    resp: Option<TcpListener>,
    stats: Arc<Stats>,
    source: Arc<S>,
    config: BrokerConfig,
    shutdown: impl Future,
) -> Result<BrokerStats, BrokerError> {
    config.validate()?;
    let config = Arc::new(config);
    let described = source.clone();
    stats.set_describe(move |s| described.describe(s));
    let name = listener
        .local_addr()
        .map_or_else(|_| "idbroker".to_string(), |a| a.to_string());
    let (stop_tx, stopping) = watch::channel(false);
    let (batch_tx, batch_rx) = mpsc::channel(config.queue_capacity);
    let batcher_config = serve::batcher::BatcherConfig {
        max_batch: config.max_batch,
        max_round_ids: config.max_round_ids,
        name: name.clone(),
        pipeline: config.pipeline,
    };
    let admit: net::session::Admission = {
        let source = source.clone();
        Arc::new(move || source.admit())
    };
    let leadership = source.leadership();
    let batcher = tokio::spawn(serve::batcher::run(
        source,
        batch_rx,
        stats.clone(),
        batcher_config,
        stopping.clone(),
    ));
    let logger = tokio::spawn(log_stats(stats.clone(), config.stats_interval));
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    // Only RESP requests are forwarded (binary clients follow redirects themselves).
    let forward = leadership
        .filter(|_| resp.is_some())
        .map(|leadership| Arc::new(net::forward::Forwarder::new(leadership, &config)));
    let mut acceptor = Acceptor::new(config, stats.clone(), batch_tx, stopping, done_tx, admit);
    acceptor.forward = forward;
    let acceptor = Arc::new(acceptor);
    tracing::info!(listen = %name, "broker serving");
    if let Some(addr) = resp.as_ref().and_then(|l| l.local_addr().ok()) {
        tracing::info!(listen = %addr, "broker serving RESP");
    }
    acceptor.serve(&listener, resp.as_ref(), shutdown).await;

    tracing::info!("shutting down: no new connections; finishing the round in flight");
    drop(listener);
    drop(resp);
    let _ = stop_tx.send(true);
    // Drops the batcher's queue sender and our clone of `done_tx`: `done_rx` sees the
    // end once the last connection task has finished.
    drop(acceptor);
    let _ = done_rx.recv().await;
    if let Err(e) = batcher.await {
        tracing::error!("batcher task failed: {e}");
    }
    logger.abort();
    let final_stats = stats.snapshot();
    log_line(&final_stats);
    Ok(final_stats)
}

async fn log_stats(stats: Arc<Stats>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        log_line(&stats.snapshot());
    }
}

fn log_line(s: &BrokerStats) {
    tracing::info!(
        connections = s.connections_open,
        requests = s.requests,
        ok = s.requests_ok,
        failed = s.requests_failed,
        ids = s.ids,
        rounds = s.rounds,
        rounds_failed = s.rounds_failed,
        mean_batch = format_args!("{:.1}", s.mean_batch()),
        max_batch = s.batch_max,
        mean_round_us = format_args!("{:.0}", s.mean_round_us()),
        max_round_us = s.round_us_max,
        "broker stats"
    );
}

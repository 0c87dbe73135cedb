//! Refusals, each told in the client's own protocol before the close, so that it moves
//! on at once instead of guessing: a connection over the cap ([`at_cap`]), and a
//! plain-TCP client on a TLS listener ([`plain_on_tls`]).

use crate::stats::Stats;
use idproto::wire::{self, ServerMsg};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::timeout;

/// How long a refused client may take to receive why. Meanwhile what it sends is
/// drained, so that our close does not turn into a reset (its own `Hello` arriving
/// after our close would make one) that destroys the reason before it is read.
const REFUSE_LINGER: Duration = Duration::from_millis(500);

/// Which protocol a listener speaks: how its clients are told why they are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    Binary,
    Resp,
}

/// What a refusal at the connection cap says and does, from the broker's configuration
/// (taken apart by the acceptor, so that this module needs no configuration type).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cap {
    /// `--max-connections`.
    pub(crate) max_connections: usize,
    /// `--evict-min-idle-ms`.
    pub(crate) evict_min_idle: Duration,
    /// Whether the listener speaks TLS (then the connection is just closed).
    pub(crate) tls: bool,
}

/// Tells a connection over the cap why it is closed, then closes it, in a task of its
/// own: a binary client gets a `Refused` frame, a Redis client Redis's own words. At
/// most `refusing`'s permits of these run at once; beyond that, and on a TLS listener
/// (saying why would take a TLS handshake), the connection is just closed: its client
/// sees the close and tries another broker.
pub(crate) fn at_cap(
    stream: TcpStream,
    peer: SocketAddr,
    protocol: Protocol,
    refusing: &Arc<Semaphore>,
    cap: Cap,
    stats: &Stats,
) {
    stats.connections_total.fetch_add(1, Relaxed);
    stats.connections_dropped.fetch_add(1, Relaxed);
    if cap.tls {
        tracing::info!(%peer, "TLS connection closed: connection cap reached");
        return;
    }
    // The binary client's reason is drained after (it may still send its Hello); a
    // Redis client's is not: Redis does not either.
    let (bytes, drain) = match protocol {
        Protocol::Binary => {
            let reason = format!(
                "connection cap ({}) reached and no connection idle for {:?}: try another broker or later",
                cap.max_connections, cap.evict_min_idle
            );
            tracing::info!(%peer, "connection refused: {reason}");
            (refused_frame(reason), true)
        }
        Protocol::Resp => {
            tracing::info!(%peer, "RESP connection refused: connection cap reached");
            (b"-ERR max number of clients reached\r\n".to_vec(), false)
        }
    };
    let Ok(permit) = refusing.clone().try_acquire_owned() else {
        return; // too many refusals under way: just close
    };
    tokio::spawn(async move {
        let mut stream = stream;
        tell(&mut stream, &bytes, drain).await;
        drop(permit);
    });
}

/// Tells a plain-TCP client, in its protocol, that this listener speaks TLS only.
pub(crate) async fn plain_on_tls(stream: &mut TcpStream, protocol: Protocol) {
    let reason = "this broker listens with TLS only: connect with TLS";
    let bytes = match protocol {
        Protocol::Binary => refused_frame(format!("{reason} (--broker-tls-ca)")),
        Protocol::Resp => format!("-ERR {reason} (redis-cli --tls --cacert FILE)\r\n").into_bytes(),
    };
    tell(stream, &bytes, true).await;
}

/// A `Refused` frame; empty if it cannot be encoded (a reason too long for a frame),
/// and the connection is then just closed.
fn refused_frame(reason: String) -> Vec<u8> {
    let mut out = Vec::new();
    if wire::encode(&ServerMsg::Refused { reason }, &mut out).is_err() {
        out.clear();
    }
    out
}

/// Writes `bytes`, shuts the write side down and, with `drain`, reads until the client
/// closes; all within [`REFUSE_LINGER`].
async fn tell(stream: &mut TcpStream, bytes: &[u8], drain: bool) {
    let say = async {
        stream.write_all(bytes).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 512];
        while drain && stream.read(&mut sink).await? > 0 {}
        Ok::<(), std::io::Error>(())
    };
    let _ = timeout(REFUSE_LINGER, say).await;
}

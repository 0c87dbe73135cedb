//! TLS on the broker's own listeners (`--listen-tls-cert`, `--listen-tls-key`, and
//! optionally `--listen-tls-client-ca`): one layer under both protocols, binary and RESP.
//!
//! The TLS handshake runs in the connection's own task ([`accept`]), never in the accept
//! loop, and within the handshake timeout counted from accept (the same budget as the
//! binary `Hello`, which follows it): a client that opens TCP and sends nothing costs
//! only its slot until then. A client that speaks plain TCP to a TLS listener is told so
//! in its own protocol (a `Refused` frame, a RESP `-ERR`), in clear text, and closed.
//!
//! Connections then read and write through [`ReadHalf`] and [`WriteHalf`] (idproto's,
//! the broker client's too): tokio's owned TCP halves for plain connections, as before,
//! `tokio::io::split` halves of the TLS stream otherwise.

use crate::listen_tls::ListenTls;
use crate::net::refuse::{self, Protocol};
use idproto::tls::{self as socket, ReadHalf, WriteHalf};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout_at, Instant};
use tokio_rustls::{TlsAcceptor, TlsStream};

/// The first two bytes of every TLS connection: a handshake record (22), version 3.x.
/// A binary frame cannot start so unless its length is at least 0x0316 and a RESP
/// request starts with `*`, so a mismatch is a plain-TCP client.
const TLS_RECORD_START: [u8; 2] = [0x16, 0x03];

/// Pause between two looks at a connection whose first byte came alone.
const PEEK_PAUSE: Duration = Duration::from_millis(10);

/// Why a connection ended before its TLS handshake completed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    #[error("no TLS handshake within {0:?}")]
    Timeout(Duration),
    #[error("plain TCP on a TLS listener (told to use TLS)")]
    NotTls,
    #[error("evicted during the TLS handshake: the broker is at its connection cap")]
    Evicted,
    #[error("{0}")]
    Handshake(String),
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
}

/// The TLS handshake of a connection accepted on a TLS listener, to be completed by
/// `deadline` (`limit` after accept, said in the error), and the connection's halves.
/// `Ok(None)`: the client left before sending anything.
///
/// # Errors
/// A handshake that failed, timed out, or never began (plain TCP: told so first, in
/// `protocol`).
pub(crate) async fn accept(
    tls: &ListenTls,
    stream: TcpStream,
    protocol: Protocol,
    deadline: Instant,
    limit: Duration,
) -> Result<Option<(ReadHalf, WriteHalf)>, TlsError> {
    stream.set_nodelay(true)?;
    match timeout_at(deadline, handshake(tls.acceptor(), stream, protocol)).await {
        Ok(s) => Ok(s?.map(socket::split_tls)),
        Err(_) => Err(TlsError::Timeout(limit)),
    }
}

/// Waits for the client's first bytes: a TLS handshake record is accepted, anything
/// else is told to use TLS. `Ok(None)`: closed before sending anything.
async fn handshake(
    acceptor: &TlsAcceptor,
    mut stream: TcpStream,
    protocol: Protocol,
) -> Result<Option<TlsStream<TcpStream>>, TlsError> {
    let mut first = [0u8; 2];
    loop {
        match stream.peek(&mut first).await? {
            0 => return Ok(None),
            1 if first[0] == TLS_RECORD_START[0] => sleep(PEEK_PAUSE).await,
            _ => break,
        }
    }
    if first != TLS_RECORD_START {
        refuse::plain_on_tls(&mut stream, protocol).await;
        return Err(TlsError::NotTls);
    }
    match acceptor.accept(stream).await {
        Ok(s) => Ok(Some(TlsStream::Server(s))),
        Err(e) => Err(TlsError::Handshake(socket::describe(&e))),
    }
}

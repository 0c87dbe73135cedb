//! Hand-driven connections to a broker's binary listener, for the tests that send it what
//! a well-behaved client never would: half frames, bad versions, floods, idle sockets.
//!
//! Each read has a deadline, so a broker that never answers fails the test instead of
//! hanging it.

use idproto::framed::FrameReader;
use idproto::wire::{self, ClientMsg, ServerMsg};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a reply (the Welcome included) may take.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the broker may take to close a connection it should drop: its frame,
/// handshake and write timeouts in the tests stay well below.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A Hello of this wire version, without a token: what a client sends first.
pub fn hello() -> ClientMsg {
    ClientMsg::Hello {
        magic: wire::MAGIC,
        version: wire::VERSION,
        token: None,
    }
}

/// `msgs` encoded one after the other: to be written at once, pipelined.
///
/// # Panics
/// If one cannot be encoded.
pub fn encode(msgs: &[ClientMsg]) -> Vec<u8> {
    let mut buf = Vec::new();
    for msg in msgs {
        wire::encode(msg, &mut buf).expect("encode");
    }
    buf
}

/// Connects to `addr` and says [`hello`].
///
/// # Panics
/// Unless the broker answers Welcome, alone, within [`REPLY_TIMEOUT`].
pub async fn connect(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    send(&mut s, &hello()).await;
    let welcome = recv(&mut s).await;
    assert!(
        matches!(welcome, Some(ServerMsg::Welcome { .. })),
        "{welcome:?}"
    );
    s
}

/// Writes one message.
///
/// # Panics
/// If it cannot be encoded or written.
pub async fn send(s: &mut TcpStream, msg: &ClientMsg) {
    s.write_all(&encode(std::slice::from_ref(msg)))
        .await
        .expect("write");
}

/// The next reply (`None` if the connection closed or the bytes were no message). Reads
/// through a reader of its own, which must not have buffered more than that one frame:
/// the tests expect one reply at a time (and nothing unasked after the Welcome).
///
/// # Panics
/// If no reply comes within [`REPLY_TIMEOUT`], or more than one arrived at once.
pub async fn recv(s: &mut TcpStream) -> Option<ServerMsg> {
    let mut rd = FrameReader::new(&mut *s, REPLY_TIMEOUT);
    let msg = tokio::time::timeout(REPLY_TIMEOUT, rd.read_msg())
        .await
        .expect("reply in time")
        .ok()
        .flatten();
    assert_eq!(rd.buffered(), 0, "more than one reply arrived at once");
    msg
}

/// Reads until the broker closes the connection; what it sent, lossily as text (a
/// Refused reason names why).
///
/// # Panics
/// If the broker has not closed it within [`CLOSE_TIMEOUT`].
pub async fn closed_by_broker(s: &mut TcpStream) -> String {
    let mut all = Vec::new();
    tokio::time::timeout(CLOSE_TIMEOUT, s.read_to_end(&mut all))
        .await
        .expect("broker closes the connection")
        .ok();
    String::from_utf8_lossy(&all).into_owned()
}

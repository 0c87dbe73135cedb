//! The idbroker wire protocol: message types and framing, shared by the broker
//! (`broker` crate) and `idclient::broker_client::BrokerClient`.
//!
//! Every message is one frame: a `u32` little-endian payload length, then the payload,
//! a [`ClientMsg`] or [`ServerMsg`] encoded with bincode's fixed-int little-endian
//! encoding (bincode 1.3's `bincode::serialize`). The client speaks first with
//! [`ClientMsg::Hello`]; the broker answers [`ServerMsg::Welcome`] or
//! [`ServerMsg::Refused`]. After that requests carry a client-chosen id, replies carry
//! the id of their request, and replies may come in any order (pipelining).
//! `docs/wire-protocol.md` gives the byte layout of every message with hex examples.

use crate::{IdError, IdRange};
use bincode::Options;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The four bytes that open every [`ClientMsg::Hello`]: they let the broker drop a
/// connection that speaks something else (HTTP, RESP, random bytes) after one frame.
pub const MAGIC: [u8; 4] = *b"QIDB";

/// The protocol version this code speaks. The broker refuses any other.
pub const VERSION: u32 = 1;

/// Largest payload either side sends or accepts. Requests are ~30 bytes and the largest
/// reply (an error listing every failed node, or stats) is a few KiB; 64 KiB leaves room
/// while bounding the memory a hostile peer can make us allocate per connection.
pub const MAX_FRAME_LEN: u32 = 64 * 1024;

/// Length of the frame header (the `u32` payload length).
pub const HEADER_LEN: usize = 4;

/// A message from a client to the broker.
///
/// Bincode writes the variant index as a `u32` before the fields (0 = `Hello`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientMsg {
    /// First frame of every connection, exactly once.
    Hello { magic: [u8; 4], version: u32 },
    /// Reserve `count` consecutive IDs. `deadline_ms` is how long the caller is still
    /// willing to wait (0 = the broker's default); the broker answers no later than that.
    NextIds {
        id: u64,
        count: u64,
        deadline_ms: u64,
    },
    /// Ask for the broker's counters.
    Stats { id: u64 },
}

/// A message from the broker to a client.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ServerMsg {
    /// Handshake accepted. `max_count` is the largest `count` a request may ask for;
    /// `max_in_flight` how many requests a connection may have unanswered before the
    /// broker stops reading from it.
    Welcome {
        version: u32,
        max_count: u64,
        max_in_flight: u32,
    },
    /// Handshake refused or protocol violated; the broker closes the connection after it.
    Refused { reason: String },
    /// The IDs `lo..=hi` for request `id`.
    Ids { id: u64, lo: u64, hi: u64 },
    /// Request `id` failed. No ID is handed out for it (its IDs, if any were reserved,
    /// are burned). [`IdError::BrokersUnavailable`] here means the request was never
    /// started (broker shutting down): it is safe to send it to another broker.
    Failed { id: u64, error: IdError },
    /// The counters, for request `id`.
    Stats { id: u64, stats: BrokerStats },
}

impl ServerMsg {
    /// The request id this message answers, if it answers one.
    pub fn request_id(&self) -> Option<u64> {
        match self {
            ServerMsg::Ids { id, .. }
            | ServerMsg::Failed { id, .. }
            | ServerMsg::Stats { id, .. } => Some(*id),
            ServerMsg::Welcome { .. } | ServerMsg::Refused { .. } => None,
        }
    }

    /// The reply for `id` holding `range`.
    pub fn ids(id: u64, range: IdRange) -> ServerMsg {
        ServerMsg::Ids {
            id,
            lo: range.lo,
            hi: range.hi,
        }
    }
}

/// Number of buckets of [`BrokerStats::batch_histogram`]: bucket `i` counts rounds whose
/// batch held `2^i ..= 2^(i+1)-1` requests; the last bucket takes everything larger.
pub const BATCH_BUCKETS: usize = 16;

/// The broker's counters since it started, as sent over the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerStats {
    pub uptime_ms: u64,
    pub connections_open: u64,
    pub connections_total: u64,
    /// Connections closed by the broker: a protocol violation, a handshake, frame, idle
    /// or write timeout, eviction at the connection cap, or refusal at the cap.
    pub connections_dropped: u64,
    /// `NextIds` requests received.
    pub requests: u64,
    /// Requests answered with IDs.
    pub requests_ok: u64,
    /// Requests answered with an error (bad request, deadline, no quorum, shutdown).
    pub requests_failed: u64,
    /// IDs handed out (holes excluded).
    pub ids: u64,
    /// Quorum rounds run, successful or not.
    pub rounds: u64,
    pub rounds_failed: u64,
    /// Largest number of requests served by one round.
    pub batch_max: u64,
    /// Requests served by rounds (sum of batch sizes); `/ rounds` is the mean batch size.
    pub batch_total: u64,
    pub batch_histogram: Vec<u64>,
    /// Sum and maximum of round durations, microseconds.
    pub round_us_total: u64,
    pub round_us_max: u64,
}

impl BrokerStats {
    /// Mean number of requests per round.
    pub fn mean_batch(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.batch_total as f64 / self.rounds as f64
        }
    }

    /// Mean round duration in microseconds.
    pub fn mean_round_us(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.round_us_total as f64 / self.rounds as f64
        }
    }
}

/// What can go wrong reading or writing frames.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame length {len} exceeds the maximum of {MAX_FRAME_LEN} bytes")]
    TooLarge { len: u64 },
    #[error("connection closed in the middle of a frame")]
    Truncated,
    #[error("undecodable payload: {0}")]
    Decode(String),
    #[error("unencodable message: {0}")]
    Encode(String),
}

/// The bincode options of the protocol: fixed-width little-endian integers (so every
/// message has the plain layout documented in docs/wire-protocol.md), a size limit (so
/// a length field inside a payload cannot make us allocate more than a frame), and no
/// trailing bytes (a frame is exactly one message).
fn options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(u64::from(MAX_FRAME_LEN))
        .reject_trailing_bytes()
}

/// Appends one frame holding `msg` to `out`.
///
/// # Errors
/// [`WireError::TooLarge`] if the payload would exceed [`MAX_FRAME_LEN`] (`out` is then
/// left as it was), [`WireError::Encode`] if serde fails.
pub fn encode<T: Serialize>(msg: &T, out: &mut Vec<u8>) -> Result<(), WireError> {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_LEN]);
    if let Err(e) = options().serialize_into(&mut *out, msg) {
        out.truncate(start);
        return Err(match *e {
            bincode::ErrorKind::SizeLimit => WireError::TooLarge {
                len: u64::from(MAX_FRAME_LEN) + 1,
            },
            other => WireError::Encode(other.to_string()),
        });
    }
    let len = out.len() - start - HEADER_LEN;
    // Cannot truncate: the size limit above keeps len <= MAX_FRAME_LEN.
    let len = len as u32;
    out[start..start + HEADER_LEN].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Decodes one payload (a frame without its length header).
///
/// # Errors
/// [`WireError::Decode`] if the bytes are not exactly one `T`.
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> Result<T, WireError> {
    options()
        .deserialize(payload)
        .map_err(|e| WireError::Decode(e.to_string()))
}

/// Initial read buffer of a [`FrameReader`]: a few hundred pipelined requests per read
/// system call. It grows only to hold one larger frame, never beyond
/// [`HEADER_LEN`] + [`MAX_FRAME_LEN`].
pub const READ_BUF: usize = 16 * 1024;

/// Reads frames from a byte stream through its own buffer, so that reading is cancel
/// safe: every `.await` is one `read` into the buffer, and a frame is taken out only once
/// it is whole. Dropping a [`FrameReader::read_msg`] or [`FrameReader::fill`] future (a
/// lost `select!` branch, a timeout) loses nothing; the next call goes on where it
/// stopped. A partial frame is normal, not an error: [`FrameReader::partial`] says one
/// is buffered, so the caller can put a deadline on it (the broker does).
///
/// The length is checked as soon as the 4 header bytes are in, before any payload is
/// read, and the buffer never grows beyond one maximal frame.
#[derive(Debug)]
pub struct FrameReader<R> {
    rd: R,
    /// Buffered bytes are `buf[start..end]`; `buf.len()` is the current capacity.
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader over `rd` with a [`READ_BUF`] buffer.
    pub fn new(rd: R) -> FrameReader<R> {
        FrameReader {
            rd,
            buf: vec![0; READ_BUF],
            start: 0,
            end: 0,
        }
    }

    /// Bytes buffered that are not part of a message already returned.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// True if part of a frame (header included) is buffered, waiting for the rest.
    /// (Whole buffered frames are taken first by [`FrameReader::next_msg`].)
    pub fn partial(&self) -> bool {
        self.buffered() > 0
    }

    /// The payload length of the frame at the head of the buffer, once its header is in.
    fn head_len(&self) -> Result<Option<usize>, WireError> {
        if self.buffered() < HEADER_LEN {
            return Ok(None);
        }
        let mut header = [0u8; HEADER_LEN];
        header.copy_from_slice(&self.buf[self.start..self.start + HEADER_LEN]);
        let len = u32::from_le_bytes(header);
        if len > MAX_FRAME_LEN {
            return Err(WireError::TooLarge {
                len: u64::from(len),
            });
        }
        Ok(Some(len as usize))
    }

    /// Decodes the next message if a whole frame is buffered; never reads.
    ///
    /// # Errors
    /// [`WireError::TooLarge`] for a header above [`MAX_FRAME_LEN`] (as soon as the
    /// header is buffered), [`WireError::Decode`] for a bad payload (the frame is
    /// consumed either way).
    pub fn next_msg<T: DeserializeOwned>(&mut self) -> Result<Option<T>, WireError> {
        let Some(len) = self.head_len()? else {
            return Ok(None);
        };
        if self.buffered() < HEADER_LEN + len {
            return Ok(None);
        }
        let payload = self.start + HEADER_LEN..self.start + HEADER_LEN + len;
        self.start = payload.end;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        decode(&self.buf[payload]).map(Some)
    }

    /// One `read` into the buffer: the number of bytes read, 0 at end of stream.
    /// Cancel safe. Reads at most up to the end of the buffer, which is first made large
    /// enough for the frame being read (so a call always makes room to progress).
    ///
    /// # Errors
    /// I/O errors; [`WireError::TooLarge`] for a header above [`MAX_FRAME_LEN`].
    pub async fn fill(&mut self) -> Result<usize, WireError> {
        let need = HEADER_LEN + self.head_len()?.unwrap_or(0);
        if self.buf.len() - self.start < need {
            // The frame does not fit where it starts: move it to the front, grow if needed.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.buf.len() < need {
                self.buf.resize(need, 0);
            }
        } else if self.end == self.buf.len() {
            // Whole frames were taken and the partial one at the end still fits: make
            // room after it by moving it to the front.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            // Only when whole frames were left unread (callers take them with next_msg
            // first): room for one more read rather than a false end of stream.
            debug_assert!(false, "fill called with whole frames buffered");
            self.buf.resize(self.end + READ_BUF, 0);
        }
        let n = self.rd.read(&mut self.buf[self.end..]).await?;
        self.end += n;
        Ok(n)
    }

    /// Reads until one whole message is buffered and decodes it. `Ok(None)` is a clean
    /// end of stream (at a frame boundary). Cancel safe (see [`FrameReader`]).
    ///
    /// # Errors
    /// I/O errors, [`WireError::Truncated`] on end of stream inside a frame, and as
    /// [`FrameReader::next_msg`].
    pub async fn read_msg<T: DeserializeOwned>(&mut self) -> Result<Option<T>, WireError> {
        loop {
            if let Some(msg) = self.next_msg()? {
                return Ok(Some(msg));
            }
            if self.fill().await? == 0 {
                return if self.partial() {
                    Err(WireError::Truncated)
                } else {
                    Ok(None)
                };
            }
        }
    }
}

/// Reads one whole frame and decodes it, unbuffered (reads exactly the frame's bytes,
/// nothing after it). `Ok(None)` is a clean end of stream. NOT cancel safe (a frame
/// half-read when the future is dropped is lost): for one-shot exchanges and tests;
/// anything that races reads in `select!` uses a [`FrameReader`].
///
/// # Errors
/// I/O errors, [`WireError::Truncated`] on end of stream inside a frame,
/// [`WireError::TooLarge`] for a length above [`MAX_FRAME_LEN`], [`WireError::Decode`].
pub async fn read_msg<T: DeserializeOwned, R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Option<T>, WireError> {
    let mut header = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        let n = r.read(&mut header[filled..]).await?;
        if n == 0 {
            return if filled == 0 {
                Ok(None)
            } else {
                Err(WireError::Truncated)
            };
        }
        filled += n;
    }
    let len = u32::from_le_bytes(header);
    if len > MAX_FRAME_LEN {
        return Err(WireError::TooLarge {
            len: u64::from(len),
        });
    }
    buf.clear();
    buf.resize(len as usize, 0);
    match r.read_exact(buf).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(WireError::Truncated)
        }
        Err(e) => return Err(e.into()),
    }
    decode(buf).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NodeFailure;
    use tokio::io::AsyncWriteExt;

    fn frame<T: Serialize>(msg: &T) -> Vec<u8> {
        let mut out = Vec::new();
        encode(msg, &mut out).expect("encode");
        out
    }

    // The exact bytes below are the examples in docs/wire-protocol.md: if this test has to
    // change, the document (and every client in another language) has to change too.
    #[test]
    fn hello_bytes() {
        let bytes = frame(&ClientMsg::Hello {
            magic: MAGIC,
            version: VERSION,
        });
        assert_eq!(
            bytes,
            [12, 0, 0, 0, 0, 0, 0, 0, b'Q', b'I', b'D', b'B', 1, 0, 0, 0]
        );
    }

    #[test]
    fn next_ids_bytes() {
        let bytes = frame(&ClientMsg::NextIds {
            id: 7,
            count: 3,
            deadline_ms: 5000,
        });
        let mut want = vec![28, 0, 0, 0, 1, 0, 0, 0];
        want.extend_from_slice(&7u64.to_le_bytes());
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(&5000u64.to_le_bytes());
        assert_eq!(bytes, want);
    }

    #[test]
    fn stats_request_bytes() {
        let bytes = frame(&ClientMsg::Stats { id: 1 });
        assert_eq!(bytes, [12, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn welcome_and_ids_bytes() {
        let bytes = frame(&ServerMsg::Welcome {
            version: 1,
            max_count: 1_048_576,
            max_in_flight: 1024,
        });
        // docs/wire-protocol.md shows these bytes: 14000000 00000000 01000000
        // 0000100000000000 00040000.
        let mut want = vec![20, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
        want.extend_from_slice(&1_048_576u64.to_le_bytes());
        want.extend_from_slice(&1024u32.to_le_bytes());
        assert_eq!(bytes, want);

        let bytes = frame(&ServerMsg::ids(7, IdRange { lo: 100, hi: 102 }));
        let mut want = vec![28, 0, 0, 0, 2, 0, 0, 0];
        for v in [7u64, 100, 102] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(bytes, want);
    }

    #[test]
    fn refused_and_failed_bytes() {
        let bytes = frame(&ServerMsg::Refused {
            reason: "no".into(),
        });
        assert_eq!(
            bytes,
            [14, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, b'n', b'o']
        );

        let bytes = frame(&ServerMsg::Failed {
            id: 7,
            error: IdError::BadRequest("x".into()),
        });
        let mut want = vec![25, 0, 0, 0, 3, 0, 0, 0];
        want.extend_from_slice(&7u64.to_le_bytes());
        want.extend_from_slice(&[6, 0, 0, 0]); // IdError::BadRequest is variant 6
        want.extend_from_slice(&1u64.to_le_bytes());
        want.push(b'x');
        assert_eq!(bytes, want);
    }

    #[test]
    fn every_message_round_trips() {
        let failure = NodeFailure {
            addr: "redis://127.0.0.1:1".into(),
            reason: "refused".into(),
        };
        let server = [
            ServerMsg::Welcome {
                version: 1,
                max_count: 9,
                max_in_flight: 2,
            },
            ServerMsg::Refused {
                reason: "bad".into(),
            },
            ServerMsg::ids(1, IdRange { lo: 5, hi: 9 }),
            ServerMsg::Failed {
                id: 2,
                error: IdError::NoQuorum {
                    needed: 3,
                    reachable: 1,
                    total: 5,
                    failures: vec![failure.clone()],
                },
            },
            ServerMsg::Failed {
                id: 3,
                error: IdError::BrokersUnavailable {
                    failures: vec![failure],
                },
            },
            ServerMsg::Stats {
                id: 4,
                stats: BrokerStats {
                    rounds: 3,
                    batch_histogram: vec![1, 2],
                    ..Default::default()
                },
            },
        ];
        for msg in server {
            let bytes = frame(&msg);
            let back: ServerMsg = decode(&bytes[HEADER_LEN..]).expect("decode");
            assert_eq!(format!("{back:?}"), format!("{msg:?}"));
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [
            &[][..],
            &[9, 0, 0, 0],
            &[1, 0, 0, 0, 1],
            &[3, 0, 0, 0],
            &[0, 0, 0, 0, 1, 2, 3],
        ] {
            assert!(decode::<ClientMsg>(bytes).is_err(), "{bytes:?}");
        }
        // A string claiming an absurd length must fail without allocating it.
        let mut bytes = vec![1, 0, 0, 0];
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode::<ServerMsg>(&bytes).is_err());
        // Trailing bytes after a whole message.
        let mut bytes = frame(&ClientMsg::Stats { id: 1 });
        bytes.push(0);
        assert!(decode::<ClientMsg>(&bytes[HEADER_LEN..]).is_err());
    }

    #[test]
    fn oversized_message_is_refused_and_leaves_buffer_intact() {
        let mut out = vec![1, 2, 3];
        let msg = ServerMsg::Refused {
            reason: "x".repeat(MAX_FRAME_LEN as usize),
        };
        assert!(matches!(
            encode(&msg, &mut out),
            Err(WireError::TooLarge { .. })
        ));
        assert_eq!(out, [1, 2, 3]);
    }

    #[tokio::test]
    async fn frames_read_back_and_truncation_is_detected() {
        let mut bytes = frame(&ClientMsg::Stats { id: 1 });
        bytes.extend(frame(&ClientMsg::NextIds {
            id: 2,
            count: 1,
            deadline_ms: 0,
        }));
        let mut r = &bytes[..];
        let mut buf = Vec::new();
        assert_eq!(
            read_msg::<ClientMsg, _>(&mut r, &mut buf).await.expect("1"),
            Some(ClientMsg::Stats { id: 1 })
        );
        assert!(read_msg::<ClientMsg, _>(&mut r, &mut buf)
            .await
            .expect("2")
            .is_some());
        assert_eq!(
            read_msg::<ClientMsg, _>(&mut r, &mut buf)
                .await
                .expect("eof"),
            None
        );

        let mut half = &bytes[..2];
        assert!(matches!(
            read_msg::<ClientMsg, _>(&mut half, &mut buf).await,
            Err(WireError::Truncated)
        ));
        let mut half = &bytes[..10];
        assert!(matches!(
            read_msg::<ClientMsg, _>(&mut half, &mut buf).await,
            Err(WireError::Truncated)
        ));
        let big = (MAX_FRAME_LEN + 1).to_le_bytes();
        let mut r = &big[..];
        assert!(matches!(
            read_msg::<ClientMsg, _>(&mut r, &mut buf).await,
            Err(WireError::TooLarge { .. })
        ));
    }

    fn next_ids(id: u64) -> ClientMsg {
        ClientMsg::NextIds {
            id,
            count: 1,
            deadline_ms: 0,
        }
    }

    /// A `read_msg` dropped mid-frame (the lost branch of a `select!`) loses nothing: the
    /// header and payload bytes it had read are kept and the next call returns the frame.
    #[tokio::test]
    async fn frame_reader_is_cancel_safe() {
        let (mut tx, rx) = tokio::io::duplex(1024);
        let mut reader = FrameReader::new(rx);
        let bytes = frame(&next_ids(9));
        // Every split point: 1 byte of the header, the whole header, part of the payload.
        for cut in [1, HEADER_LEN, HEADER_LEN + 3] {
            tx.write_all(&bytes[..cut]).await.expect("write");
            let cancelled = tokio::time::timeout(
                std::time::Duration::from_millis(20),
                reader.read_msg::<ClientMsg>(),
            )
            .await;
            assert!(cancelled.is_err(), "a partial frame is not a message");
            assert!(reader.partial());
            tx.write_all(&bytes[cut..]).await.expect("write");
            assert_eq!(
                reader.read_msg::<ClientMsg>().await.expect("read"),
                Some(next_ids(9)),
                "cut at {cut}"
            );
            assert!(!reader.partial());
        }
        drop(tx);
        assert_eq!(reader.read_msg::<ClientMsg>().await.expect("eof"), None);
    }

    #[tokio::test]
    async fn frame_reader_reads_pipelined_frames_and_big_ones() {
        let mut bytes = Vec::new();
        // Enough small frames to wrap the buffer several times, then a maximal one.
        let n = 3 * READ_BUF as u64 / 28;
        for id in 0..n {
            encode(&next_ids(id), &mut bytes).expect("encode");
        }
        let big = ServerMsg::Refused {
            reason: "x".repeat(MAX_FRAME_LEN as usize - 12),
        };
        encode(&big, &mut bytes).expect("encode the largest frame");
        encode(&ServerMsg::ids(1, IdRange { lo: 1, hi: 1 }), &mut bytes).expect("encode");
        // Odd-sized chunks so frames straddle reads.
        let mut r = FrameReader::new(ChunkedReader::new(&bytes, 1000));
        for id in 0..n {
            let msg: ClientMsg = r.read_msg().await.expect("read").expect("a frame");
            assert_eq!(msg, next_ids(id));
        }
        match r.read_msg::<ServerMsg>().await {
            Ok(Some(ServerMsg::Refused { reason })) => assert_eq!(reason.len(), 65524),
            other => panic!("expected the big frame, got {other:?}"),
        }
        assert!(r.buf.len() <= HEADER_LEN + MAX_FRAME_LEN as usize);
        assert!(matches!(
            r.read_msg::<ServerMsg>().await,
            Ok(Some(ServerMsg::Ids { id: 1, .. }))
        ));
        assert!(matches!(r.read_msg::<ServerMsg>().await, Ok(None)));
    }

    #[tokio::test]
    async fn frame_reader_rejects_a_long_header_at_once_and_truncation() {
        // Only the header: the reader must not wait for a payload it will never accept.
        let big = (MAX_FRAME_LEN + 1).to_le_bytes();
        let mut r = FrameReader::new(&big[..]);
        assert!(matches!(
            r.read_msg::<ClientMsg>().await,
            Err(WireError::TooLarge { .. })
        ));
        let bytes = frame(&next_ids(1));
        for cut in [1, HEADER_LEN, bytes.len() - 1] {
            let mut r = FrameReader::new(&bytes[..cut]);
            assert!(matches!(
                r.read_msg::<ClientMsg>().await,
                Err(WireError::Truncated)
            ));
        }
    }

    /// Hands out at most `chunk` bytes per read.
    struct ChunkedReader<'a> {
        bytes: &'a [u8],
        chunk: usize,
    }

    impl<'a> ChunkedReader<'a> {
        fn new(bytes: &'a [u8], chunk: usize) -> ChunkedReader<'a> {
            ChunkedReader { bytes, chunk }
        }
    }

    impl AsyncRead for ChunkedReader<'_> {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = self.chunk.min(buf.remaining()).min(self.bytes.len());
            buf.put_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            std::task::Poll::Ready(Ok(()))
        }
    }
}

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
//!
//! This module says what the bytes are ([`encode`], [`decode`]); reading and writing
//! them on a connection is [`crate::framed`]'s.

use crate::{IdError, IdRange};
use bincode::Options;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The four bytes that open every [`ClientMsg::Hello`]: they let the broker drop a
/// connection that speaks something else (HTTP, RESP, random bytes) after one frame.
pub const MAGIC: [u8; 4] = *b"QIDB";

/// The protocol version this code speaks. The broker refuses any other. Version 2 added
/// [`ServerMsg::Redirect`] and the leader and window fields of [`BrokerStats`]; version 3
/// the `token` of [`ClientMsg::Hello`]; version 4 [`BrokerStats::forwarded`]; version 5
/// the `accepted` count of [`IdError::NoQuorum`].
pub const VERSION: u32 = 5;

/// The [`ServerMsg::Refused`] reason for a Hello whose token is missing or wrong (the
/// broker has `--auth-token-file`). It never says what was sent.
pub const AUTH_FAILED: &str = "authentication failed";

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
    /// First frame of every connection, exactly once. `token` is the broker's shared
    /// secret (`idbroker --auth-token-file`), required when the broker has one and
    /// ignored otherwise.
    Hello {
        /// Always [`MAGIC`] (`"QIDB"`); anything else is refused.
        magic: [u8; 4],
        /// The protocol version the client speaks; the broker refuses any but [`VERSION`].
        version: u32,
        /// The broker's shared secret, trimmed file content; `None` if the client has none.
        token: Option<String>,
    },
    /// Reserve `count` consecutive IDs. `deadline_ms` is how long the caller is still
    /// willing to wait (0 = the broker's default); the broker answers no later than that.
    NextIds {
        /// Client-chosen request id, echoed in the reply; not reused while unanswered.
        id: u64,
        /// How many consecutive IDs to reserve: 1 ..= the `max_count` of `Welcome`.
        count: u64,
        /// Milliseconds the caller still waits; 0 = the broker's default (5 s), capped at 60 s.
        deadline_ms: u64,
    },
    /// Ask for the broker's counters.
    Stats {
        /// Client-chosen request id, echoed in the reply.
        id: u64,
    },
}

/// A message from the broker to a client.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ServerMsg {
    /// Handshake accepted. `max_count` is the largest `count` a request may ask for;
    /// `max_in_flight` how many requests a connection may have unanswered before the
    /// broker stops reading from it.
    Welcome {
        /// The protocol version the broker speaks (always [`VERSION`]).
        version: u32,
        /// Largest `count` one `NextIds` may ask for.
        max_count: u64,
        /// Unanswered requests per connection before the broker stops reading (default 4096).
        max_in_flight: u32,
    },
    /// Handshake refused or protocol violated; the broker closes the connection after it.
    Refused {
        /// Why, for a person to read (e.g. [`AUTH_FAILED`], an idle timeout).
        reason: String,
    },
    /// The IDs `lo..=hi` for request `id`.
    Ids {
        /// The id of the `NextIds` request this answers.
        id: u64,
        /// First ID of the range, inclusive.
        lo: u64,
        /// Last ID of the range, inclusive; `hi - lo + 1` is the `count` asked for.
        hi: u64,
    },
    /// Request `id` failed. No ID is handed out for it (its IDs, if any were reserved,
    /// are burned). [`IdError::BrokersUnavailable`] here means the request was never
    /// started (broker shutting down): it is safe to send it to another broker.
    Failed {
        /// The id of the request this answers.
        id: u64,
        /// Why it failed; final for the request unless `BrokersUnavailable`.
        error: IdError,
    },
    /// The counters, for request `id` (boxed: rare, and keeps every other message small).
    Stats {
        /// The id of the `Stats` request this answers.
        id: u64,
        /// The broker's counters since it started.
        stats: Box<BrokerStats>,
    },
    /// This broker is not the leader and did not start request `id` (no ID was reserved
    /// for it): send it to `leader` (`host:port`), or, when `None` (no leader known
    /// now, an election is under way), to any broker again after a short wait.
    Redirect {
        /// The id of the request this answers; it was not started.
        id: u64,
        /// The leader's advertised address (`host:port`); `None` during an election.
        leader: Option<String>,
    },
}

impl ServerMsg {
    /// The request id this message answers, if it answers one.
    pub fn request_id(&self) -> Option<u64> {
        match self {
            ServerMsg::Ids { id, .. }
            | ServerMsg::Failed { id, .. }
            | ServerMsg::Stats { id, .. }
            | ServerMsg::Redirect { id, .. } => Some(*id),
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
    /// Milliseconds since the broker started.
    pub uptime_ms: u64,
    /// Client connections open now (binary protocol).
    pub connections_open: u64,
    /// Client connections accepted since start, closed ones included.
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
    /// Quorum rounds that failed (no quorum, contention until the deadline, ...).
    pub rounds_failed: u64,
    /// Largest number of requests served by one round.
    pub batch_max: u64,
    /// Requests served by rounds (sum of batch sizes); `/ rounds` is the mean batch size.
    pub batch_total: u64,
    /// Rounds by batch size, [`BATCH_BUCKETS`] power-of-two buckets (see that constant).
    pub batch_histogram: Vec<u64>,
    /// Sum and maximum of round durations, microseconds.
    pub round_us_total: u64,
    /// Longest round, microseconds.
    pub round_us_max: u64,
    /// `"leader"`, `"follower"`, `"candidate"`, or `"rounds"` for a `--serve rounds`
    /// broker, which takes no part in elections.
    pub role: String,
    /// The highest term this broker has seen (0: none yet).
    pub term: u64,
    /// The leader this broker knows of (`host:port`), if any.
    pub leader: Option<String>,
    /// Requests answered with a redirect to the leader.
    pub redirects: u64,
    /// RESP requests a follower forwarded to the leader and answered with its reply
    /// (version 4).
    pub forwarded: u64,
    /// Window serving (`--serve window`): the current target window size, majority reads
    /// that confirmed a batch and that found another writer, contiguous reservations won
    /// and lost, and IDs of dead windows never served (holes).
    pub window_size: u64,
    /// Majority reads that confirmed the window still held, so a batch was served.
    pub confirmations: u64,
    /// Majority reads that found another writer had moved the register.
    pub confirmations_failed: u64,
    /// Contiguous window reservations won.
    pub reservations: u64,
    /// Contiguous window reservations lost to another writer.
    pub reservations_lost: u64,
    /// IDs of dead windows that were never served.
    pub holes: u64,
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
///
/// No variant has a `source()`: each message already says everything (so an error chain
/// printed with `{:#}` shows the cause once).
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Reading or writing the socket failed.
    #[error("i/o: {0}")]
    Io(std::io::Error),
    /// A frame header announced a payload above [`MAX_FRAME_LEN`].
    #[error("frame length {len} exceeds the maximum of {MAX_FRAME_LEN} bytes")]
    TooLarge {
        /// The payload length in bytes (header's, or `MAX_FRAME_LEN + 1` when encoding).
        len: u64,
    },
    /// The peer closed the connection after part of a frame.
    #[error("connection closed in the middle of a frame")]
    Truncated,
    /// The payload is no valid message; the text is bincode's.
    #[error("undecodable payload: {0}")]
    Decode(String),
    /// Serde could not encode the message; the text is bincode's.
    #[error("unencodable message: {0}")]
    Encode(String),
    /// A started frame was not complete within this time of its first byte.
    #[error("frame not completed within {0:?} of its first byte")]
    FrameTimeout(Duration),
    /// The peer did not take our bytes within this time (it does not read).
    #[error("peer did not take our bytes within {0:?}")]
    WriteTimeout(Duration),
}

impl From<std::io::Error> for WireError {
    fn from(e: std::io::Error) -> WireError {
        WireError::Io(e)
    }
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

/// The Hello of protocol versions 1 and 2, which had no token: decoded only so that an
/// old client hears "version N not supported" rather than "undecodable payload".
#[derive(Deserialize)]
enum OldClientMsg {
    Hello { magic: [u8; 4], version: u32 },
}

/// Decodes one [`ClientMsg`] payload, accepting the token-less Hello of versions 1 and 2
/// as a Hello with no token (its version then tells the broker to refuse it).
///
/// # Errors
/// [`WireError::Decode`] if the bytes are neither.
pub fn decode_client(payload: &[u8]) -> Result<ClientMsg, WireError> {
    decode::<ClientMsg>(payload).or_else(|e| match decode::<OldClientMsg>(payload) {
        Ok(OldClientMsg::Hello { magic, version }) if version < 3 => Ok(ClientMsg::Hello {
            magic,
            version,
            token: None,
        }),
        _ => Err(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NodeFailure;

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
            token: None,
        });
        assert_eq!(
            bytes,
            [13, 0, 0, 0, 0, 0, 0, 0, b'Q', b'I', b'D', b'B', 5, 0, 0, 0, 0]
        );
        let bytes = frame(&ClientMsg::Hello {
            magic: MAGIC,
            version: VERSION,
            token: Some("s3".into()),
        });
        let mut want = vec![
            23, 0, 0, 0, 0, 0, 0, 0, b'Q', b'I', b'D', b'B', 5, 0, 0, 0, 1,
        ];
        want.extend_from_slice(&2u64.to_le_bytes());
        want.extend_from_slice(b"s3");
        assert_eq!(bytes, want);
    }

    #[test]
    fn old_hello_decodes_with_its_version() {
        // A version 2 client's Hello: no token field.
        let old = [0, 0, 0, 0, b'Q', b'I', b'D', b'B', 2, 0, 0, 0];
        let msg = decode_client(&old).expect("decode");
        assert_eq!(
            msg,
            ClientMsg::Hello {
                magic: MAGIC,
                version: 2,
                token: None
            }
        );
        // A current message still decodes; garbage still fails.
        assert_eq!(
            decode_client(&frame(&ClientMsg::Stats { id: 1 })[HEADER_LEN..]).expect("stats"),
            ClientMsg::Stats { id: 1 }
        );
        assert!(decode_client(&[0, 0, 0, 0, b'Q', b'I', b'D', b'B', 3, 0, 0, 0]).is_err());
        assert!(decode_client(&[9, 9]).is_err());
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
            version: VERSION,
            max_count: 1_048_576,
            max_in_flight: 1024,
        });
        // docs/wire-protocol.md shows these bytes: 14000000 00000000 05000000
        // 0000100000000000 00040000.
        let mut want = vec![20, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0];
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
    fn redirect_bytes() {
        // docs/wire-protocol.md shows these bytes.
        let bytes = frame(&ServerMsg::Redirect {
            id: 7,
            leader: Some("h:1".into()),
        });
        let mut want = vec![24, 0, 0, 0, 5, 0, 0, 0];
        want.extend_from_slice(&7u64.to_le_bytes());
        want.push(1);
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(b"h:1");
        assert_eq!(bytes, want);
        let bytes = frame(&ServerMsg::Redirect {
            id: 7,
            leader: None,
        });
        assert_eq!(bytes, [13, 0, 0, 0, 5, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn every_message_round_trips() {
        let failure = NodeFailure {
            addr: "redis://127.0.0.1:1".into(),
            reason: "refused".into(),
        };
        let server = [
            ServerMsg::Welcome {
                version: 2,
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
                    accepted: Some(0),
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
                stats: Box::new(BrokerStats {
                    rounds: 3,
                    batch_histogram: vec![1, 2],
                    role: "leader".into(),
                    term: 3,
                    leader: Some("127.0.0.1:7400".into()),
                    holes: 5,
                    ..Default::default()
                }),
            },
            ServerMsg::Redirect {
                id: 5,
                leader: Some("127.0.0.1:7400".into()),
            },
            ServerMsg::Redirect {
                id: 6,
                leader: None,
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
}

//! RESP replies: what the connection answers, encoded for the client's RESP version by
//! the `redis-protocol` crate's encoders.

use idproto::wire::{BrokerStats, ServerMsg};
use redis_protocol::resp2::types::{OwnedFrame as Frame2, Resp2Frame};
use redis_protocol::resp3::types::{OwnedFrame as Frame3, Resp3Frame};

/// Longest command name or error text echoed back (names are the client's bytes).
const MAX_ECHO: usize = 64;

/// The RESP version replies are encoded in, per connection (`HELLO 2|3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RespVersion {
    Resp2,
    Resp3,
}

impl RespVersion {
    pub(super) fn number(self) -> i64 {
        match self {
            RespVersion::Resp2 => 2,
            RespVersion::Resp3 => 3,
        }
    }
}

/// A reply, before it is encoded for the connection's RESP version.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<Reply>),
    /// A map in RESP3, a flat key, value, key, value... array in RESP2.
    Map(Vec<(String, Reply)>),
}

impl Reply {
    pub(super) fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// An error reply: `text` starts with its code (`ERR`, `NOPROTO`, ...). CR and LF
    /// would end the line early (and let a client's bytes inject a reply): replaced.
    pub(super) fn err(text: impl AsRef<str>) -> Reply {
        Reply::Error(text.as_ref().replace(['\r', '\n'], " "))
    }

    fn to_resp2(&self) -> Frame2 {
        match self {
            Reply::Simple(s) => Frame2::SimpleString(s.clone().into_bytes()),
            Reply::Error(s) => Frame2::Error(s.clone()),
            Reply::Int(i) => Frame2::Integer(*i),
            Reply::Bulk(b) => Frame2::BulkString(b.clone()),
            Reply::Null => Frame2::Null,
            Reply::Array(items) => Frame2::Array(items.iter().map(Reply::to_resp2).collect()),
            Reply::Map(pairs) => Frame2::Array(
                pairs
                    .iter()
                    .flat_map(|(k, v)| [Frame2::BulkString(k.clone().into_bytes()), v.to_resp2()])
                    .collect(),
            ),
        }
    }

    fn to_resp3(&self) -> Frame3 {
        match self {
            Reply::Simple(s) => Frame3::SimpleString {
                data: s.clone().into_bytes(),
                attributes: None,
            },
            Reply::Error(s) => Frame3::SimpleError {
                data: s.clone(),
                attributes: None,
            },
            Reply::Int(i) => Frame3::Number {
                data: *i,
                attributes: None,
            },
            Reply::Bulk(b) => Frame3::BlobString {
                data: b.clone(),
                attributes: None,
            },
            Reply::Null => Frame3::Null,
            Reply::Array(items) => Frame3::Array {
                data: items.iter().map(Reply::to_resp3).collect(),
                attributes: None,
            },
            Reply::Map(pairs) => Frame3::Map {
                data: pairs
                    .iter()
                    .map(|(k, v)| {
                        let key = Frame3::BlobString {
                            data: k.clone().into_bytes(),
                            attributes: None,
                        };
                        (key, v.to_resp3())
                    })
                    .collect(),
                attributes: None,
            },
        }
    }

    /// Appends the encoding of this reply in `proto` to `out`.
    pub(super) fn encode(&self, proto: RespVersion, out: &mut Vec<u8>) {
        let start = out.len();
        let written = match proto {
            RespVersion::Resp2 => {
                let frame = self.to_resp2();
                out.resize(start + frame.encode_len(false), 0);
                redis_protocol::resp2::encode::encode(&mut out[start..], &frame, false)
            }
            RespVersion::Resp3 => {
                let frame = self.to_resp3();
                out.resize(start + frame.encode_len(false), 0);
                redis_protocol::resp3::encode::complete::encode(&mut out[start..], &frame, false)
            }
        };
        match written {
            Ok(n) => out.truncate(start + n),
            Err(e) => {
                // Only a bug could get here (the buffer is sized by the encoder itself).
                tracing::error!("RESP reply not encodable ({e}): sending an error instead");
                out.truncate(start);
                out.extend_from_slice(b"-ERR reply not encodable\r\n");
            }
        }
    }
}

/// The client's bytes, safe to put in a one-line reply: printable ASCII only, short.
pub(super) fn echo(bytes: &[u8]) -> String {
    let mut s: String = bytes
        .iter()
        .take(MAX_ECHO)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '?'
            }
        })
        .collect();
    if bytes.len() > MAX_ECHO {
        s.push_str("...");
    }
    s
}

/// `QLIST.STATS`: every counter of the snapshot by its field name (the serde names of
/// [`BrokerStats`], so a new counter shows up without a change here).
pub(super) fn stats_reply(stats: &BrokerStats) -> Reply {
    match serde_json::to_value(stats) {
        Ok(value) => json_reply(value),
        Err(e) => Reply::err(format!("ERR stats not encodable: {e}")),
    }
}

fn json_reply(value: serde_json::Value) -> Reply {
    use serde_json::Value;
    match value {
        Value::Null => Reply::Null,
        Value::Bool(b) => Reply::Int(i64::from(b)),
        // A counter above i64::MAX (not seen in practice) is sent as its decimal text.
        Value::Number(n) => n
            .as_i64()
            .map_or_else(|| Reply::Bulk(n.to_string().into_bytes()), Reply::Int),
        Value::String(s) => Reply::Bulk(s.into_bytes()),
        Value::Array(items) => Reply::Array(items.into_iter().map(json_reply).collect()),
        Value::Object(fields) => Reply::Map(
            fields
                .into_iter()
                .map(|(k, v)| (k, json_reply(v)))
                .collect(),
        ),
    }
}

/// The reply to a request the batcher answered.
pub(super) fn server_reply(msg: ServerMsg) -> Reply {
    match msg {
        // Two bulk strings: IDs above 2^63 do not fit a RESP integer.
        ServerMsg::Ids { lo, hi, .. } => Reply::Array(vec![
            Reply::Bulk(lo.to_string().into_bytes()),
            Reply::Bulk(hi.to_string().into_bytes()),
        ]),
        ServerMsg::Failed { error, .. } => Reply::err(format!("ERR {error}")),
        // Plain Redis clients follow no redirect: a follower forwards their requests
        // (crate::net::forward). This is left for a broker that stepped down between the
        // check and the queueing of a request, and, with no leader, for a forward that
        // found none within its deadline.
        ServerMsg::Redirect {
            leader: Some(leader),
            ..
        } => Reply::err(format!("ERR not the leader; leader is {leader}")),
        ServerMsg::Redirect { leader: None, .. } => Reply::err(
            "ERR not the leader; no leader is known now (an election is under way): retry shortly",
        ),
        ServerMsg::Stats { stats, .. } => stats_reply(&stats),
        ServerMsg::Welcome { .. } | ServerMsg::Refused { .. } => {
            Reply::err("ERR unexpected reply from the batcher")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(reply: &Reply, proto: RespVersion) -> String {
        let mut out = Vec::new();
        reply.encode(proto, &mut out);
        String::from_utf8(out).expect("ascii")
    }

    #[test]
    fn ids_are_two_bulk_strings_in_both_versions() {
        let reply = server_reply(ServerMsg::Ids {
            id: 0,
            lo: u64::MAX - 1,
            hi: u64::MAX,
        });
        let want = "*2\r\n$20\r\n18446744073709551614\r\n$20\r\n18446744073709551615\r\n";
        assert_eq!(encoded(&reply, RespVersion::Resp2), want);
        assert_eq!(encoded(&reply, RespVersion::Resp3), want);
    }

    #[test]
    fn maps_are_flat_arrays_in_resp2_and_maps_in_resp3() {
        let reply = Reply::Map(vec![
            ("proto".into(), Reply::Int(3)),
            ("x".into(), Reply::Null),
        ]);
        assert_eq!(
            encoded(&reply, RespVersion::Resp2),
            "*4\r\n$5\r\nproto\r\n:3\r\n$1\r\nx\r\n$-1\r\n"
        );
        assert_eq!(
            encoded(&reply, RespVersion::Resp3),
            "%2\r\n$5\r\nproto\r\n:3\r\n$1\r\nx\r\n_\r\n"
        );
    }

    #[test]
    fn redirects_and_failures_are_error_replies() {
        let redirect = server_reply(ServerMsg::Redirect {
            id: 1,
            leader: Some("h:1".into()),
        });
        assert_eq!(
            encoded(&redirect, RespVersion::Resp2),
            "-ERR not the leader; leader is h:1\r\n"
        );
        let failed = server_reply(ServerMsg::Failed {
            id: 1,
            error: idproto::IdError::BadRequest("count 0".into()),
        });
        assert!(encoded(&failed, RespVersion::Resp3).starts_with("-ERR invalid request: count 0"));
    }

    #[test]
    fn stats_are_every_counter_by_name() {
        let stats = BrokerStats {
            requests_ok: 7,
            leader: None,
            ..BrokerStats::default()
        };
        let Reply::Map(fields) = stats_reply(&stats) else {
            panic!("stats are a map");
        };
        assert!(fields.contains(&("requests_ok".into(), Reply::Int(7))));
        assert!(fields.contains(&("leader".into(), Reply::Null)));
    }

    #[test]
    fn errors_cannot_inject_lines() {
        let reply = Reply::err("ERR a\r\n+OK");
        assert_eq!(encoded(&reply, RespVersion::Resp2), "-ERR a  +OK\r\n");
        assert_eq!(echo(b"a\r\nb"), "a??b");
        assert_eq!(echo(&[b'x'; 70]).len(), MAX_ECHO + 3);
    }
}

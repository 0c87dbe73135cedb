//! The leader's heartbeat on the nodes (DESIGN.md, "Leader and followers"): a short-lived,
//! volatile key `<key>:leader` holding `TERM SEQ ADDR`, refreshed by the leader of TERM
//! on every node and read by the followers from a majority.
//!
//! Nothing of it reaches the AOF (`redis.set_repl(REPL_NONE)`, like the rendezvous) and
//! it always has an expiry: a heartbeat costs no fsync, and safety never depends on it.
//! The refresh is conditional on the term: a node holding the heartbeat of a higher term
//! keeps it and answers with it, so a deposed leader can neither hide the new one nor
//! miss it. `SEQ` grows with every refresh of one leader: a follower tells a live leader
//! from a dead one by the heartbeat CHANGING, not by the key existing (a key outlives its
//! leader by its expiry; a change does not).
//!
//! The three operations on one node are the trait [`HeartbeatNode`], which the Redis
//! [`Node`] implements and so does the simulation's node (`idtools::sim::SimNode`): the
//! quorum-wide functions below ([`refresh_heartbeat`], [`read_heartbeats`],
//! [`resign_heartbeat`]) are generic over it, so the deterministic simulation runs the
//! broker's real election over simulated nodes.

use super::Node;
use crate::register::{NodeError, Register};
use futures::stream::{FuturesUnordered, StreamExt};
use idproto::{IdError, NodeFailure};
use redis::Value;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::time::{timeout_at, Instant};

/// `KEYS[1]` = the heartbeat key, `ARGV[1]` = the term (canonical decimal), `ARGV[2]` =
/// the whole value (`TERM SEQ ADDR`), `ARGV[3]` = the expiry in milliseconds.
///
/// When the key holds a heartbeat of a higher term, nothing changes and the reply is that
/// value; otherwise the key is set with the expiry and the reply is nil. Terms are
/// compared as canonical decimals (length, then bytes): no Lua number ever holds one.
/// A stored value that is no heartbeat at all (wrong type, no term) is overwritten.
pub const HEARTBEAT: &str = r#"
redis.set_repl(redis.REPL_NONE)
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'string' then
  local t = string.match(cur, '^([1-9][0-9]*) ')
  local mine = ARGV[1]
  if t and (#t > #mine or (#t == #mine and t > mine)) then
    return cur
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return false
"#;

/// `KEYS[1]` = the heartbeat key, `ARGV[1]` = the term (canonical decimal): deletes the
/// heartbeat if it is of that term (a leader resigning), replying 1; else 0.
pub const RESIGN: &str = r#"
redis.set_repl(redis.REPL_NONE)
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'string' and string.match(cur, '^([0-9]+) ') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"#;

fn resign_sha() -> &'static str {
    static SHA: OnceLock<String> = OnceLock::new();
    SHA.get_or_init(|| redis::Script::new(RESIGN).get_hash().to_string())
}

fn heartbeat_sha() -> &'static str {
    static SHA: OnceLock<String> = OnceLock::new();
    SHA.get_or_init(|| redis::Script::new(HEARTBEAT).get_hash().to_string())
}

/// One heartbeat: the leader of `term`, reachable by clients at `addr`, refresh `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub term: u64,
    pub seq: u64,
    pub addr: String,
}

impl Heartbeat {
    /// The stored form, `TERM SEQ ADDR`.
    pub fn encode(&self) -> String {
        format!("{} {} {}", self.term, self.seq, self.addr)
    }

    /// Parses the stored form; `None` for anything else (term 0 included: no leader
    /// ever has it).
    pub fn parse(s: &str) -> Option<Heartbeat> {
        let mut parts = s.splitn(3, ' ');
        let term = parts.next()?.parse().ok().filter(|t| *t > 0)?;
        let seq = parts.next()?.parse().ok()?;
        let addr = parts.next()?.to_string();
        (!addr.is_empty()).then_some(Heartbeat { term, seq, addr })
    }

    /// Orders heartbeats by (term, seq): the later one of a leader, or a newer leader's.
    pub fn key(&self) -> (u64, u64) {
        (self.term, self.seq)
    }
}

/// The leader's heartbeat on one node, as the election sees it (the semantics of
/// `HEARTBEAT`, `RESIGN` and a GET): volatile, with an expiry, conditional on the
/// term. [`Node`] (Redis) is the production implementation.
pub trait HeartbeatNode: Register {
    /// Sets the heartbeat `hb` expiring after `ttl`, unless the node holds the heartbeat
    /// of a higher term: `Ok(None)` when set, `Ok(Some(newer))` when left alone.
    ///
    /// # Errors
    /// Unavailable (the reason says why).
    fn heartbeat(
        &self,
        key: &str,
        hb: &Heartbeat,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Heartbeat>, NodeError>> + Send;

    /// Deletes the heartbeat if it is of `term`: `Ok(true)` when it was deleted.
    ///
    /// # Errors
    /// Unavailable.
    fn resign(&self, key: &str, term: u64) -> impl Future<Output = Result<bool, NodeError>> + Send;

    /// The heartbeat the node holds now (`None`: none, expired, or not a heartbeat).
    ///
    /// # Errors
    /// Unavailable.
    fn read_heartbeat(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Heartbeat>, NodeError>> + Send;
}

impl HeartbeatNode for Node {
    fn heartbeat(
        &self,
        key: &str,
        hb: &Heartbeat,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Heartbeat>, NodeError>> + Send {
        Node::heartbeat(self, key, hb, ttl)
    }

    fn resign(&self, key: &str, term: u64) -> impl Future<Output = Result<bool, NodeError>> + Send {
        Node::resign(self, key, term)
    }

    fn read_heartbeat(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Heartbeat>, NodeError>> + Send {
        Node::read_heartbeat(self, key)
    }
}

impl Node {
    /// Refreshes the heartbeat `hb` on this node, expiring after `ttl`: `Ok(None)` when
    /// set, `Ok(Some(newer))` when the node holds the heartbeat of a higher term (left
    /// alone).
    ///
    /// # Errors
    /// Unavailable (the reason says why).
    pub async fn heartbeat(
        &self,
        key: &str,
        hb: &Heartbeat,
        ttl: Duration,
    ) -> Result<Option<Heartbeat>, NodeError> {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let value = self
            .eval(
                HEARTBEAT,
                heartbeat_sha(),
                &[key],
                &[hb.term.to_string(), hb.encode(), ms.to_string()],
            )
            .await?;
        match value {
            Value::Nil => Ok(None),
            Value::BulkString(bytes) => {
                let s = String::from_utf8_lossy(&bytes);
                Heartbeat::parse(&s).map(Some).ok_or_else(|| {
                    NodeError::Unavailable(format!("unexpected heartbeat reply {s:?}"))
                })
            }
            other => Err(NodeError::Unavailable(format!(
                "unexpected heartbeat reply {other:?}"
            ))),
        }
    }

    /// Deletes the heartbeat if it is of `term`: the leader of `term` resigns, so the
    /// followers need not wait out their timeout. `Ok(true)` when it was deleted.
    ///
    /// # Errors
    /// Unavailable.
    pub async fn resign(&self, key: &str, term: u64) -> Result<bool, NodeError> {
        let value = self
            .eval(RESIGN, resign_sha(), &[key], &[term.to_string()])
            .await?;
        match value {
            Value::Int(n) => Ok(n == 1),
            other => Err(NodeError::Unavailable(format!(
                "unexpected resign reply {other:?}"
            ))),
        }
    }

    /// GET the heartbeat: `None` when there is none (expired, never set, or a value that
    /// is no heartbeat, which is logged).
    ///
    /// # Errors
    /// Unavailable.
    pub async fn read_heartbeat(&self, key: &str) -> Result<Option<Heartbeat>, NodeError> {
        let mut conn = self.conn().await?;
        match redis::cmd("GET")
            .arg(key)
            .query_async::<Value>(&mut conn)
            .await
        {
            Ok(Value::Nil) => Ok(None),
            Ok(Value::BulkString(bytes)) => {
                let s = String::from_utf8_lossy(&bytes);
                let hb = Heartbeat::parse(&s);
                if hb.is_none() {
                    let shown: String = s.chars().take(64).collect();
                    tracing::warn!(node = %self.addr, key, value = %shown, "not a heartbeat; ignored");
                }
                Ok(hb)
            }
            Ok(other) => Err(NodeError::Unavailable(format!(
                "unexpected GET reply {other:?}"
            ))),
            Err(e) if e.code() == Some("WRONGTYPE") => {
                tracing::warn!(node = %self.addr, key, "heartbeat key is not a string; ignored");
                Ok(None)
            }
            Err(e) => self.fail(e).await,
        }
    }
}

/// Why a node failed, as a [`NodeFailure`] says it.
fn reason(e: NodeError) -> String {
    match e {
        NodeError::Unavailable(r) => r,
        NodeError::Unsafe(r) => format!("unsafe: {r}"),
        NodeError::BadValue(v) => format!("bad value {v:?}"),
        NodeError::NotIndependent(r) => format!("not independent: {r}"),
    }
}

/// What one refresh of the heartbeat on every node came to.
#[derive(Debug, Clone, Default)]
pub struct Refresh {
    /// Nodes that hold the heartbeat now.
    pub acked: usize,
    /// The highest heartbeat of a higher term found (the refresh left those nodes alone).
    pub higher: Option<Heartbeat>,
    /// Nodes that did not answer by the deadline, or failed.
    pub failures: Vec<NodeFailure>,
}

/// Refreshes `hb` on every node in parallel, expiring after `ttl`, waiting for every
/// answer until `deadline` (a node that has not answered by then counts as failed).
pub async fn refresh_heartbeat<N: HeartbeatNode>(
    nodes: &[N],
    key: &str,
    hb: &Heartbeat,
    ttl: Duration,
    deadline: Instant,
) -> Refresh {
    let mut pending: FuturesUnordered<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| async move { (i, node.heartbeat(key, hb, ttl).await) })
        .collect();
    let mut out = Refresh::default();
    let mut answered = vec![false; nodes.len()];
    while let Ok(Some((i, reply))) = timeout_at(deadline, pending.next()).await {
        answered[i] = true;
        match reply {
            Ok(None) => out.acked += 1,
            Ok(Some(newer)) => {
                if out.higher.as_ref().is_none_or(|h| newer.key() > h.key()) {
                    out.higher = Some(newer);
                }
            }
            Err(e) => out.failures.push(NodeFailure {
                addr: nodes[i].addr().to_string(),
                reason: reason(e),
            }),
        }
    }
    for (i, _) in answered.iter().enumerate().filter(|(_, a)| !**a) {
        out.failures.push(NodeFailure {
            addr: nodes[i].addr().to_string(),
            reason: "no heartbeat reply by the deadline".to_string(),
        });
    }
    out
}

/// Deletes the heartbeat of `term` from every node that holds it, waiting for the answers
/// until `deadline`: how many nodes deleted it.
pub async fn resign_heartbeat<N: HeartbeatNode>(
    nodes: &[N],
    key: &str,
    term: u64,
    deadline: Instant,
) -> usize {
    let mut pending: FuturesUnordered<_> = nodes.iter().map(|n| n.resign(key, term)).collect();
    let mut deleted = 0;
    while let Ok(Some(reply)) = timeout_at(deadline, pending.next()).await {
        if reply == Ok(true) {
            deleted += 1;
        }
    }
    deleted
}

/// Reads the heartbeat from every node and returns once a majority answered: what each
/// answer held (`None`: no heartbeat there), in no particular order.
///
/// # Errors
/// [`IdError::NoQuorum`] when too few nodes answer by `deadline`.
pub async fn read_heartbeats<N: HeartbeatNode>(
    nodes: &[N],
    key: &str,
    deadline: Instant,
) -> Result<Vec<Option<Heartbeat>>, IdError> {
    let majority = nodes.len() / 2 + 1;
    let mut pending: FuturesUnordered<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| async move { (i, node.read_heartbeat(key).await) })
        .collect();
    let mut seen = Vec::with_capacity(nodes.len());
    let mut failures = Vec::new();
    let mut answered = vec![false; nodes.len()];
    while let Ok(Some((i, reply))) = timeout_at(deadline, pending.next()).await {
        answered[i] = true;
        match reply {
            Ok(hb) => seen.push(hb),
            Err(e) => failures.push(NodeFailure {
                addr: nodes[i].addr().to_string(),
                reason: reason(e),
            }),
        }
        if seen.len() >= majority {
            return Ok(seen);
        }
    }
    for (i, _) in answered.iter().enumerate().filter(|(_, a)| !**a) {
        failures.push(NodeFailure {
            addr: nodes[i].addr().to_string(),
            reason: "no reply by the deadline".to_string(),
        });
    }
    Err(IdError::NoQuorum {
        needed: majority,
        reachable: seen.len(),
        total: nodes.len(),
        failures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_round_trip_and_junk_is_none() {
        let hb = Heartbeat {
            term: 7,
            seq: 42,
            addr: "127.0.0.1:7400".into(),
        };
        assert_eq!(Heartbeat::parse(&hb.encode()), Some(hb));
        for junk in [
            "", "7", "7 1", "7 1 ", "0 1 a:1", "x 1 a:1", "7 y a:1", "-1 2 a",
        ] {
            assert_eq!(Heartbeat::parse(junk), None, "{junk:?}");
        }
        let spaced = Heartbeat::parse("3 4 host with space:1").expect("parses");
        assert_eq!(spaced.addr, "host with space:1");
    }
}

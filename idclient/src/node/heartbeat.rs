//! The leader's heartbeat on the nodes (DESIGN.md, "Leader and followers"): a short-lived,
//! volatile key `<key>:leader` holding `TERM SEQ ADDR`, or `TERM SEQ hmac=MAC ADDR` when the
//! brokers share a token ([`HeartbeatAuth`]), refreshed by the leader of TERM on every node
//! and read by the followers from a majority.
//!
//! Authenticity: anyone who can write to a node can write a heartbeat. With a token, a
//! broker trusts a heartbeat only if its MAC (HMAC-SHA256 over the heartbeat key, term,
//! seq and address, with a key derived from the token) checks out, so a forged one can
//! neither depose the leader nor name an address the brokers would send their token to.
//! The leader overwrites a forged heartbeat of a higher term with a compare-and-set of
//! that exact value (the `replace` argument of [`HeartbeatNode::heartbeat`]).
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
//! [`Node`] implements and so does the simulation's node (`testkit::sim::SimNode`): the
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
/// the whole value ([`Heartbeat::encode`]), `ARGV[3]` = the expiry in milliseconds,
/// `ARGV[4]` = a stored value to overwrite even if its term is higher (a forged
/// heartbeat the leader replaces), or empty.
///
/// When the key holds a heartbeat of a higher term (other than `ARGV[4]`), nothing
/// changes and the reply is that value; otherwise the key is set with the expiry and the
/// reply is nil. Terms are compared as canonical decimals (length, then bytes): no Lua
/// number ever holds one. A stored value that is no heartbeat at all (wrong type, term or
/// seq not a canonical u64, an address that is not printable ASCII) is overwritten: every
/// value this script keeps is one [`Heartbeat::parse`] reads, and re-encodes exactly.
pub const HEARTBEAT: &str = r#"
redis.set_repl(redis.REPL_NONE)
local function u64(d)
  return #d < 20 or (#d == 20 and d <= '18446744073709551615')
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'string' and cur ~= ARGV[4] then
  local t, s = string.match(cur, '^([1-9][0-9]*) ([0-9]+) [%w%p ]+$')
  local mine = ARGV[1]
  if t and u64(t) and u64(s) and (s == '0' or string.sub(s, 1, 1) ~= '0')
      and (#t > #mine or (#t == #mine and t > mine)) then
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

/// One heartbeat: the leader of `term`, reachable by clients at `addr`, refresh `seq`;
/// `mac` (64 hex digits) when the leader signed it ([`HeartbeatAuth::sign`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The election term whose leader wrote it (from 1; a higher term deposes a lower).
    pub term: u64,
    /// Refresh counter of this leader in this term: it grows on every refresh.
    pub seq: u64,
    /// The leader's advertised client address (`host:port`), where followers redirect.
    pub addr: String,
    /// HMAC-SHA256 over key, term, seq and address, 64 lowercase hex digits; `None` unsigned.
    pub mac: Option<String>,
}

/// What precedes the MAC in the stored form.
const MAC_TAG: &str = "hmac=";

impl Heartbeat {
    /// An unsigned heartbeat.
    pub fn new(term: u64, seq: u64, addr: impl Into<String>) -> Heartbeat {
        Heartbeat {
            term,
            seq,
            addr: addr.into(),
            mac: None,
        }
    }

    /// The stored form: `TERM SEQ ADDR`, or `TERM SEQ hmac=MAC ADDR` when signed.
    pub fn encode(&self) -> String {
        match &self.mac {
            Some(mac) => format!("{} {} {MAC_TAG}{mac} {}", self.term, self.seq, self.addr),
            None => format!("{} {} {}", self.term, self.seq, self.addr),
        }
    }

    /// Parses the stored form; `None` for anything else: term 0 (no leader ever has
    /// it), a term or seq that is not a canonical decimal, an address that is empty or
    /// not printable ASCII (the `HEARTBEAT` script overwrites exactly what this refuses,
    /// and [`Heartbeat::encode`] gives back the very text this parsed).
    pub fn parse(s: &str) -> Option<Heartbeat> {
        let mut parts = s.splitn(3, ' ');
        let term = canonical(parts.next()?).filter(|t| *t > 0)?;
        let seq = canonical(parts.next()?)?;
        let rest = parts.next()?;
        if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
            return None;
        }
        let signed = rest
            .strip_prefix(MAC_TAG)
            .and_then(|r| r.split_once(' '))
            .filter(|(mac, addr)| {
                mac.len() == 64 && mac.bytes().all(|b| b.is_ascii_hexdigit()) && !addr.is_empty()
            });
        let (mac, addr) = match signed {
            Some((mac, addr)) => (Some(mac.to_string()), addr),
            None => (None, rest),
        };
        Some(Heartbeat {
            term,
            seq,
            addr: addr.to_string(),
            mac,
        })
    }

    /// Orders heartbeats by (term, seq): the later one of a leader, or a newer leader's.
    pub fn key(&self) -> (u64, u64) {
        (self.term, self.seq)
    }
}

/// A canonical decimal u64 (no sign, no leading zero): the only form the `HEARTBEAT`
/// script compares, so a value it keeps always re-encodes to itself.
fn canonical(d: &str) -> Option<u64> {
    let digits = !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    let leading_zero = d.len() > 1 && d.starts_with('0');
    if !digits || leading_zero {
        return None;
    }
    d.parse().ok()
}

/// The brokers' key for heartbeats of one ID register, derived from their shared token
/// (`--auth-token-file`): with it a broker signs its heartbeats and trusts only those
/// whose MAC checks out. Its `Debug` shows nothing of the key.
#[derive(Clone)]
pub struct HeartbeatAuth {
    key: ring::hmac::Key,
    /// The heartbeat key (`<key>:leader`) the MAC covers: a heartbeat of another
    /// register's brokers (same token) is not one of ours.
    heartbeat_key: String,
}

impl std::fmt::Debug for HeartbeatAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeartbeatAuth")
            .field("heartbeat_key", &self.heartbeat_key)
            .finish_non_exhaustive()
    }
}

impl HeartbeatAuth {
    /// The key for the heartbeat key `heartbeat_key` (`<key>:leader`), derived from
    /// `token`: HMAC-SHA256(token, a fixed label), so the token itself never keys
    /// anything but this derivation.
    pub fn new(token: &idproto::auth::Token, heartbeat_key: &str) -> HeartbeatAuth {
        use ring::hmac;
        let root = hmac::Key::new(hmac::HMAC_SHA256, token.as_str().as_bytes());
        let derived = hmac::sign(&root, b"qlist broker heartbeat key v1");
        HeartbeatAuth {
            key: hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()),
            heartbeat_key: heartbeat_key.to_string(),
        }
    }

    /// What the MAC covers: the heartbeat key, term, seq and address, each
    /// length-prefixed (no two heartbeats share a message).
    fn message(&self, hb: &Heartbeat) -> Vec<u8> {
        let mut m = Vec::with_capacity(64 + self.heartbeat_key.len() + hb.addr.len());
        m.extend_from_slice(b"qlist-heartbeat-v1");
        for field in [self.heartbeat_key.as_bytes(), hb.addr.as_bytes()] {
            m.extend_from_slice(&(field.len() as u64).to_be_bytes());
            m.extend_from_slice(field);
        }
        m.extend_from_slice(&hb.term.to_be_bytes());
        m.extend_from_slice(&hb.seq.to_be_bytes());
        m
    }

    /// `hb` with its MAC set.
    pub fn sign(&self, mut hb: Heartbeat) -> Heartbeat {
        let tag = ring::hmac::sign(&self.key, &self.message(&hb));
        hb.mac = Some(tag.as_ref().iter().map(|b| format!("{b:02x}")).collect());
        hb
    }

    /// Whether `hb` carries the MAC of its own fields (compared in constant time).
    pub fn verify(&self, hb: &Heartbeat) -> bool {
        let Some(mac) = hb.mac.as_deref() else {
            return false;
        };
        let Some(tag) = unhex(mac) else {
            return false;
        };
        ring::hmac::verify(&self.key, &self.message(hb), &tag).is_ok()
    }
}

/// The bytes of a hex string; `None` if it is not one.
fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The leader's heartbeat on one node, as the election sees it (the semantics of
/// `HEARTBEAT`, `RESIGN` and a GET): volatile, with an expiry, conditional on the
/// term. [`Node`] (Redis) is the production implementation.
pub trait HeartbeatNode: Register {
    /// Sets the heartbeat `hb` expiring after `ttl`, unless the node holds the heartbeat
    /// of a higher term other than `replace` (a forged one the leader overwrites):
    /// `Ok(None)` when set, `Ok(Some(newer))` when left alone.
    ///
    /// # Errors
    /// Unavailable (the reason says why).
    fn heartbeat(
        &self,
        key: &str,
        hb: &Heartbeat,
        ttl: Duration,
        replace: Option<&Heartbeat>,
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
        replace: Option<&Heartbeat>,
    ) -> impl Future<Output = Result<Option<Heartbeat>, NodeError>> + Send {
        Node::heartbeat(self, key, hb, ttl, replace)
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
    /// alone) other than `replace`, which is overwritten.
    ///
    /// # Errors
    /// Unavailable (the reason says why).
    pub async fn heartbeat(
        &self,
        key: &str,
        hb: &Heartbeat,
        ttl: Duration,
        replace: Option<&Heartbeat>,
    ) -> Result<Option<Heartbeat>, NodeError> {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let replace = replace.map(Heartbeat::encode).unwrap_or_default();
        let value = self
            .eval(
                HEARTBEAT,
                heartbeat_sha(),
                &[key],
                &[hb.term.to_string(), hb.encode(), ms.to_string(), replace],
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
    /// The highest trusted heartbeat of a higher term found (the refresh left those
    /// nodes alone).
    pub higher: Option<Heartbeat>,
    /// Nodes that did not answer by the deadline, or failed.
    pub failures: Vec<NodeFailure>,
    /// The highest UNtrusted heartbeat of a higher term found (forged: its MAC does not
    /// check out), and on how many nodes one was; each was overwritten (a compare-and-set
    /// of that exact value) where it still held.
    pub forged: Option<(Heartbeat, usize)>,
}

/// How the refresh of one node ended.
enum NodeRefresh {
    /// The node holds our heartbeat now (`Some`: it overwrote this forged one).
    Set(Option<Heartbeat>),
    /// It holds a trusted heartbeat of a higher term.
    Higher(Heartbeat),
}

/// Refreshes `hb` on every node in parallel, expiring after `ttl`, waiting for every
/// answer until `deadline` (a node that has not answered by then counts as failed).
/// Every heartbeat of a higher term counts (no token: no way to tell a forged one).
pub async fn refresh_heartbeat<N: HeartbeatNode>(
    nodes: &[N],
    key: &str,
    hb: &Heartbeat,
    ttl: Duration,
    deadline: Instant,
) -> Refresh {
    refresh_heartbeat_trusting(nodes, key, hb, ttl, deadline, &|_| true).await
}

/// [`refresh_heartbeat`], trusting only the heartbeats of a higher term that `trust`
/// accepts ([`HeartbeatAuth::verify`]): an untrusted one is overwritten on its node with a
/// compare-and-set of that exact value, so a forged heartbeat deposes nobody and cannot
/// stay, while one written meanwhile by a real leader is kept.
pub async fn refresh_heartbeat_trusting<N: HeartbeatNode>(
    nodes: &[N],
    key: &str,
    hb: &Heartbeat,
    ttl: Duration,
    deadline: Instant,
    trust: &(dyn Fn(&Heartbeat) -> bool + Sync),
) -> Refresh {
    let mut pending: FuturesUnordered<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| async move { (i, refresh_one(node, key, hb, ttl, trust).await) })
        .collect();
    let mut out = Refresh::default();
    let mut answered = vec![false; nodes.len()];
    while let Ok(Some((i, reply))) = timeout_at(deadline, pending.next()).await {
        answered[i] = true;
        match reply {
            Ok(NodeRefresh::Set(forged)) => {
                out.acked += 1;
                if let Some(f) = forged {
                    note_forged(&mut out.forged, f);
                }
            }
            Ok(NodeRefresh::Higher(newer)) => {
                if out.higher.as_ref().is_none_or(|h| newer.key() > h.key()) {
                    out.higher = Some(newer);
                }
            }
            Err((e, forged)) => {
                if let Some(f) = forged {
                    note_forged(&mut out.forged, f);
                }
                out.failures.push(NodeFailure {
                    addr: nodes[i].addr().to_string(),
                    reason: reason(e),
                })
            }
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

/// Counts one more node with a forged heartbeat, keeping the highest.
fn note_forged(seen: &mut Option<(Heartbeat, usize)>, forged: Heartbeat) {
    match seen {
        Some((top, n)) => {
            *n += 1;
            if forged.key() > top.key() {
                *top = forged;
            }
        }
        None => *seen = Some((forged, 1)),
    }
}

/// Refreshes one node; an untrusted heartbeat of a higher term is overwritten once (if
/// the node still holds exactly it). The error carries the forged heartbeat met, if any.
async fn refresh_one<N: HeartbeatNode>(
    node: &N,
    key: &str,
    hb: &Heartbeat,
    ttl: Duration,
    trust: &(dyn Fn(&Heartbeat) -> bool + Sync),
) -> Result<NodeRefresh, (NodeError, Option<Heartbeat>)> {
    let forged = match node.heartbeat(key, hb, ttl, None).await {
        Ok(None) => return Ok(NodeRefresh::Set(None)),
        Ok(Some(newer)) if trust(&newer) => return Ok(NodeRefresh::Higher(newer)),
        Ok(Some(forged)) => forged,
        Err(e) => return Err((e, None)),
    };
    match node.heartbeat(key, hb, ttl, Some(&forged)).await {
        Ok(None) => Ok(NodeRefresh::Set(Some(forged))),
        Ok(Some(newer)) if trust(&newer) => Ok(NodeRefresh::Higher(newer)),
        Ok(Some(again)) => {
            let why = format!(
                "holds an unauthenticated heartbeat of term {} again (rewritten as it was replaced)",
                again.term
            );
            Err((NodeError::Unavailable(why), Some(forged)))
        }
        Err(e) => Err((e, Some(forged))),
    }
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
        accepted: None,
        total: nodes.len(),
        failures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_round_trip_and_junk_is_none() {
        let hb = Heartbeat::new(7, 42, "127.0.0.1:7400");
        assert_eq!(Heartbeat::parse(&hb.encode()), Some(hb));
        for junk in [
            "",
            "7",
            "7 1",
            "7 1 ",
            "0 1 a:1",
            "x 1 a:1",
            "7 y a:1",
            "-1 2 a",
            "07 1 a:1",
            "7 01 a:1",
            "+7 1 a:1",
            "7 +1 a:1",
            "18446744073709551616 1 a:1",
            "7 1 a\u{e9}:1",
            "7 1 a\n:1",
        ] {
            assert_eq!(Heartbeat::parse(junk), None, "{junk:?}");
        }
        let spaced = Heartbeat::parse("3 4 host with space:1").expect("parses");
        assert_eq!(spaced.addr, "host with space:1");
        let max = Heartbeat::parse("18446744073709551615 0 a:1").expect("parses");
        assert_eq!(max.term, u64::MAX);
    }

    fn auth(token: &str, key: &str) -> HeartbeatAuth {
        HeartbeatAuth::new(&idproto::auth::Token::new(token).expect("token"), key)
    }

    #[test]
    fn signed_heartbeats_verify_and_round_trip_and_any_change_breaks_them() {
        let a = auth("s3cret", "ids:leader");
        let hb = a.sign(Heartbeat::new(7, 42, "127.0.0.1:7400"));
        let text = hb.encode();
        assert!(text.starts_with("7 42 hmac="), "{text}");
        assert!(!text.contains("s3cret"));
        let parsed = Heartbeat::parse(&text).expect("parses");
        assert_eq!(parsed, hb);
        assert_eq!(parsed.encode(), text);
        assert!(a.verify(&parsed));
        let mut changed = parsed.clone();
        changed.addr = "127.0.0.1:9".into();
        assert!(!a.verify(&changed));
        for (term, seq) in [(8, 42), (7, 43)] {
            let mut c = parsed.clone();
            (c.term, c.seq) = (term, seq);
            assert!(!a.verify(&c), "{term} {seq}");
        }
        assert!(!a.verify(&Heartbeat::new(7, 42, "127.0.0.1:7400")));
        assert!(!auth("other", "ids:leader").verify(&parsed));
        assert!(!auth("s3cret", "other:leader").verify(&parsed));
        assert!(!format!("{a:?}").contains("s3cret"));
    }
}

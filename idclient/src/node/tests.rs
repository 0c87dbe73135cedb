//! The Redis node against a scripted fake server: a loopback TCP listener that speaks
//! RESP and answers each command as the test says (a reply, half a reply then silence,
//! or a closed connection). Checks the replies `Node` makes of it, the kinds of
//! [`NodeError`], and that the password in the URL never shows in an error.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SECRET: &str = "hunter2";
const TIMEOUT: Duration = Duration::from_secs(2);

/// What the fake server does with one command.
enum Act {
    Reply(Vec<u8>),
    /// Sends these bytes (part of a reply), then nothing while the connection stays open.
    Stall(Vec<u8>),
    /// Closes the connection without a reply.
    Close,
}

type Script = dyn Fn(&[String]) -> Act + Send + Sync;

/// A fake Redis server on a loopback port; stops when dropped.
struct FakeRedis {
    port: u16,
    /// Every command received, in order.
    seen: Arc<Mutex<Vec<Vec<String>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeRedis {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeRedis {
    /// Serves `script`'s answers; commands it leaves to [`setup`] get a healthy,
    /// durable master's.
    async fn start(script: impl Fn(&[String]) -> Option<Act> + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the fake server");
        let port = listener.local_addr().expect("the fake's address").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(move |cmd| script(cmd).unwrap_or_else(|| setup(cmd)));
        let log = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, Arc::clone(&script), Arc::clone(&log)));
            }
        });
        FakeRedis { port, seen, task }
    }

    /// A node on this server, with a password in its URL, checking durability.
    fn node(&self, reply_timeout: Duration) -> Node {
        let url = format!("redis://alice:{SECRET}@127.0.0.1:{}", self.port);
        Node::new(&url, TIMEOUT, reply_timeout, true).expect("a valid URL")
    }

    /// How many commands named `name` arrived.
    fn count(&self, name: &str) -> usize {
        let seen = self.seen.lock().expect("fake log lock");
        seen.iter()
            .filter(|c| c[0].eq_ignore_ascii_case(name))
            .count()
    }
}

/// The answers of a healthy, durable master to what a connect sends.
fn setup(cmd: &[String]) -> Act {
    match cmd[0].to_ascii_uppercase().as_str() {
        "INFO" => Act::Reply(bulk(
            "# Server\r\nrun_id:abc123\r\nrole:master\r\nconnected_slaves:0\r\n",
        )),
        "CONFIG" => {
            let name = cmd.get(2).map(String::as_str).unwrap_or("");
            let value = DURABLE_SETTINGS
                .iter()
                .find(|(n, _)| *n == name)
                .map_or("", |(_, v)| *v);
            Act::Reply(array(&[&bulk(name), &bulk(value)]))
        }
        // AUTH, CLIENT SETINFO, SELECT.
        _ => Act::Reply(b"+OK\r\n".to_vec()),
    }
}

async fn serve(mut socket: TcpStream, script: Arc<Script>, seen: Arc<Mutex<Vec<Vec<String>>>>) {
    let mut buf = Vec::new();
    loop {
        while let Some((cmd, used)) = parse_command(&buf) {
            buf.drain(..used);
            seen.lock().expect("fake log lock").push(cmd.clone());
            match script(&cmd) {
                Act::Reply(bytes) => {
                    if socket.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
                Act::Stall(bytes) => {
                    let _ = socket.write_all(&bytes).await;
                    std::future::pending::<()>().await;
                }
                Act::Close => return,
            }
        }
        match socket.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// One whole command (an array of bulk strings, as clients send) at the start of `buf`,
/// and its length; `None` until it is all there.
fn parse_command(buf: &[u8]) -> Option<(Vec<String>, usize)> {
    fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
        let end = buf.get(at..)?.windows(2).position(|w| w == b"\r\n")? + at;
        Some((&buf[at..end], end + 2))
    }
    let number = |bytes: &[u8]| std::str::from_utf8(bytes).ok()?.parse::<usize>().ok();
    let (head, mut at) = line(buf, 0)?;
    let n = number(head.strip_prefix(b"*")?)?;
    let mut parts = Vec::with_capacity(n);
    for _ in 0..n {
        let (len, next) = line(buf, at)?;
        let len = number(len.strip_prefix(b"$")?)?;
        let data = buf.get(next..next + len)?;
        parts.push(String::from_utf8_lossy(data).into_owned());
        at = next + len + 2;
        if buf.len() < at {
            return None;
        }
    }
    Some((parts, at))
}

fn bulk(s: &str) -> Vec<u8> {
    format!("${}\r\n{s}\r\n", s.len()).into_bytes()
}

fn array(items: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", items.len()).into_bytes();
    for item in items {
        out.extend_from_slice(item);
    }
    out
}

fn int(i: i64) -> Vec<u8> {
    format!(":{i}\r\n").into_bytes()
}

/// The script a command runs: the conditional write has 2 keys, the rendezvous 3.
fn is_eval(cmd: &[String], keys: &str) -> bool {
    matches!(cmd[0].as_str(), "EVALSHA" | "EVAL") && cmd.get(2).map(String::as_str) == Some(keys)
}

/// Answers the conditional write with `reply`, leaves the rest to [`setup`].
fn on_write(reply: Vec<u8>) -> impl Fn(&[String]) -> Option<Act> + Send + Sync {
    move |cmd| is_eval(cmd, "2").then(|| Act::Reply(reply.clone()))
}

#[track_caller]
fn no_secret(e: &NodeError) {
    let shown = format!("{e:?}");
    assert!(!shown.contains(SECRET), "the password shows in {shown}");
}

#[tokio::test]
async fn an_accepted_write_and_what_was_sent() {
    let fake = FakeRedis::start(on_write(array(&[&int(1), &bulk("10"), &int(0)]))).await;
    let node = fake.node(TIMEOUT);
    let got = node.conditional_write("k", 1, 10, None).await;
    let want = WriteOutcome {
        reply: WriteReply::Accepted,
        combining: false,
    };
    assert_eq!(got, Ok(want));
    assert_eq!(fake.count("AUTH"), 1, "the password was used");
    assert_eq!(
        fake.count("CONFIG"),
        DURABLE_SETTINGS.len(),
        "durability checked"
    );
    let seen = fake.seen.lock().expect("fake log lock");
    let write = seen
        .iter()
        .find(|c| is_eval(c, "2"))
        .expect("the write was sent");
    assert_eq!(write[3..], ["k", "k:inflight", "1", "10", ""]);
    assert!(!node.addr().contains(SECRET));
}

#[tokio::test]
async fn a_rejection_carries_the_register_and_the_hint() {
    let fake = FakeRedis::start(on_write(array(&[&int(0), &bulk("42"), &int(1)]))).await;
    let got = fake
        .node(TIMEOUT)
        .conditional_write("k", 1, 10, Some(Nonce(7)))
        .await;
    let want = WriteOutcome {
        reply: WriteReply::Rejected { current: 42 },
        combining: true,
    };
    assert_eq!(got, Ok(want));
}

#[tokio::test]
async fn an_unknown_script_is_sent_once_in_full() {
    let fake = FakeRedis::start(|cmd: &[String]| match cmd[0].as_str() {
        "EVALSHA" => Some(Act::Reply(b"-NOSCRIPT No matching script.\r\n".to_vec())),
        "EVAL" => Some(Act::Reply(array(&[&int(1), &bulk("5"), &int(0)]))),
        _ => None,
    })
    .await;
    let got = fake.node(TIMEOUT).conditional_write("k", 1, 5, None).await;
    assert_eq!(got.map(|w| w.reply), Ok(WriteReply::Accepted));
    assert_eq!((fake.count("EVALSHA"), fake.count("EVAL")), (1, 1));
}

#[tokio::test]
async fn malformed_replies_are_unavailable_or_bad_values() {
    for (reply, bad_value) in [
        (array(&[&int(7), &int(7)]), false),
        (int(1), false),
        (array(&[&int(1), &bulk("10")]), false),
        // A rejection whose register is no canonical u64.
        (array(&[&int(0), &bulk("007"), &int(0)]), true),
    ] {
        let fake = FakeRedis::start(on_write(reply)).await;
        let e = fake
            .node(TIMEOUT)
            .conditional_write("k", 1, 10, None)
            .await
            .expect_err("not a valid reply");
        no_secret(&e);
        match (&e, bad_value) {
            (NodeError::BadValue(v), true) => assert_eq!(v, "007"),
            (NodeError::Unavailable(m), false) => {
                assert!(m.starts_with("unexpected script reply"), "{m}")
            }
            _ => panic!("unexpected kind: {e:?}"),
        }
    }
}

#[tokio::test]
async fn a_bad_register_is_bad_value() {
    let fake = FakeRedis::start(on_write(b"-QLISTBAD foo\r\n".to_vec())).await;
    let e = fake.node(TIMEOUT).conditional_write("k", 1, 10, None).await;
    assert_eq!(e, Err(NodeError::BadValue("foo".to_string())));
}

#[tokio::test]
async fn half_a_reply_times_out_and_the_node_reconnects() {
    let writes = AtomicUsize::new(0);
    let fake = FakeRedis::start(move |cmd: &[String]| {
        is_eval(cmd, "2").then(|| match writes.fetch_add(1, Ordering::Relaxed) {
            0 => Act::Stall(b"*3\r\n:1\r\n".to_vec()),
            _ => Act::Reply(array(&[&int(0), &bulk("10"), &int(0)])),
        })
    })
    .await;
    let node = fake.node(Duration::from_millis(300));
    let e = node
        .conditional_write("k", 1, 10, None)
        .await
        .expect_err("half a reply");
    no_secret(&e);
    assert!(
        matches!(&e, NodeError::Unavailable(m) if m.contains("timed out")),
        "{e:?}"
    );
    // The stalled connection is dropped: after the reconnect interval, a fresh one.
    tokio::time::sleep(RECONNECT_INTERVAL).await;
    let got = node.conditional_write("k", 1, 10, None).await;
    assert_eq!(
        got.map(|w| w.reply),
        Ok(WriteReply::Rejected { current: 10 })
    );
    assert_eq!(fake.count("INFO"), 2, "connected twice");
}

#[tokio::test]
async fn a_closed_connection_is_unavailable() {
    let fake = FakeRedis::start(|cmd: &[String]| is_eval(cmd, "2").then_some(Act::Close)).await;
    let e = fake.node(TIMEOUT).conditional_write("k", 1, 10, None).await;
    let e = e.expect_err("no reply");
    no_secret(&e);
    assert!(matches!(e, NodeError::Unavailable(_)), "{e:?}");
}

#[tokio::test]
async fn a_refused_connect_is_unavailable() {
    // A port nobody listens on any more.
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("address").port()
    };
    let url = format!("redis://alice:{SECRET}@127.0.0.1:{port}");
    let node = Node::new(&url, TIMEOUT, TIMEOUT, true).expect("a valid URL");
    let e = node.warm_up().await.expect_err("nobody listens");
    no_secret(&e);
    assert!(
        matches!(&e, NodeError::Unavailable(m) if m.starts_with("connect")),
        "{e:?}"
    );
}

#[tokio::test]
async fn reads_parse_exactly() {
    let fake = FakeRedis::start(|cmd: &[String]| {
        (cmd[0] == "GET").then(|| match cmd[1].as_str() {
            "missing" => Act::Reply(b"$-1\r\n".to_vec()),
            "number" => Act::Reply(bulk("42")),
            "text" => Act::Reply(bulk("abc")),
            "hash" => Act::Reply(b"-WRONGTYPE Operation against a key\r\n".to_vec()),
            _ => Act::Reply(int(5)),
        })
    })
    .await;
    let node = fake.node(TIMEOUT);
    assert_eq!(node.read("missing").await, Ok(0));
    assert_eq!(node.read("number").await, Ok(42));
    assert_eq!(
        node.read("text").await,
        Err(NodeError::BadValue("abc".to_string()))
    );
    assert_eq!(
        node.read("hash").await,
        Err(NodeError::BadValue("(not a string)".to_string()))
    );
    let e = node.read("int").await.expect_err("an integer reply");
    assert!(matches!(e, NodeError::Unavailable(_)), "{e:?}");
}

#[tokio::test]
async fn a_replica_is_not_independent() {
    let fake = FakeRedis::start(|cmd: &[String]| {
        (cmd[0] == "INFO").then(|| Act::Reply(bulk("run_id:abc\r\nrole:slave\r\n")))
    })
    .await;
    let e = fake.node(TIMEOUT).warm_up().await.expect_err("a replica");
    no_secret(&e);
    assert!(
        matches!(&e, NodeError::NotIndependent(m) if m.contains("replica")),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_node_without_fsync_is_unsafe() {
    let fake = FakeRedis::start(|cmd: &[String]| {
        (cmd[0] == "CONFIG" && cmd[2] == "appendfsync")
            .then(|| Act::Reply(array(&[&bulk("appendfsync"), &bulk("everysec")])))
    })
    .await;
    let e = fake.node(TIMEOUT).warm_up().await.expect_err("unsafe");
    no_secret(&e);
    assert!(
        matches!(&e, NodeError::Unsafe(m) if m.contains("appendfsync")),
        "{e:?}"
    );
}

#[tokio::test]
async fn rendezvous_replies_parse_or_are_refused() {
    let nonce = Nonce(0xab);
    let n = nonce.to_string();
    let replies = Mutex::new(vec![
        array(&[&int(1), &bulk(&n), &bulk("5"), &int(40)]),
        array(&[&int(3), &bulk(&n), &int(-2)]),
        array(&[&int(1), &bulk("not a nonce"), &bulk("5"), &int(40)]),
        array(&[&int(1), &bulk("12")]),
        array(&[&int(9)]),
    ]);
    let fake = FakeRedis::start(move |cmd: &[String]| {
        is_eval(cmd, "3").then(|| Act::Reply(replies.lock().expect("lock").remove(0)))
    })
    .await;
    let node = fake.node(TIMEOUT);
    let leases = Leases {
        round: Duration::from_millis(30),
        batch: Duration::from_millis(60),
    };
    let follow = Join::Follow {
        batch: nonce,
        offset: 5,
        wait: Duration::from_millis(40),
    };
    assert_eq!(node.join("k", 2, Nonce(1), leases).await, Ok(follow));
    let lead = Join::Lead {
        busy: nonce,
        wait: Duration::ZERO,
    };
    assert_eq!(node.join("k", 2, Nonce(1), leases).await, Ok(lead));
    let e = node
        .join("k", 2, Nonce(1), leases)
        .await
        .expect_err("bad nonce");
    assert!(matches!(e, NodeError::Unavailable(_)), "{e:?}");
    let lease = Duration::from_millis(30);
    assert_eq!(
        node.close("k", nonce, lease).await,
        Ok(Close::Closed { ids: 12 })
    );
    let e = node
        .close("k", nonce, lease)
        .await
        .expect_err("unknown reply");
    assert!(matches!(e, NodeError::Unavailable(_)), "{e:?}");
    let seen = fake.seen.lock().expect("fake log lock");
    let join = seen
        .iter()
        .find(|c| is_eval(c, "3"))
        .expect("a join was sent");
    let max = MAX_COUNT.to_string();
    assert_eq!(
        join[3..],
        [
            "k:batch",
            "k:inflight",
            "k:results",
            "join",
            "2",
            &Nonce(1).to_string(),
            "30",
            &max,
            "60"
        ]
    );
}

use super::NodeAddr;

#[test]
fn shown_addresses_never_carry_a_password() {
    for (url, shown) in [
        ("redis://127.0.0.1:7001", "redis://127.0.0.1:7001"),
        ("redis://h:1/2", "redis://h:1/2"),
        ("redis://:hunter2@h:1", "redis://:***@h:1"),
        ("redis://alice:hunter2@h:1/0", "redis://alice:***@h:1/0"),
        ("redis://hunter2@h:1", "redis://:***@h:1"),
        ("redis://:hun/ter@2@h:1", "redis://:***@h:1"),
        ("redis://h:1/0?password=hunter2", "redis://h:1/0?***"),
        ("redis://h:1#hunter2", "redis://h:1?***"),
        ("hunter2@h:1", ":***@h:1"),
    ] {
        let addr = NodeAddr::from_url(url);
        assert_eq!(addr.to_string(), shown, "{url}");
        assert!(!format!("{addr} {addr:?}").contains("hunter2"), "{url}");
    }
}

/// Every command the scripts run (what a script's ACL denial is named by) is in the ACL
/// line of docs/operations-redis.md: a new command in a script must be documented.
#[test]
fn the_scripts_run_only_commands_the_documented_acl_allows() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations-redis.md");
    let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let acl: Vec<String> = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER qlist "))
        .unwrap_or_else(|| panic!("{path}: no ACL SETUSER line"))
        .split_whitespace()
        .filter_map(|w| w.strip_prefix('+'))
        .map(str::to_lowercase)
        .collect();
    let mut commands = Vec::new();
    for source in [
        CONDITIONAL_WRITE,
        COMBINE,
        heartbeat::HEARTBEAT,
        heartbeat::RESIGN,
    ] {
        for line in 1..=source.lines().count() {
            commands.extend(script_line_commands(source, line));
        }
    }
    assert!(commands.contains(&"PUBLISH"), "{commands:?}");
    for c in commands {
        assert!(
            acl.contains(&c.to_lowercase()),
            "the scripts run {c}, which the documented ACL does not allow: {acl:?}"
        );
    }
}

#[test]
fn a_script_line_names_its_commands() {
    let line = COMBINE
        .lines()
        .position(|l| l.contains("'PUBLISH'"))
        .expect("the rendezvous publishes results")
        + 1;
    assert_eq!(script_line_commands(COMBINE, line), ["PUBLISH"]);
    let both = COMBINE
        .lines()
        .position(|l| l.contains("redis.call('GET', KEYS[2]) == ARGV[2]"))
        .expect("finish clears the in-flight mark")
        + 1;
    assert_eq!(script_line_commands(COMBINE, both), ["GET", "DEL"]);
    assert!(script_line_commands(COMBINE, 0).is_empty());
    assert!(script_line_commands(COMBINE, 100_000).is_empty());
}

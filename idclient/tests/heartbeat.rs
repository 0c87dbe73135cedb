//! The broker leader's heartbeat primitives on real redis-server nodes: refresh on every
//! node, conditional on the term; read from a majority; expiry; a minority down.

use idclient::{read_heartbeats, refresh_heartbeat, resign_heartbeat, Heartbeat, IdError, Node};
use idtools::cluster::{test_quorum, LocalQuorum};
use std::time::Duration;
use tokio::time::Instant;

const KEY: &str = "current:leader";

fn nodes(q: &LocalQuorum) -> Vec<Node> {
    let timeout = Duration::from_millis(500);
    q.urls()
        .iter()
        .map(|u| Node::new(u, timeout, timeout, true).expect("a valid node URL"))
        .collect()
}

fn hb(term: u64, seq: u64) -> Heartbeat {
    Heartbeat::new(term, seq, format!("127.0.0.1:{}", 7000 + term))
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(2)
}

const TTL: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_refresh_reaches_every_node_and_a_lower_term_is_refused_with_the_higher() {
    let q = test_quorum(3);
    let nodes = nodes(&q);
    assert!(read_heartbeats(&nodes, KEY, soon())
        .await
        .expect("a majority answers")
        .iter()
        .all(Option::is_none));

    let r = refresh_heartbeat(&nodes, KEY, &hb(2, 1), TTL, soon()).await;
    assert_eq!((r.acked, r.higher, r.failures.len()), (3, None, 0));
    let seen = read_heartbeats(&nodes, KEY, soon()).await.expect("read");
    assert!(seen.len() >= 2, "{seen:?}");
    assert!(
        seen.iter().all(|h| h.as_ref() == Some(&hb(2, 1))),
        "{seen:?}"
    );

    // The same term refreshes (a later seq); a lower term is refused and told the higher.
    let r = refresh_heartbeat(&nodes, KEY, &hb(2, 2), TTL, soon()).await;
    assert_eq!(r.acked, 3);
    let r = refresh_heartbeat(&nodes, KEY, &hb(1, 99), TTL, soon()).await;
    assert_eq!((r.acked, r.higher), (0, Some(hb(2, 2))));
    let seen = read_heartbeats(&nodes, KEY, soon()).await.expect("read");
    assert!(
        seen.iter().all(|h| h.as_ref() == Some(&hb(2, 2))),
        "{seen:?}"
    );

    // A higher term takes over, also where a terms compare as decimals, not as text.
    let r = refresh_heartbeat(&nodes, KEY, &hb(10, 1), TTL, soon()).await;
    assert_eq!(r.acked, 3);
    let r = refresh_heartbeat(&nodes, KEY, &hb(9, 5), TTL, soon()).await;
    assert_eq!((r.acked, r.higher), (0, Some(hb(10, 1))));
}

#[tokio::test]
async fn a_heartbeat_expires_and_junk_is_overwritten() {
    let q = test_quorum(1);
    let nodes = nodes(&q);
    let raw = redis::Client::open(q.urls()[0].as_str()).expect("redis URL");
    let mut conn = raw
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    // Junk in the key is no heartbeat: read as none, overwritten by a refresh.
    let () = redis::cmd("SET")
        .arg(KEY)
        .arg("junk")
        .query_async(&mut conn)
        .await
        .expect("SET");
    assert_eq!(
        read_heartbeats(&nodes, KEY, soon()).await.expect("read"),
        vec![None]
    );
    let r = refresh_heartbeat(&nodes, KEY, &hb(1, 1), Duration::from_millis(100), soon()).await;
    assert_eq!(r.acked, 1);
    let pttl: i64 = redis::cmd("PTTL")
        .arg(KEY)
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!((1..=100).contains(&pttl), "pttl {pttl}");
    // Gone after its expiry (bounded polling, no timing assumption).
    testkit::wait_for_async(
        "the heartbeat expires (its TTL was 100 ms)",
        Duration::from_secs(10),
        || async { read_heartbeats(&nodes, KEY, soon()).await.expect("read") == vec![None] },
    )
    .await;
}

#[tokio::test]
async fn a_minority_down_is_a_partial_refresh_and_a_majority_down_no_quorum() {
    let mut q = test_quorum(3);
    let nodes = nodes(&q);
    q.kill(0);
    let r = refresh_heartbeat(&nodes, KEY, &hb(1, 1), TTL, soon()).await;
    assert_eq!((r.acked, r.failures.len()), (2, 1), "{r:?}");
    let seen = read_heartbeats(&nodes, KEY, soon())
        .await
        .expect("majority up");
    assert_eq!(seen, vec![Some(hb(1, 1)), Some(hb(1, 1))]);
    q.kill(1);
    match read_heartbeats(&nodes, KEY, soon()).await {
        Err(IdError::NoQuorum {
            needed, reachable, ..
        }) => assert_eq!((needed, reachable), (2, 1)),
        other => panic!("expected NoQuorum, got {other:?}"),
    }
}

#[tokio::test]
async fn only_the_leader_of_the_term_held_can_resign_it() {
    let q = test_quorum(3);
    let nodes = nodes(&q);
    let r = refresh_heartbeat(&nodes, KEY, &hb(12, 1), TTL, soon()).await;
    assert_eq!(r.acked, 3);
    // Another term (1 is a prefix of 12: compared whole, not as text) deletes nothing.
    for other in [1, 2, 11, 120] {
        assert_eq!(
            resign_heartbeat(&nodes, KEY, other, soon()).await,
            0,
            "{other}"
        );
    }
    assert!(read_heartbeats(&nodes, KEY, soon())
        .await
        .expect("read")
        .iter()
        .all(|h| h.as_ref() == Some(&hb(12, 1))));
    assert_eq!(resign_heartbeat(&nodes, KEY, 12, soon()).await, 3);
    assert!(read_heartbeats(&nodes, KEY, soon())
        .await
        .expect("read")
        .iter()
        .all(Option::is_none));
}

/// With a key: a forged heartbeat of a higher term (any form the script keeps) is
/// overwritten by the trusting refresh and reported; a signed one of a higher term is
/// kept and followed; values the script would keep but Rust could not re-encode
/// exactly (non-canonical numbers, non-ASCII) are overwritten as no heartbeat at all.
#[tokio::test]
async fn a_forged_heartbeat_is_overwritten_and_a_signed_one_kept() {
    use idclient::{refresh_heartbeat_trusting, HeartbeatAuth, Token};
    let q = test_quorum(3);
    let nodes = nodes(&q);
    let auth = HeartbeatAuth::new(&Token::new("s3cret").expect("token"), KEY);
    let trust = |h: &Heartbeat| auth.verify(h);
    let set_all = |value: String| {
        let urls = q.urls();
        async move {
            for url in urls {
                let mut c = redis::Client::open(url.as_str())
                    .expect("URL")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect");
                let () = redis::cmd("SET")
                    .arg(KEY)
                    .arg(&value)
                    .query_async(&mut c)
                    .await
                    .expect("SET");
            }
        }
    };
    let mine = auth.sign(hb(2, 1));

    set_all("999 5 127.0.0.1:9".into()).await;
    let r = refresh_heartbeat_trusting(&nodes, KEY, &mine, TTL, soon(), &trust).await;
    assert_eq!((r.acked, r.higher.clone()), (3, None), "{r:?}");
    let (forged, on) = r.forged.expect("the forged heartbeat is reported");
    assert_eq!(
        (forged.term, forged.addr.as_str(), on),
        (999, "127.0.0.1:9", 3)
    );
    let seen = read_heartbeats(&nodes, KEY, soon()).await.expect("read");
    assert!(seen.iter().all(|h| h.as_ref() == Some(&mine)), "{seen:?}");

    // Not canonical, or not printable ASCII: no heartbeat, overwritten by a plain refresh.
    for junk in [
        "999 05 a:1",
        "0999 5 a:1",
        "999 5 a\u{e9}:1",
        "99999999999999999999 5 a:1",
    ] {
        set_all(junk.into()).await;
        let r = refresh_heartbeat(&nodes, KEY, &hb(2, 2), TTL, soon()).await;
        assert_eq!((r.acked, r.higher), (3, None), "{junk:?}");
    }

    // A signed heartbeat of a higher term is a real leader's: kept, and followed.
    let newer = auth.sign(hb(3, 1));
    set_all(newer.encode()).await;
    let r = refresh_heartbeat_trusting(&nodes, KEY, &mine, TTL, soon(), &trust).await;
    assert_eq!(
        (r.acked, r.higher, r.forged.is_none()),
        (0, Some(newer), true)
    );
}

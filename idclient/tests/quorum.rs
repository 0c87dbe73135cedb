//! The direct client against real redis-server quorums: ordering, exact values, bad
//! register values, unsafe nodes, bad URLs.

use idclient::{ClientConfig, IdError, IdSource, Protocol, QuorumClient};
use idtools::cluster::{node_command, test_quorum, LocalQuorum};
use std::time::Duration;

async fn client(q: &LocalQuorum, protocol: Protocol) -> QuorumClient {
    let mut config = ClientConfig::new(q.urls());
    config.protocol = protocol;
    config.deadline = Duration::from_secs(2);
    QuorumClient::connect(config).await.expect("connect")
}

/// Sets the register on every node of `q` to a raw value.
async fn set_all(q: &LocalQuorum, value: &str) {
    for url in q.urls() {
        node_command(&url, &["DEL", "current"]).await;
        node_command(&url, &["SET", "current", value]).await;
    }
}

#[tokio::test]
async fn ids_increase_across_protocols_and_clients() {
    let q = test_quorum(5);
    let fast = client(&q, Protocol::Fast).await;
    let classic = client(&q, Protocol::Classic).await;
    let mut last = 0;
    for i in 0..50u64 {
        let range = if i % 2 == 0 {
            fast.next_ids(1 + i % 4).await
        } else {
            classic.next_ids(1 + i % 3).await
        }
        .expect("ids");
        assert!(range.lo > last, "range {range:?} not above {last}");
        assert!(range.hi >= range.lo);
        last = range.hi;
    }
    let c = fast.counters();
    assert_eq!(c.requests, 25);
    assert_eq!(c.errors, 0);
}

#[tokio::test]
async fn fast_protocol_learns_the_value_from_rejects() {
    let q = test_quorum(3);
    // "99" > "100" as strings: the script must compare by length first.
    set_all(&q, "99").await;
    let c = client(&q, Protocol::Fast).await;
    assert_eq!(c.next_id().await.expect("id"), 100);
    assert_eq!(c.next_id().await.expect("id"), 101);
    assert!(
        c.counters().rejects >= 2,
        "the first guess (1) must have been rejected"
    );
}

#[tokio::test]
async fn values_near_2_pow_63_and_u64_max_are_exact() {
    let q = test_quorum(3);
    for protocol in [Protocol::Fast, Protocol::Classic] {
        // 2^53 + 1 is where Lua doubles stop being exact; 2^63 is where i64 ends.
        for base in [
            (1u64 << 53) + 1,
            (1u64 << 63) - 2,
            1u64 << 63,
            u64::MAX - 10,
        ] {
            set_all(&q, &base.to_string()).await;
            let c = client(&q, protocol).await;
            let r = c.next_ids(3).await.expect("range");
            assert_eq!((r.lo, r.hi), (base + 1, base + 3), "{protocol:?} at {base}");
            assert_eq!(c.next_id().await.expect("id"), base + 4);
        }
        set_all(&q, &(u64::MAX - 2).to_string()).await;
        let c = client(&q, protocol).await;
        assert_eq!(
            c.next_ids(2).await.expect("last two"),
            idclient::IdRange {
                lo: u64::MAX - 1,
                hi: u64::MAX
            }
        );
        let err = c.next_id().await.expect_err("no IDs left");
        assert!(matches!(err, IdError::Exhausted { .. }), "{err}");
    }
}

#[tokio::test]
async fn bad_register_values_are_errors_naming_the_node() {
    let q = test_quorum(3);
    for bad in ["foo", "-1", "007", "18446744073709551616", "1.5", ""] {
        set_all(&q, bad).await;
        for protocol in [Protocol::Fast, Protocol::Classic] {
            let c = client(&q, protocol).await;
            let err = c.next_id().await.expect_err(bad);
            let msg = err.to_string();
            assert!(
                matches!(err, IdError::BadValue { .. }),
                "{bad:?} {protocol:?}: {msg}"
            );
            assert!(
                msg.contains("redis://127.0.0.1:"),
                "error must name the node: {msg}"
            );
            assert!(msg.contains("canonical decimal u64"), "{msg}");
        }
    }
    // Not a string at all.
    for url in q.urls() {
        node_command(&url, &["DEL", "current"]).await;
        node_command(&url, &["RPUSH", "current", "x"]).await;
    }
    let err = client(&q, Protocol::Fast)
        .await
        .next_id()
        .await
        .expect_err("list");
    assert!(matches!(err, IdError::BadValue { .. }), "{err}");
}

#[tokio::test]
async fn unsafe_node_is_refused_unless_overridden() {
    let q = LocalQuorum::temp_with_args(3, &["--appendfsync".into(), "everysec".into()])
        .expect("start redis");
    let err = QuorumClient::connect(ClientConfig::new(q.urls()))
        .await
        .err()
        .expect("must refuse");
    let msg = err.to_string();
    assert!(matches!(err, IdError::UnsafeNode { .. }), "{msg}");
    assert!(
        msg.contains("appendfsync") && msg.contains("everysec"),
        "{msg}"
    );

    let mut config = ClientConfig::new(q.urls());
    config.unsafe_skip_durability_check = true;
    let c = QuorumClient::connect(config).await.expect("override");
    assert_eq!(c.next_id().await.expect("id"), 1);
}

#[tokio::test]
async fn unreachable_and_malformed_urls_are_clear_errors() {
    let port = idtools::cluster::free_port().expect("port");
    let mut config = ClientConfig::new(vec![format!("redis://127.0.0.1:{port}")]);
    config.deadline = Duration::from_millis(300);
    let err = QuorumClient::connect(config)
        .await
        .err()
        .expect("nothing listens there");
    let msg = err.to_string();
    assert!(matches!(err, IdError::NoQuorum { .. }), "{msg}");
    assert!(
        msg.contains(&port.to_string()) && msg.contains("refused"),
        "{msg}"
    );

    for bad in [
        "http://127.0.0.1:1",
        "127.0.0.1:6379",
        "redis://",
        "redis://host:notaport",
    ] {
        let err = QuorumClient::connect(ClientConfig::new(vec![bad.to_string()]))
            .await
            .err()
            .expect(bad);
        assert!(matches!(err, IdError::Config(_)), "{bad}: {err}");
        assert!(err.to_string().contains("bad node URL"), "{bad}: {err}");
    }

    let q = test_quorum(3);
    let mut urls = q.urls();
    urls.pop();
    let err = QuorumClient::connect(ClientConfig::new(urls))
        .await
        .err()
        .expect("even count");
    assert!(err.to_string().contains("must be odd"), "{err}");
}

#[tokio::test]
async fn zero_and_huge_counts_are_bad_requests() {
    let q = test_quorum(3);
    let c = client(&q, Protocol::Fast).await;
    assert!(matches!(c.next_ids(0).await, Err(IdError::BadRequest(_))));
    assert!(matches!(
        c.next_ids(idclient::MAX_COUNT + 1).await,
        Err(IdError::BadRequest(_))
    ));
}

#[tokio::test]
async fn every_durability_setting_is_checked() {
    for (setting, value) in [
        ("appendonly", "no"),
        ("no-appendfsync-on-rewrite", "yes"),
        ("maxmemory-policy", "allkeys-lru"),
    ] {
        let q = LocalQuorum::temp_with_args(1, &[format!("--{setting}"), value.into()])
            .expect("start redis");
        let err = QuorumClient::connect(ClientConfig::new(q.urls()))
            .await
            .err()
            .unwrap_or_else(|| panic!("{setting} {value} accepted"));
        let msg = err.to_string();
        assert!(matches!(err, IdError::UnsafeNode { .. }), "{msg}");
        assert!(
            msg.contains(&format!("{setting} is \"{value}\"")),
            "{setting}: {msg}"
        );
    }
}

/// Runs one command on every node in `urls`.
async fn on_all(urls: &[String], args: &[&str]) {
    for url in urls {
        node_command(url, args).await;
    }
}

#[tokio::test]
async fn durability_is_checked_again_on_reconnect() {
    let q = test_quorum(3);
    let c = client(&q, Protocol::Fast).await;
    c.next_id().await.expect("id");
    // Two nodes turn unsafe while connected, then drop every client connection: the
    // client reconnects, checks again and refuses them.
    let unsafe_urls = &q.urls()[..2];
    on_all(unsafe_urls, &["CONFIG", "SET", "appendfsync", "everysec"]).await;
    on_all(unsafe_urls, &["CLIENT", "KILL", "TYPE", "normal"]).await;
    let err = loop {
        // The first rounds may only see broken connections; the reconnects that follow
        // see the unsafe setting.
        match c.next_id().await {
            Err(e) if e.to_string().contains("unsafe") => break e,
            Err(_) => {}
            Ok(id) => panic!("an ID ({id}) from a quorum with two unsafe nodes of three"),
        }
    };
    let msg = err.to_string();
    assert!(matches!(err, IdError::NoQuorum { .. }), "{msg}");
    assert!(msg.contains("unsafe: appendfsync is \"everysec\""), "{msg}");
}

#[tokio::test]
async fn combining_stops_after_a_streak_of_solo_batches() {
    // One node: its reply (with the hint) always decides the round, never arrives late.
    let q = test_quorum(1);
    let c = client(&q, Protocol::Fast).await;
    assert_eq!(c.counters().batches, 0);
    // A batch in flight at the rendezvous (smallest URL) tells the next writer it is not
    // alone, so it starts combining.
    let rendezvous = q.urls().into_iter().min().expect("nodes");
    let busy = idclient::Nonce::random().to_string();
    on_all(
        &[rendezvous],
        &["SET", "current:inflight", &busy, "PX", "200"],
    )
    .await;
    c.next_id().await.expect("id");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Nobody else is there: every request is a solo batch, and after the streak the
    // client goes back to plain rounds.
    for _ in 0..3 * idclient::SOLO_STREAK {
        c.next_id().await.expect("id");
    }
    assert_eq!(
        c.counters().batches,
        u64::from(idclient::SOLO_STREAK),
        "{:?}",
        c.counters()
    );
}

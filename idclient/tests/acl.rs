//! Redis ACL users on real redis-server processes: a user given exactly the ACL that
//! docs/operations-redis.md documents gets IDs on every path (fast, classic, combined)
//! and is denied nothing (the nodes' ACL LOG stays empty); a user missing one permission
//! gets an error that names it.

use idclient::{ClientConfig, Combine, IdError, IdSource, Protocol, QuorumClient};
use idtools::bench;
use idtools::cluster::{node_command, test_quorum, LocalQuorum};
use std::time::Duration;
use tokio::time::Instant;

const USER: &str = "qlist";
const PASSWORD: &str = "acl-test-s3cret";
/// Time for one write round: ample, the nodes answer at once.
const ROUND: Duration = Duration::from_secs(5);

/// The `ACL SETUSER qlist ...` line of docs/operations-redis.md, as arguments, with the
/// password placeholder filled in: the test runs what the documentation says.
fn documented_acl() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations-redis.md");
    let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let line = doc
        .lines()
        .find(|l| l.trim_start().starts_with("ACL SETUSER qlist "))
        .unwrap_or_else(|| panic!("{path} has no `ACL SETUSER qlist ...` line"));
    let args: Vec<String> = line
        .split_whitespace()
        .map(|w| w.replace(">PASSWORD", &format!(">{PASSWORD}")))
        .collect();
    assert!(
        args.iter().any(|a| a == &format!(">{PASSWORD}")),
        "{line}: no >PASSWORD placeholder"
    );
    args
}

/// Runs one command as the default (unrestricted) user on node `i`.
async fn admin(q: &LocalQuorum, i: usize, args: &[String]) -> redis::Value {
    node_command(&q.urls()[i], args).await
}

/// Creates the user on every node with the documented ACL, `but` a permission rule
/// appended (e.g. `-config|get`), and clears the ACL LOG.
async fn create_user(q: &LocalQuorum, but: Option<&str>) {
    let mut acl = documented_acl();
    acl.extend(but.map(String::from));
    for i in 0..q.len() {
        admin(q, i, &acl).await;
        admin(q, i, &["ACL".into(), "LOG".into(), "RESET".into()]).await;
    }
}

fn config(q: &LocalQuorum) -> ClientConfig {
    let urls = q
        .ports()
        .iter()
        .map(|p| format!("redis://{USER}:{PASSWORD}@127.0.0.1:{p}"))
        .collect();
    let mut c = ClientConfig::new(urls);
    c.connect_timeout = Duration::from_secs(2);
    c.reply_timeout = Duration::from_secs(2);
    c
}

/// What node `i` denied the user since the log was reset, as (reason, object) pairs.
async fn denials(q: &LocalQuorum, i: usize) -> Vec<String> {
    let log = admin(q, i, &["ACL".into(), "LOG".into()]).await;
    let redis::Value::Array(entries) = log else {
        panic!("ACL LOG reply {log:?}")
    };
    entries.iter().map(|e| format!("{e:?}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_is_enough_on_every_path() {
    let q = test_quorum(3);
    create_user(&q, None).await;
    let mut last = 0;
    for protocol in [Protocol::Fast, Protocol::Classic] {
        let mut c = config(&q);
        c.protocol = protocol;
        let client = QuorumClient::connect(c).await.expect("connect as qlist");
        for _ in 0..20 {
            let r = client.next_ids(2).await.expect("IDs as qlist");
            assert!(r.lo > last, "{r:?} after {last}");
            last = r.hi;
        }
    }
    bench::assert_combining_run(&config(&q), 6, Duration::from_millis(800)).await;
    for i in 0..q.len() {
        let denied = denials(&q, i).await;
        assert!(
            denied.is_empty(),
            "node {i} denied the qlist user: {denied:?}"
        );
    }
}

/// Connects as a user missing `rule`, and if that works asks for an ID as any caller
/// does (retrying lost rounds until the deadline; should the last round be cut short by
/// the deadline, it keeps the cause the earlier rounds saw: quorum/tests.rs unit test
/// `a_round_cut_by_the_deadline_keeps_the_earlier_cause`). The error, which must say it
/// is the ACL and never show the password.
async fn error_without(rule: &str) -> String {
    let q = test_quorum(3);
    create_user(&q, Some(rule)).await;
    let msg = match QuorumClient::connect(config(&q)).await {
        Err(e) => e.to_string(),
        Ok(client) => match client.next_ids_until(1, Instant::now() + ROUND).await {
            Err(e) => e.to_string(),
            Ok(r) => panic!("a user with {rule} got IDs {r:?}"),
        },
    };
    assert!(!msg.contains(PASSWORD), "{msg} shows the password");
    assert!(
        msg.contains("Redis ACL"),
        "{msg}: does not say it is the ACL"
    );
    msg
}

#[tokio::test]
async fn a_user_without_config_get_is_told_so() {
    let msg = error_without("-config|get").await;
    assert!(msg.contains("'config|get'"), "{msg}");
    assert!(msg.contains("cannot verify durability"), "{msg}");
}

#[tokio::test]
async fn a_user_without_info_is_told_so() {
    let msg = error_without("-info").await;
    assert!(msg.contains("'info'"), "{msg}");
}

#[tokio::test]
async fn a_user_without_evalsha_is_told_so() {
    let msg = error_without("-evalsha").await;
    assert!(msg.contains("'evalsha'"), "{msg}");
}

#[tokio::test]
async fn a_command_the_script_runs_is_named_when_denied() {
    // TYPE is the conditional-write script's first command: Redis says only "can't run
    // this command" and the script line; the error names the command from that line.
    let msg = error_without("-type").await;
    assert!(msg.contains("denies TYPE"), "{msg}");
}

#[tokio::test]
async fn a_key_outside_the_pattern_is_denied_clearly() {
    let q = test_quorum(3);
    create_user(&q, None).await;
    let mut c = config(&q);
    c.key = "elsewhere".to_string();
    let client = QuorumClient::connect(c).await.expect("connect as qlist");
    let e = client
        .reserve(1, 1, Instant::now() + ROUND)
        .await
        .expect_err("a key outside ~current");
    let msg = e.to_string();
    assert!(matches!(e, IdError::NoQuorum { .. }), "{msg}");
    assert!(msg.contains("Redis ACL"), "{msg}");
    assert!(msg.contains("keys"), "{msg}");
    assert!(!msg.contains(PASSWORD), "{msg} shows the password");
}

#[tokio::test]
async fn a_denied_rendezvous_costs_speed_not_ids() {
    for rule in ["-subscribe", "-publish"] {
        let q = test_quorum(3);
        create_user(&q, Some(rule)).await;
        let mut c = config(&q);
        c.combine = Combine::Always;
        let client = QuorumClient::connect(c).await.expect("connect as qlist");
        let mut last = 0;
        for _ in 0..5 {
            let r = client
                .next_ids(1)
                .await
                .unwrap_or_else(|e| panic!("{rule}: {e}"));
            assert!(r.lo > last, "{rule}: {r:?} after {last}");
            last = r.hi;
        }
    }
}

//! A quorum's nodes must be independent servers: the same server listed twice (as
//! written, or under two names) and replicas are refused, by the client and by
//! `idctl check`; a master with replicas gets a warning. Real redis-server processes.

mod common;
use common::{idctl, text};
use idclient::{ClientConfig, IdError, QuorumClient};
use idtools::cluster::{test_quorum, LocalQuorum};
use std::time::{Duration, Instant};

async fn connect(urls: Vec<String>) -> Result<QuorumClient, IdError> {
    let mut config = ClientConfig::new(urls);
    config.deadline = Duration::from_secs(2);
    QuorumClient::connect(config).await
}

#[track_caller]
fn config_error(result: Result<QuorumClient, IdError>) -> String {
    match result {
        Err(e @ IdError::Config(_)) => e.to_string(),
        Err(e) => panic!("expected a configuration error, got {e}"),
        Ok(_) => panic!("a quorum of dependent nodes was accepted"),
    }
}

#[tokio::test]
async fn one_server_listed_three_times_is_refused() {
    let q = test_quorum(3);
    let u = q.urls();
    let urls = vec![
        u[0].clone(),
        u[0].clone(),
        u[0].clone(),
        u[1].clone(),
        u[2].clone(),
    ];
    let err = config_error(connect(urls.clone()).await);
    assert!(
        err.contains(&format!("node {} is listed more than once", u[0])),
        "{err}"
    );

    let check = idctl(&["check", "--nodes", &urls.join(",")]);
    assert!(!check.status.success(), "{}", text(&check));
    let out = text(&check);
    assert_eq!(
        out.matches("DUPLICATE: the same Redis server as").count(),
        2,
        "{out}"
    );
}

#[tokio::test]
async fn one_server_under_two_names_is_refused() {
    let q = test_quorum(3);
    let u = q.urls();
    // Another database of the same server: another name, the same process to crash.
    let alias = format!("{}/1", u[0]);
    let err = config_error(connect(vec![u[0].clone(), alias.clone(), u[1].clone()]).await);
    assert!(err.contains("is the same Redis server as node"), "{err}");
    assert!(err.contains(&u[0]) && err.contains(&alias), "{err}");

    let check = idctl(&["check", "--nodes", &format!("{},{alias},{}", u[0], u[1])]);
    assert!(!check.status.success(), "{}", text(&check));
    let out = text(&check);
    assert!(
        out.contains(&format!(
            "{alias}: DUPLICATE: the same Redis server as {}",
            u[0]
        )),
        "{out}"
    );

    // The same server by another name: "127.1", which the resolver reads as 127.0.0.1
    // without /etc/hosts or DNS (a bare Debian root has no /etc/hosts, so "localhost"
    // would test the machine, not the client).
    let by_name = u[0].replace("127.0.0.1", "127.1");
    let err = config_error(connect(vec![u[0].clone(), u[1].clone(), by_name.clone()]).await);
    assert!(
        err.contains(&format!(
            "node {by_name} is the same Redis server as node {}",
            u[0]
        )) || err.contains(&format!(
            "node {} is the same Redis server as node {by_name}",
            u[0]
        )),
        "{err}"
    );

    // Three distinct servers are fine.
    connect(u).await.expect("three independent nodes");
}

/// Makes node 0 of `replica` a replica of node 0 of `master`, and waits until the master
/// sees it.
async fn replicate(master: &LocalQuorum, replica: &LocalQuorum) {
    let conn = |url: String| async move {
        redis::Client::open(url.as_str())
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect")
    };
    let mut r = conn(replica.urls()[0].clone()).await;
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.ports()[0])
        .query_async::<()>(&mut r)
        .await
        .expect("REPLICAOF");
    let mut m = conn(master.urls()[0].clone()).await;
    let started = Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut m)
            .await
            .expect("INFO");
        if info.contains("connected_slaves:1") {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the replica never connected: {info}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_replica_is_refused_and_its_master_warned_about() {
    let q = test_quorum(3);
    let replica = test_quorum(1);
    replicate(&q, &replica).await;
    let u = q.urls();
    let r = replica.urls()[0].clone();

    let err = config_error(connect(vec![u[1].clone(), u[2].clone(), r.clone()]).await);
    assert!(err.contains(&format!("node {r} is a replica")), "{err}");

    let check = idctl(&["check", "--nodes", &format!("{},{},{r}", u[0], u[1])]);
    assert!(!check.status.success(), "{}", text(&check));
    let out = text(&check);
    assert!(
        out.contains(&format!("{r}: REFUSED: it is a replica")),
        "{out}"
    );
    assert!(
        out.contains(&format!("{}: WARNING: 1 connected replica(s)", u[0])),
        "{out}"
    );
    assert!(out.contains(&format!("{}: ok", u[1])), "{out}");

    // The master itself is still a node (with the warning above).
    connect(u)
        .await
        .expect("masters with replicas are accepted");
}

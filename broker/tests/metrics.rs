//! `idbroker --metrics-listen`, end to end: a real Prometheus server scrapes a real
//! broker (over a real redis-server quorum) under load, its query API returns the
//! counters, `promtool check metrics` accepts the exposition, node passwords never
//! appear in it, and `/readyz` follows the quorum. Needs Debian's `prometheus` package
//! (`prometheus` and `promtool`; scripts/deps.sh installs it).

use idclient::broker_client::{BrokerClient, BrokerClientConfig};
use idclient::IdSource;
use idtools::announced::{Announced, START_TIMEOUT};
use idtools::cluster::test_quorum;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use testkit::prometheus::Prometheus;

const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// An idbroker process with its metrics endpoint, killed (by its pid) on drop.
struct Broker {
    _proc: Announced,
    addr: String,
    metrics: String,
}

impl Broker {
    fn start(nodes: &str, extra: &[&str]) -> Broker {
        let proc = Announced::start(
            Command::new(env!("CARGO_BIN_EXE_idbroker"))
                .args(["--listen", "127.0.0.1:0", "--nodes", nodes])
                .args(["--metrics-listen", "127.0.0.1:0"])
                .args(extra)
                .stderr(Stdio::inherit()),
            &["listening on ", "metrics listening on "],
            START_TIMEOUT,
        )
        .expect("idbroker starts with its metrics endpoint");
        Broker {
            addr: proc.addr().to_string(),
            metrics: proc.value(1).to_string(),
            _proc: proc,
        }
    }

    async fn get(&self, path: &str) -> (u16, String) {
        qmetrics::get(&self.metrics, path, HTTP_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Asks `broker` for IDs from a few callers until `stop`.
async fn load(addr: String, stop: Arc<AtomicBool>) -> u64 {
    let config = BrokerClientConfig {
        deadline: Duration::from_secs(5),
        ..Default::default()
    };
    let client = Arc::new(
        BrokerClient::connect(vec![addr], config)
            .await
            .expect("connect to broker"),
    );
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let (client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                let mut got = 0;
                while !stop.load(Relaxed) {
                    if client.next_ids(3).await.is_ok() {
                        got += 3;
                    }
                }
                got
            })
        })
        .collect();
    let mut total = 0;
    for c in callers {
        total += c.await.expect("caller task");
    }
    total
}

fn promtool_check(exposition: &str) {
    if let Err(e) = qmetrics::promtool_check(exposition) {
        panic!("{e}");
    }
}

/// Every sample line `name{...} value` of `exposition` whose name is `name`.
fn samples<'a>(exposition: &'a str, name: &'a str) -> impl Iterator<Item = &'a str> {
    exposition
        .lines()
        .filter(move |l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_a_broker_under_load() {
    let quorum = test_quorum(3);
    let broker = Broker::start(&quorum.urls_arg(), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let loader = tokio::spawn(load(broker.addr.clone(), stop.clone()));
    let mut prometheus = Prometheus::start("idbroker", &broker.metrics);

    let mut ids = None;
    for _ in 0..120 {
        ids = prometheus.query("qlist_broker_ids_total").await;
        if ids.is_some_and(|v| v > 0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ids = ids.unwrap_or_else(|| {
        panic!(
            "Prometheus never returned qlist_broker_ids_total > 0 within 60 s:\n{}",
            prometheus.log()
        )
    });
    assert!(ids > 0.0, "qlist_broker_ids_total = {ids}");
    let ok = prometheus
        .query("qlist_broker_requests_total%7Boutcome%3D%22ok%22%7D")
        .await
        .expect("the ok requests series");
    assert!(ok > 0.0, "requests ok = {ok}");
    let up = prometheus.query("up%7Bjob%3D%22idbroker%22%7D").await;
    assert_eq!(up, Some(1.0), "the target is up");

    let (status, exposition) = broker.get("/metrics").await;
    assert_eq!(status, 200);
    promtool_check(&exposition);
    for name in [
        "qlist_broker_round_duration_seconds_count",
        "qlist_broker_confirmation_duration_seconds_count",
        "qlist_broker_batch_size_count",
    ] {
        let line = samples(&exposition, name)
            .next()
            .unwrap_or_else(|| panic!("{name} missing"));
        let n: u64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a count");
        assert!(n > 0, "{line}: nothing recorded under load");
    }
    assert_eq!(
        samples(&exposition, "qlist_broker_node_errors_total").count(),
        3
    );
    assert_eq!(broker.get("/healthz").await, (200, "ok\n".to_string()));
    assert_eq!(broker.get("/readyz").await, (200, "ready\n".to_string()));

    stop.store(true, Relaxed);
    assert!(loader.await.expect("load task") > 0);
}

const PASSWORD: &str = "Pw-metrics-4b1e-do-not-print";

fn require_password(port: u16) {
    let out = Command::new("redis-cli")
        .args([
            "-p",
            &port.to_string(),
            "CONFIG",
            "SET",
            "requirepass",
            PASSWORD,
        ])
        .output()
        .expect("run redis-cli (Debian package redis-tools)");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "OK",
        "CONFIG SET requirepass on port {port}: {out:?}"
    );
}

fn assert_no_password(what: &str, text: &str) {
    assert!(
        !text.contains(PASSWORD),
        "{what} shows the node password:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_label_nodes_by_host_and_port_never_a_password_and_readyz_follows_the_quorum() {
    let mut quorum = test_quorum(3);
    let ports = quorum.ports();
    for &p in &ports {
        require_password(p);
    }
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("redis://:{PASSWORD}@127.0.0.1:{p}/0"))
        .collect();
    let broker = Broker::start(&urls.join(","), &["--serve", "rounds"]);
    let client = BrokerClient::connect(vec![broker.addr.clone()], BrokerClientConfig::default())
        .await
        .expect("connect");
    client.next_ids(1).await.expect("IDs with the password");
    assert_eq!(broker.get("/readyz").await, (200, "ready\n".to_string()));

    // Two of three nodes gone: no quorum, errors counted on their labels.
    quorum.kill(1);
    quorum.kill(2);
    let _ = client.next_ids(1).await.expect_err("no quorum");
    let mut not_ready = None;
    for _ in 0..60 {
        let (status, body) = broker.get("/readyz").await;
        if status == 503 {
            not_ready = Some(body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let body = not_ready.expect("/readyz stayed 200 for 30 s without a quorum");
    assert!(body.starts_with("not ready: no quorum reachable"), "{body}");
    assert_eq!(body.lines().count(), 1, "{body}");
    assert_no_password("/readyz", &body);

    let (_, exposition) = broker.get("/metrics").await;
    assert_no_password("/metrics", &exposition);
    promtool_check(&exposition);
    for &p in &ports {
        let label = format!("{{node=\"127.0.0.1:{p}\"}}");
        assert!(
            samples(&exposition, "qlist_broker_node_errors_total").any(|l| l.contains(&label)),
            "no node_errors series for {label}:\n{exposition}"
        );
    }
    let failed: u64 = samples(&exposition, "qlist_broker_node_errors_total")
        .chain(samples(&exposition, "qlist_broker_node_timeouts_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        failed > 0,
        "the dead nodes' failures were not counted:\n{exposition}"
    );
    let failed_requests = samples(&exposition, "qlist_broker_requests_total")
        .find_map(|l| l.strip_prefix("qlist_broker_requests_total{outcome=\"failed\"} "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(failed_requests.is_some_and(|n| n >= 1), "{exposition}");
}

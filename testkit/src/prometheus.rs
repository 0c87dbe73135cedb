//! A real Prometheus server (Debian package `prometheus`) scraping one target every
//! second, with its data in a temp dir and stopped by its pid on drop: the check that
//! what `/metrics` serves is what Prometheus itself parses and scrapes.

use crate::http::http;
use crate::ChildGuard;
use std::process::{Command, Stdio};

/// A Prometheus server under test; see the module.
pub struct Prometheus {
    child: ChildGuard,
    addr: String,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts `prometheus` on a free loopback port, scraping `target` (`host:port`) as
    /// job `job` every second (timeout 1 s, rules evaluated every second).
    ///
    /// # Panics
    /// If `prometheus` cannot be started: the message says to run `scripts/deps.sh`.
    pub fn start(job: &str, target: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = ChildGuard::spawn(
            "prometheus (Debian package prometheus; run scripts/deps.sh)",
            Command::new("prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdout(Stdio::null())
                .stderr(log),
        );
        Prometheus { child, addr, dir }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The value of the first series `query` (URL-encoded) returns, once Prometheus
    /// answers it: `None` while it does not (not up yet, no such series yet).
    ///
    /// # Panics
    /// If Prometheus has exited (the message has its log), or answers with an error.
    pub async fn query(&mut self, query: &str) -> Option<f64> {
        if let Some(status) = self.child.try_wait() {
            panic!("prometheus exited ({status}):\n{}", self.log());
        }
        let addr = self.addr.clone();
        let path = format!("/api/v1/query?query={query}");
        let response = tokio::task::spawn_blocking(move || http(&addr, "GET", &path, &[]))
            .await
            .expect("the query thread")
            .ok()?;
        if response.status != 200 {
            return None;
        }
        let body = String::from_utf8_lossy(&response.body);
        let json: serde_json::Value = serde_json::from_str(&body).expect("query API JSON");
        assert_eq!(json["status"], "success", "{body}");
        json["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }
}

//! Test brokers: an `idbroker` binary on free loopback ports ([`TestBroker`], an
//! [`Announced`] child stopped by its pid on drop), waiting for brokers to settle, and
//! startup refusals.

use idtools::announced::{Announced, START_TIMEOUT};
use idtools::cluster::LocalQuorum;
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// An `idbroker` under test: a binary and a RESP listener on free loopback ports (and a
/// metrics listener if asked for), its stderr kept in a file ([`TestBroker::stderr`];
/// printed if the test panics while it runs), killed by its pid on drop. One harness for
/// the broker's real-process tests.
pub struct TestBroker {
    /// The process (signals, pid, stop).
    pub proc: Announced,
    /// `host:port` of the binary listener.
    pub addr: String,
    /// `host:port` of the RESP listener.
    pub resp: String,
    /// `host:port` of the metrics listener ([`TestBroker::start_with_metrics`]).
    pub metrics: Option<String>,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl TestBroker {
    /// Starts `bin` (a test's `env!("CARGO_BIN_EXE_idbroker")`) with `--listen
    /// 127.0.0.1:0 --resp-listen 127.0.0.1:0 --nodes NODES`, with `--auth-token-file` of a
    /// file (mode 0600) holding `token` if given, then `args`; waits until it announces
    /// both listeners.
    ///
    /// # Panics
    /// If it does not start within [`START_TIMEOUT`]: the message has its stderr.
    pub fn start<A: AsRef<OsStr>>(
        bin: &str,
        nodes: &str,
        token: Option<&str>,
        args: &[A],
    ) -> TestBroker {
        TestBroker::spawn(bin, nodes, token, args, false)
    }

    /// [`TestBroker::start`] on the nodes of `quorum`, without a token.
    ///
    /// # Panics
    /// As [`TestBroker::start`].
    pub fn on<A: AsRef<OsStr>>(bin: &str, quorum: &LocalQuorum, args: &[A]) -> TestBroker {
        TestBroker::start(bin, &quorum.urls_arg(), None, args)
    }

    /// As [`TestBroker::start`], with `--metrics-listen 127.0.0.1:0` too (before `args`);
    /// waits for all three listeners.
    ///
    /// # Panics
    /// As [`TestBroker::start`].
    pub fn start_with_metrics<A: AsRef<OsStr>>(
        bin: &str,
        nodes: &str,
        token: Option<&str>,
        args: &[A],
    ) -> TestBroker {
        TestBroker::spawn(bin, nodes, token, args, true)
    }

    fn spawn<A: AsRef<OsStr>>(
        bin: &str,
        nodes: &str,
        token: Option<&str>,
        args: &[A],
        metrics: bool,
    ) -> TestBroker {
        let dir = tempfile::tempdir().expect("temp dir");
        let stderr = dir.path().join("stderr");
        let mut cmd = Command::new(bin);
        let mut listeners = vec!["listening on ", "resp listening on "];
        cmd.args(["--listen", "127.0.0.1:0", "--resp-listen", "127.0.0.1:0"]);
        if metrics {
            cmd.args(["--metrics-listen", "127.0.0.1:0"]);
            listeners.push("metrics listening on ");
        }
        cmd.args(["--nodes", nodes]);
        if let Some(token) = token {
            let path = dir.path().join("token");
            std::fs::write(&path, token).expect("write token file");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .expect("chmod token file");
            cmd.arg("--auth-token-file").arg(path);
        }
        cmd.args(args)
            .stderr(std::fs::File::create(&stderr).expect("stderr file"));
        let proc = Announced::start(&mut cmd, &listeners, START_TIMEOUT).unwrap_or_else(|e| {
            let log = std::fs::read_to_string(&stderr).unwrap_or_default();
            panic!("idbroker did not start: {e}: {log}")
        });
        TestBroker {
            addr: proc.addr().to_string(),
            resp: proc.value(1).to_string(),
            metrics: metrics.then(|| proc.value(2).to_string()),
            proc,
            stderr,
            _dir: dir,
        }
    }

    /// What it wrote on stderr so far.
    ///
    /// # Panics
    /// If the file cannot be read.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).expect("idbroker stderr")
    }
}

/// Polls `brokers[i]` for each `i` in `alive` (with `token` if they require one) until
/// one leads and every other one follows it in its term, for at most `limit`
/// ([`idtools::failover::wait_settled`]): the leader's index.
///
/// # Panics
/// If they do not settle in time: the message has each one's role and term.
pub async fn wait_settled(
    brokers: &[TestBroker],
    alive: &[usize],
    token: Option<&idclient::Token>,
    limit: Duration,
) -> usize {
    let views: Vec<_> = alive
        .iter()
        .map(|&i| (i, brokers[i].addr.as_str()))
        .collect();
    idtools::failover::wait_settled(&views, token, limit)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `bin` (a test's `env!("CARGO_BIN_EXE_idbroker")`) with `--listen 127.0.0.1:0
/// --nodes redis://127.0.0.1:1` and `args`, which it must refuse before serving: a usage
/// error (exit code 2) with nothing on stdout. Its stderr, which says why.
///
/// # Panics
/// If it cannot run, or exits otherwise.
#[track_caller]
pub fn refused_at_startup<A: AsRef<OsStr>>(bin: &str, args: &[A]) -> String {
    let out = Command::new(bin)
        .args(["--listen", "127.0.0.1:0", "--nodes", "redis://127.0.0.1:1"])
        .args(args)
        .output()
        .expect("run idbroker");
    crate::assert_exit(&out, 2, "");
    assert!(out.stdout.is_empty(), "{}", crate::printed(&out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.stderr).unwrap_or_default();
            eprintln!("--- stderr of idbroker {} ---\n{log}", self.addr);
        }
    }
}

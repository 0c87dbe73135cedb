//! Child processes that announce where they listen on stdout, as `idbroker` does
//! (`listening on ADDR`, then `resp listening on ADDR`, `metrics listening on ADDR`):
//! started, waited for with a timeout, and stopped by their own pid when dropped (the one
//! guard, [`ChildGuard`]: SIGTERM, a grace, SIGKILL).
//!
//! One place for what every real-process test and `idctl failover` need: stdout is read
//! on a thread (a process that never prints cannot block the caller past the timeout)
//! and drained for the process's lifetime (a full pipe would stall it).

use std::io::{BufRead, BufReader};
use std::process::{ChildStderr, Command, ExitStatus, Stdio};

use crate::child::ChildGuard;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a broker may take to announce itself by default: a `--serve window` broker
/// prints `listening on` only once it leads or knows the leader.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A started process and the values of the lines it announced, stopped by its pid and
/// reaped on drop ([`ChildGuard`]) unless it has been waited for.
pub struct Announced {
    child: ChildGuard,
    pid: u32,
    /// Kept apart from the guard, which gives up the child when it reaps it: stderr can be
    /// read after [`Announced::wait`].
    stderr: Option<ChildStderr>,
    values: Vec<String>,
}

impl Announced {
    /// Spawns `cmd` with stdout piped and waits until, for each of `prefixes`, a line
    /// starting with it was printed (in any order); the rest of each such line is its
    /// value ([`Announced::value`], in `prefixes` order).
    ///
    /// # Errors
    /// The process cannot be spawned, or ends, or has not printed every prefix within
    /// `timeout`: it is then killed, and the error says what it printed and its exit
    /// status.
    pub fn start(
        cmd: &mut Command,
        prefixes: &[&str],
        timeout: Duration,
    ) -> anyhow::Result<Announced> {
        let program = cmd.get_program().to_string_lossy().into_owned();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start {program}: {e}"))?;
        let stdout = child.stdout.take();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let Some(out) = stdout else { return };
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                // Once the caller stopped listening, keep draining the pipe.
                let _ = tx.send(line);
            }
        });
        let mut started = Announced {
            pid: child.id(),
            stderr: child.stderr.take(),
            child: ChildGuard::new(program.clone(), child),
            values: vec![String::new(); prefixes.len()],
        };
        let mut found = vec![false; prefixes.len()];
        let mut said = Vec::new();
        let until = Instant::now() + timeout;
        while found.iter().any(|f| !f) {
            let left = until.saturating_duration_since(Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                let status = started.kill();
                anyhow::bail!(
                    "{program} did not announce {prefixes:?} within {timeout:?} (said {said:?}; \
                     exit {status:?})"
                );
            };
            for (i, prefix) in prefixes.iter().enumerate() {
                if !found[i] {
                    if let Some(value) = line.trim().strip_prefix(prefix) {
                        started.values[i] = value.to_string();
                        found[i] = true;
                        break;
                    }
                }
            }
            said.push(line);
        }
        Ok(started)
    }

    /// The value announced after `prefixes[i]`.
    ///
    /// # Panics
    /// If `i` is not an index of the prefixes given to [`Announced::start`].
    pub fn value(&self, i: usize) -> &str {
        &self.values[i]
    }

    /// The first announced value: the address of `listening on ADDR`.
    pub fn addr(&self) -> &str {
        self.value(0)
    }

    /// The process id (also once it was reaped: for messages).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `sig` to the process (by its pid).
    ///
    /// # Panics
    /// If the process has been reaped (a bug in the caller).
    pub fn signal(&self, sig: libc::c_int) {
        assert!(
            self.child.pid().is_some(),
            "signal {sig} to a process already reaped"
        );
        self.child.signal(sig);
    }

    /// kill -9 and reap; the exit status, if it could be had.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        self.child.kill()
    }

    /// The process's stderr, if the command piped it (read it after the process ended,
    /// or concurrently: an unread pipe stalls a process that writes much).
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.stderr.take()
    }

    /// Everything the process wrote on its stderr (which the command piped), read to its
    /// end: call it once the process has ended, or it waits until then.
    ///
    /// # Panics
    /// If stderr was not piped or was taken before, or reading it fails.
    pub fn read_stderr(&mut self) -> String {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut self.take_stderr().expect("a piped stderr"), &mut text)
            .expect("read stderr");
        text
    }

    /// Whether the process has ended, without waiting (`None` while it runs, or once it was
    /// reaped before).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait()
    }

    /// Waits for the process to end (after a signal the caller sent).
    ///
    /// # Panics
    /// If it was reaped before, or wait(2) fails.
    pub fn wait(&mut self) -> ExitStatus {
        self.child.wait()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        cmd
    }

    #[test]
    fn values_come_in_prefix_order_whatever_the_line_order() {
        let p = Announced::start(
            &mut sh(
                "echo noise; echo 'resp listening on b:2'; echo 'listening on a:1'; exec sleep 30",
            ),
            &["listening on ", "resp listening on "],
            Duration::from_secs(10),
        )
        .expect("announced");
        assert_eq!((p.addr(), p.value(1)), ("a:1", "b:2"));
    }

    #[test]
    fn a_process_that_exits_silently_is_an_error_naming_what_it_said() {
        let err = Announced::start(
            &mut sh("echo 'bad flag'; exit 2"),
            &["listening on "],
            Duration::from_secs(10),
        )
        .err()
        .expect("no announcement");
        let msg = err.to_string();
        assert!(msg.contains("bad flag") && msg.contains("exit"), "{msg}");
    }

    #[test]
    fn a_process_that_never_announces_is_killed_at_the_timeout() {
        let err = Announced::start(
            &mut sh("exec sleep 30"),
            &["listening on "],
            Duration::from_millis(200),
        )
        .err()
        .expect("no announcement");
        assert!(err.to_string().contains("did not announce"), "{err}");
    }
}

//! The one child-process guard, of the tests (testkit re-exports it) and of `idctl`'s
//! brokers ([`crate::announced::Announced`] holds one): a process stopped by its own pid
//! when the guard drops (SIGTERM, a grace to end, then SIGKILL) and always reaped, so that
//! a failing test or a stopped tool leaves none behind and no signal ever reaches another
//! process by name.

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How long a dropped [`ChildGuard`] waits after SIGTERM before SIGKILL, unless the test
/// set another ([`ChildGuard::grace`]): the servers the tests start (redis-server,
/// idbroker, producer, prometheus) end within milliseconds of SIGTERM; one that does not
/// is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// A child process, named for messages, stopped (SIGTERM, then SIGKILL after a grace,
/// by its pid) and reaped on drop; [`ChildGuard::kill`] is the crash (SIGKILL at once).
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
    grace: Duration,
}

impl ChildGuard {
    /// Spawns `cmd`, naming it for messages.
    ///
    /// # Panics
    /// If it cannot be spawned: the message names it.
    pub fn spawn(name: impl Into<String>, cmd: &mut Command) -> ChildGuard {
        let name = name.into();
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        ChildGuard::new(name, child)
    }

    /// Guards a child spawned by the caller.
    pub fn new(name: impl Into<String>, child: Child) -> ChildGuard {
        ChildGuard {
            name: name.into(),
            child: Some(child),
            grace: STOP_GRACE,
        }
    }

    /// The same guard with another grace between SIGTERM and SIGKILL when it stops.
    pub fn grace(mut self, grace: Duration) -> ChildGuard {
        self.grace = grace;
        self
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pid while the process has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The child itself (to take its pipes), while it has not been reaped.
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// Gives the process up unstopped: it outlives the guard (as the nodes `idctl cluster
    /// up` starts outlive the command). The child, `None` if it was reaped.
    pub fn release(mut self) -> Option<Child> {
        self.child.take()
    }

    /// Sends `sig` to the process, by its pid; nothing once it has been reaped (the pid
    /// may belong to another process by then).
    pub fn signal(&self, sig: libc::c_int) {
        if let Some(pid) = self.pid() {
            let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
            // SAFETY: kill(2) on the pid of a child we spawned and have not reaped.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    /// SIGKILL (by pid) and reap: a crash. The exit status, if it was still ours.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let _ = child.kill();
        child.wait().ok()
    }

    /// SIGTERM (and SIGCONT, so that a process a test paused with SIGSTOP can act on it),
    /// up to the grace for it to end, then SIGKILL; reaped either way. The exit status, if
    /// it was still ours.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.signal(libc::SIGTERM);
        self.signal(libc::SIGCONT);
        let until = Instant::now() + self.grace;
        let mut pause = Duration::from_millis(1);
        while Instant::now() < until {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            self.child.as_ref()?;
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        self.kill()
    }

    /// The exit status if the process has ended (it is then reaped), `None` while it runs
    /// or once it was reaped before.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten();
        if status.is_some() {
            self.child = None;
        }
        status
    }

    /// Waits for the process to end (on its own or after a signal the caller sent).
    ///
    /// # Panics
    /// If it was reaped before, or wait(2) fails.
    pub fn wait(&mut self) -> ExitStatus {
        let name = &self.name;
        let mut child = self
            .child
            .take()
            .unwrap_or_else(|| panic!("{name} was reaped before"));
        child
            .wait()
            .unwrap_or_else(|e| panic!("wait for {name}: {e}"))
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // The tests' one wait (testkit, a dev-dependency, builds on this crate: its own copy).
    use testkit::{wait_for, WAIT_LIMIT};

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        cmd
    }

    #[test]
    fn stop_ends_a_process_with_sigterm() {
        let mut p = ChildGuard::spawn("sleep", Command::new("sleep").arg("30"));
        let status = p.stop().expect("a status");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
        assert_eq!(p.pid(), None, "reaped");
    }

    #[test]
    fn stop_kills_a_process_that_ignores_sigterm_after_the_grace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ready = dir.path().join("ready");
        let mut p = ChildGuard::spawn(
            "stubborn",
            &mut sh(&format!(
                "trap '' TERM; touch {}; while :; do sleep 1; done",
                ready.display()
            )),
        )
        .grace(Duration::from_millis(200));
        wait_for("the trap is set", WAIT_LIMIT, || ready.exists());
        let status = p.stop().expect("a status");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }

    #[test]
    fn stop_ends_a_paused_process_with_sigterm() {
        let mut p = ChildGuard::spawn("sleep", Command::new("sleep").arg("30"));
        p.signal(libc::SIGSTOP);
        let started = Instant::now();
        let status = p.stop().expect("a status");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
        assert!(started.elapsed() < STOP_GRACE, "{:?}", started.elapsed());
    }

    #[test]
    fn a_dropped_guard_leaves_no_process() {
        let p = ChildGuard::spawn("sleep", Command::new("sleep").arg("30"));
        let pid = p.pid().expect("running");
        drop(p);
        // Reaped: the pid is no child of ours any more (and no zombie is left).
        let gone = !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.contains("(sleep)"));
        assert!(gone, "pid {pid} still there");
    }

    #[test]
    fn a_released_process_outlives_its_guard() {
        let p = ChildGuard::spawn("sleep", Command::new("sleep").arg("30"));
        let pid = p.pid().expect("running");
        let mut child = p.release().expect("not reaped");
        assert_eq!(
            child.try_wait().ok().flatten(),
            None,
            "pid {pid} was stopped"
        );
        // Ours to stop now (by its pid, through the Child).
        let _ = child.kill();
        child.wait().expect("reap");
    }

    #[test]
    fn kill_is_sigkill_and_try_wait_sees_an_exit() {
        let mut p = ChildGuard::spawn("sleep", Command::new("sleep").arg("30"));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(p.kill().and_then(|s| s.signal()), Some(libc::SIGKILL));
        assert_eq!(p.kill(), None, "once");
        let mut q = ChildGuard::spawn("true", &mut Command::new("true"));
        wait_for("true exits", WAIT_LIMIT, || q.try_wait().is_some());
        assert_eq!(q.pid(), None);
    }
}

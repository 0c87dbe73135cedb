//! testkit: what qlist's tests share, and only its tests (every crate that uses it has it
//! as a dev-dependency; no product crate ships a test server).
//!
//! - [`ChildGuard`] (from `idtools::child`, which `idctl` uses too): the one child-process
//!   guard, stopped by its pid on drop (SIGTERM, a grace, SIGKILL) and reaped;
//! - [`wait_for`] and [`wait_for_async`]: the one poll-until-true with a limit, which fails
//!   the test naming what never happened and where it was waited for;
//! - [`assert_exit`]: the one check of a finished command: its exit code, what its stderr
//!   says, and no panic;
//! - [`frames`]: items as `producer --input-format frames` reads them;
//! - [`proxy::Proxy`]: the one TCP proxy, cuttable (partitions), slowed, load-balancing;
//! - [`tmpfs::Tmpfs`]: a sized tmpfs mount, to fill a disk;
//! - servers: [`s3::TestS3`] (SeaweedFS), [`prometheus::Prometheus`], and test brokers,
//!   [`broker::TestBroker`] (idbroker on free ports, on `idtools::announced`);
//! - [`pki`]: throwaway certificates for the TLS tests;
//! - [`resp`] and [`raw`]: `redis-cli` runs and raw RESP replies, and hand-driven
//!   connections to a broker's binary listener, for the broker's protocol tests;
//! - [`sim`]: the deterministic simulation's in-memory node model (message loss, delay,
//!   reordering, duplication, crashes, amnesia, mutants), on tokio's paused clock;
//! - [`cpu_time`]: the CPU time a process has used, from /proc (the tests that show an
//!   attack costs the server nothing measure it); [`AbortOnDrop`]: a task aborted on drop.
//!
//! Local quorums stay with the operator tools they serve (`idtools::cluster`, which
//! `idctl cluster up` runs); testkit builds on them.

#![warn(missing_docs)]

pub mod broker;
mod http;
pub mod pki;
pub mod prometheus;
pub mod proxy;
pub mod raw;
pub mod resp;
pub mod s3;
pub mod sim;
pub mod tmpfs;

pub use idtools::child::{ChildGuard, STOP_GRACE};

use std::future::Future;
use std::process::Output;
use std::time::{Duration, Instant};

/// How long [`wait_for`] waits when a test has no reason to pick another limit: far above
/// anything a healthy run needs, so that only a real hang fails.
pub const WAIT_LIMIT: Duration = Duration::from_secs(20);

/// The pause between two looks: from 1 ms, doubling up to 50 ms.
fn next_pause(pause: Duration) -> Duration {
    (pause * 2).min(Duration::from_millis(50))
}

/// Polls `cond` until it holds; after `limit`, fails the test naming `what` and the caller.
///
/// # Panics
/// When `cond` has not held within `limit`.
#[track_caller]
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let caller = std::panic::Location::caller();
    let until = Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    while !cond() {
        assert!(
            Instant::now() < until,
            "{caller}: not within {limit:?}: {what}"
        );
        std::thread::sleep(pause);
        pause = next_pause(pause);
    }
}

/// [`wait_for`] for an async condition, sleeping on tokio's clock (real time, or the
/// paused clock of a deterministic test).
///
/// # Panics
/// When `cond` has not held within `limit` (measured on tokio's clock).
#[track_caller]
pub fn wait_for_async<F: Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut cond: impl FnMut() -> F,
) -> impl Future<Output = ()> {
    let caller = std::panic::Location::caller();
    let what = what.to_string();
    async move {
        let until = tokio::time::Instant::now() + limit;
        let mut pause = Duration::from_millis(1);
        while !cond().await {
            assert!(
                tokio::time::Instant::now() < until,
                "{caller}: not within {limit:?}: {what}"
            );
            tokio::time::sleep(pause).await;
            pause = next_pause(pause);
        }
    }
}

/// `items` as `producer --input-format frames` reads them: each a u32 little-endian
/// length, then its bytes.
///
/// # Panics
/// If an item is 4 GiB or larger (no test needs one).
pub fn frames<T: AsRef<[u8]>>(items: &[T]) -> Vec<u8> {
    let mut out = Vec::new();
    for item in items {
        let item = item.as_ref();
        let len = u32::try_from(item.len()).expect("a test item below 4 GiB");
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(item);
    }
    out
}

/// What a command printed, both streams, for failure messages.
pub fn printed(out: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Asserts that a finished command exited with `code`, that its stderr contains
/// `stderr_has` (`""` for any), and that it did not panic.
///
/// # Panics
/// When any of the three does not hold; the message has both streams.
#[track_caller]
pub fn assert_exit(out: &Output, code: i32, stderr_has: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "exit code: {}", printed(out));
    assert!(
        stderr.contains(stderr_has),
        "stderr lacks {stderr_has:?}: {}",
        printed(out)
    );
    assert!(!stderr.contains("panicked"), "a panic: {}", printed(out));
}

/// A tokio task aborted when dropped: a server or proxy a test runs in-process stops
/// with the test, failing or not.
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// CPU time the process `pid` has used so far (user + system), from `/proc/PID/stat`.
///
/// # Panics
/// If the process is gone or the file is not as Linux writes it.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    // Fields after the command name (which may hold spaces), in parentheses.
    let (_, rest) = stat.rsplit_once(')').expect("/proc/PID/stat format");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf has no preconditions.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let per_sec = u64::try_from(per_sec).expect("clock ticks per second");
    Duration::from_secs_f64(ticks as f64 / per_sec as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn cpu_time_grows_while_a_process_computes() {
        let me = std::process::id();
        let before = cpu_time(me);
        let mut x = 0u64;
        wait_for("some CPU time used", WAIT_LIMIT, || {
            for i in 0..1_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
            cpu_time(me) > before
        });
    }

    #[test]
    fn wait_for_returns_once_the_condition_holds() {
        let mut n = 0;
        wait_for("three looks", WAIT_LIMIT, || {
            n += 1;
            n == 3
        });
        assert_eq!(n, 3);
    }

    #[test]
    #[should_panic(expected = "not within")]
    fn wait_for_fails_naming_what_never_happened() {
        wait_for("never", Duration::from_millis(20), || false);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "not within 5s: never")]
    async fn wait_for_async_runs_on_tokio_clock() {
        wait_for_async("never", Duration::from_secs(5), || async { false }).await;
    }

    #[test]
    fn assert_exit_checks_code_stderr_and_panics() {
        let out = Command::new("sh")
            .args(["-c", "echo 'bad flag --x' >&2; exit 2"])
            .output()
            .expect("sh");
        assert_exit(&out, 2, "--x");
        for (code, has) in [(1, "--x"), (2, "--y")] {
            let r = std::panic::catch_unwind(|| assert_exit(&out, code, has));
            assert!(r.is_err(), "{code} {has:?} should fail");
        }
        let panicked = Command::new("sh")
            .args([
                "-c",
                "echo \"thread 'main' panicked at src/x.rs\" >&2; exit 101",
            ])
            .output()
            .expect("sh");
        let r = std::panic::catch_unwind(|| assert_exit(&panicked, 101, ""));
        assert!(r.is_err(), "a panic must fail the check");
    }
}

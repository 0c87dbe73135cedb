//! Test hooks, compiled only with the `test-hooks` feature: the merger's own tests
//! enable it through a dev-dependency, so `cargo build` (and `make build`, the demo, a
//! deployment) makes a merger with no hook at all.
//!
//! The crash tests stop a merge at an exact point, without racing a fast machine:
//! [`STALL_ENV`] once that many records are merged (the merge sleeps with its temporary
//! file open; the test kills it), for good or, with [`STALL_MS_ENV`], for a while.

use std::time::Duration;

/// Stall once at least this many records are merged.
pub const STALL_ENV: &str = "QLIST_MERGER_TEST_STALL_AFTER";

/// With [`STALL_ENV`]: stall this many milliseconds, then go on.
pub const STALL_MS_ENV: &str = "QLIST_MERGER_TEST_STALL_MS";

/// The stall point of one merge.
#[derive(Debug, Clone, Copy)]
pub struct Stall {
    after: Option<u64>,
}

impl Stall {
    /// No stall (a conversion's progress).
    pub const fn none() -> Stall {
        Stall { after: None }
    }

    /// The stall [`STALL_ENV`] asks for; none when it is not set.
    ///
    /// # Errors
    /// The variable is set but not a number: names it and its value.
    pub fn from_env() -> Result<Stall, String> {
        let after = match std::env::var(STALL_ENV) {
            Ok(v) => Some(
                v.parse()
                    .map_err(|_| format!("{STALL_ENV}={v:?} is not a number"))?,
            ),
            Err(_) => None,
        };
        Ok(Stall { after })
    }

    /// With `records` merged: at the stall point, sleeps [`STALL_MS_ENV`] milliseconds
    /// once if it is set, else until the process is killed.
    pub fn maybe_stall(&mut self, records: u64) {
        let Some(after) = self.after else {
            return;
        };
        if records < after {
            return;
        }
        // With STALL_MS_ENV the stall ends (once), so a test can change the world
        // under a merge in progress (kill the S3 server, replace an object).
        if let Some(ms) = std::env::var(STALL_MS_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
        {
            tracing::warn!(records, "{STALL_ENV} set: stalling for {ms} ms");
            self.after = None;
            std::thread::sleep(Duration::from_millis(ms));
            return;
        }
        tracing::warn!(records, "{STALL_ENV} set: stalling until killed");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

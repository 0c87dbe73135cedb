//! A merge's or a conversion's progress, as the binary shows it ([`MergeProgress`]): a bar
//! on a terminal, a log line every [`LOG_EVERY`] otherwise; and the crash tests' stall
//! point ([`Stall`]), which the progress callback reaches every
//! [`crate::PROGRESS_EVERY`] records.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

#[cfg(feature = "test-hooks")]
pub use crate::test_hooks::Stall;

/// Plain-log progress interval when stderr is not a terminal.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

/// Without the feature `test-hooks` (every build but the merger's own tests): no stall,
/// and no variable read.
#[cfg(not(feature = "test-hooks"))]
#[derive(Debug, Clone, Copy)]
pub struct Stall;

#[cfg(not(feature = "test-hooks"))]
impl Stall {
    /// No stall.
    #[must_use]
    pub const fn none() -> Stall {
        Stall
    }

    /// No stall: this build reads no variable.
    ///
    /// # Errors
    /// None in this build (the `test-hooks` one names a variable that is not a number).
    pub fn from_env() -> Result<Stall, String> {
        Ok(Stall)
    }

    /// Does nothing.
    pub fn maybe_stall(&mut self, _records: u64) {}
}

/// The progress of one merge or conversion: a bar on a terminal, a log line every
/// [`LOG_EVERY`] otherwise; and the crash tests' stall ([`Stall`]).
pub struct MergeProgress {
    bar: Option<indicatif::ProgressBar>,
    total: u64,
    start: Instant,
    last_log: Instant,
    stall: Stall,
}

impl MergeProgress {
    /// Starts now, with `total` records expected (0: not known yet, see
    /// [`MergeProgress::set_total`]).
    #[must_use]
    pub fn new(total: u64, stall: Stall) -> MergeProgress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {human_pos}/{human_len} items  {elapsed} elapsed  eta {eta}  {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        let start = Instant::now();
        MergeProgress {
            bar,
            total,
            start,
            last_log: start,
            stall,
        }
    }

    /// When it started.
    #[must_use]
    pub fn start(&self) -> Instant {
        self.start
    }

    /// The records expected, once the inputs are open.
    pub fn set_total(&mut self, total: u64) {
        self.total = total;
        if let Some(bar) = &self.bar {
            bar.set_length(total);
        }
    }

    /// `records` merged and `bytes` written so far; stalls there if the crash tests ask.
    pub fn update(&mut self, records: u64, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(records);
            let mb = bytes as f64 / 1e6;
            bar.set_message(format!(
                "{mb:.0} MB written, {:.0} MB/s",
                mb / self.start.elapsed().as_secs_f64().max(1e-3)
            ));
        } else if self.last_log.elapsed() >= LOG_EVERY {
            self.last_log = Instant::now();
            let total = self.total;
            tracing::info!(records, total, mb = bytes / 1_000_000, "merging");
        }
        self.stall.maybe_stall(records);
    }

    /// Clears the bar (the summary line follows on stdout).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

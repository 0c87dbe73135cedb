//! The load generator behind `idctl bench` and the contention tests: C concurrent callers
//! of an [`IdSource`] for a fixed time, with latency percentiles, holes, and the full
//! request history for the checker.

use crate::history::{self, monotonic_ns, Event, Violation};
use idclient::{ClientConfig, Combine, QuorumClient};
use idproto::IdSource;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Concurrent callers.
    pub clients: usize,
    pub duration: Duration,
    /// IDs per request.
    pub count: u64,
    /// Print a progress line to stderr every second.
    pub progress: bool,
}

impl BenchConfig {
    /// `clients` callers for `duration`, each request for `count` IDs, without progress
    /// lines: how the tests load a quorum.
    pub fn quiet(clients: usize, duration: Duration, count: u64) -> BenchConfig {
        BenchConfig {
            clients,
            duration,
            count,
            progress: false,
        }
    }
}

/// The fields of [`BenchReport::json`] that scripts and tests read.
pub const SUMMARY_FIELDS: [&str; 7] = [
    "ids_per_sec",
    "requests_per_sec",
    "p50_us",
    "p99_us",
    "holes_pct",
    "errors",
    "requests_started",
];

/// The JSON summary ([`BenchReport::json`]) that `idctl bench` prints as the last line
/// of its `stdout`.
///
/// # Panics
/// If there is no such line, it is not JSON, or it lacks one of [`SUMMARY_FIELDS`] (the
/// message has `stdout`).
#[track_caller]
pub fn summary_json(stdout: &str) -> serde_json::Value {
    let last = stdout.lines().last().expect("a JSON line");
    let json: serde_json::Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    for field in SUMMARY_FIELDS {
        assert!(json.get(field).is_some(), "missing {field} in {stdout}");
    }
    json
}

/// `clients` clients of `config`, each told to always combine, run quietly for
/// `duration`, one ID a request: every request must succeed and pass
/// [`BenchReport::check`], and some must ride in another client's batch, which shows the
/// rendezvous (its script and results subscription) works for that configuration.
///
/// # Panics
/// If a client cannot connect, or the run falls short of any of that.
pub async fn assert_combining_run(config: &ClientConfig, clients: usize, duration: Duration) {
    let mut sources = Vec::new();
    for _ in 0..clients {
        let mut c = config.clone();
        c.combine = Combine::Always;
        sources.push(Arc::new(QuorumClient::connect(c).await.expect("connect")));
    }
    let report = run(&BenchConfig::quiet(clients, duration, 1), &sources).await;
    assert_eq!(report.errors, 0, "{}", report.summary_line());
    report.assert_checked();
    let combined: u64 = sources.iter().map(|c| c.counters().combined).sum();
    assert!(
        combined > 0,
        "no request rode in another client's batch (the rendezvous was not used): {}",
        report.summary_line()
    );
}

/// What happened.
#[derive(Debug, Clone)]
pub struct BenchReport {
    pub clients: usize,
    pub count: u64,
    pub elapsed: Duration,
    /// Every request started in the run, whenever it returned.
    pub requests_started: u64,
    /// Requests that returned within the timed window (the rates count these).
    pub requests: u64,
    /// Successful requests among `requests`.
    pub succeeded: u64,
    /// IDs returned within the timed window.
    pub ids: u64,
    /// Every failed request, whenever it returned (also after the timed window), and
    /// every request answered with another number of IDs than it asked for.
    pub errors: u64,
    /// Requests answered with a range of another length than `count` (a generator bug:
    /// also counted in `errors`, and their ranges stay in the history).
    pub wrong_counts: u64,
    /// The first error seen, for the summary.
    pub first_error: Option<String>,
    /// Latency of every successful request (also those still in flight at the end of the
    /// run), microseconds, sorted.
    pub latencies_us: Vec<u64>,
    /// Every request, in no particular order, including those that returned after the
    /// run's end (they count in the history, not in the rates).
    pub events: Vec<Event>,
    /// The timed window, as [`monotonic_ns`] readings: its start and its end.
    pub window_ns: (u64, u64),
}

impl BenchReport {
    /// The `q`-quantile (0..=1) of successful request latency, microseconds.
    pub fn percentile_us(&self, q: f64) -> u64 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        let idx = ((self.latencies_us.len() - 1) as f64 * q).round() as usize;
        self.latencies_us[idx]
    }

    /// Percentage of the ID span from the lowest to the highest ID returned that nobody
    /// got (lost rounds that burned IDs, or IDs taken by other clients of the quorum).
    pub fn holes_pct(&self) -> f64 {
        let ranges = self.events.iter().filter_map(|e| e.outcome);
        let (mut lo, mut hi, mut got) = (u64::MAX, 0u64, 0u64);
        for r in ranges {
            lo = lo.min(r.lo);
            hi = hi.max(r.hi);
            got += r.len();
        }
        if got == 0 {
            return 0.0;
        }
        let span = (hi - lo + 1) as f64;
        100.0 * (span - got as f64) / span
    }

    /// The longest time within the timed window in which no request returned IDs (from
    /// the start to the first success, between two successes, from the last to the end):
    /// a stall. Whole seconds of progress lines would hide one under a second long, and
    /// split a longer one in two.
    pub fn longest_stall(&self) -> Duration {
        let (start, stop) = self.window_ns;
        let mut returns: Vec<u64> = self
            .events
            .iter()
            .filter(|e| e.outcome.is_some() && e.return_ns <= stop)
            .map(|e| e.return_ns.max(start))
            .collect();
        returns.sort_unstable();
        let mut last = start;
        let mut longest = 0;
        for t in returns.into_iter().chain([stop]) {
            longest = longest.max(t - last);
            last = t;
        }
        Duration::from_nanos(longest)
    }

    pub fn ids_per_sec(&self) -> f64 {
        self.ids as f64 / self.elapsed.as_secs_f64()
    }

    pub fn requests_per_sec(&self) -> f64 {
        self.succeeded as f64 / self.elapsed.as_secs_f64()
    }

    /// The history checker over every request, and every range's length against the
    /// requested count.
    ///
    /// # Errors
    /// The first violation found.
    pub fn check(&self) -> Result<(), Violation> {
        for e in &self.events {
            history::check_count(e, self.count)?;
        }
        history::check(&self.events)
    }

    /// Panics unless the run passes [`BenchReport::check`]: the tests' one-line check.
    ///
    /// # Panics
    /// On the first violation, naming how many requests the run made.
    #[track_caller]
    pub fn assert_checked(&self) {
        if let Err(v) = self.check() {
            panic!(
                "run of {} requests violates the guarantee: {v}",
                self.events.len()
            );
        }
    }

    /// Counts one caller's requests; `stop_ns` ends the timed window.
    fn add(&mut self, events: &[Event], stop_ns: u64) {
        for e in events {
            self.requests_started += 1;
            let in_run = e.return_ns <= stop_ns;
            self.requests += u64::from(in_run);
            match e.outcome {
                Some(r) => {
                    // Latency counts every success, also those that returned late: a
                    // starved caller must show in the tail, not vanish from it.
                    self.latencies_us.push((e.return_ns - e.invoke_ns) / 1000);
                    if !r.holds_exactly(self.count) {
                        self.wrong_counts += 1;
                        self.errors += 1;
                        self.first_error.get_or_insert_with(|| {
                            format!("asked for {} IDs, got {}..={}", self.count, r.lo, r.hi)
                        });
                    } else if in_run {
                        self.succeeded += 1;
                        self.ids += r.len();
                    }
                }
                None => self.errors += 1,
            }
        }
    }

    /// The machine-readable result (the last line `idctl bench` prints).
    pub fn json(&self) -> String {
        serde_json::json!({
            "ids_per_sec": self.ids_per_sec().round(),
            "requests_per_sec": self.requests_per_sec().round(),
            "p50_us": self.percentile_us(0.50),
            "p99_us": self.percentile_us(0.99),
            "max_us": self.percentile_us(1.0),
            "holes_pct": (self.holes_pct() * 1000.0).round() / 1000.0,
            "stall_ms": self.longest_stall().as_millis() as u64,
            "errors": self.errors,
            "requests_started": self.requests_started,
            "wrong_counts": self.wrong_counts,
            "clients": self.clients,
            "count": self.count,
            "seconds": (self.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
            "ids": self.ids,
        })
        .to_string()
    }

    /// One line for people.
    pub fn summary_line(&self) -> String {
        let mut line = format!(
            "{} clients x {} IDs/request for {:.1}s: {:.0} IDs/s, {:.0} requests/s, p50 {} us, p99 {} us, holes {:.2}%, longest stall {} ms, {} errors",
            self.clients,
            self.count,
            self.elapsed.as_secs_f64(),
            self.ids_per_sec(),
            self.requests_per_sec(),
            self.percentile_us(0.5),
            self.percentile_us(0.99),
            self.holes_pct(),
            self.longest_stall().as_millis(),
            self.errors
        );
        if let Some(e) = &self.first_error {
            line.push_str(&format!(" (first: {e})"));
        }
        line
    }
}

/// What one caller recorded: every request it made, and its first error.
type CallerLog = (Vec<Event>, Option<String>);

/// Runs `config.clients` callers, caller `i` using `sources[i % sources.len()]`.
///
/// # Panics
/// If `sources` is empty.
pub async fn run<S: IdSource + 'static>(config: &BenchConfig, sources: &[Arc<S>]) -> BenchReport {
    assert!(!sources.is_empty(), "bench needs at least one source");
    let stop = Arc::new(AtomicBool::new(false));
    let ids_done = Arc::new(AtomicU64::new(0));
    let started = tokio::time::Instant::now();
    let start_ns = monotonic_ns();
    let tasks: Vec<_> = (0..config.clients)
        .map(|i| {
            let source = Arc::clone(&sources[i % sources.len()]);
            let caller = caller(
                source,
                config.count,
                Arc::clone(&stop),
                Arc::clone(&ids_done),
            );
            tokio::spawn(caller)
        })
        .collect();
    wait_out(config, started, &ids_done).await;
    stop.store(true, Ordering::Relaxed);
    // Rates count what returned within the run; requests still in flight (some may be
    // sleeping in backoff) finish and go into the history and the error count, but not
    // into the rates.
    let stop_ns = monotonic_ns();
    let mut report = BenchReport {
        clients: config.clients,
        count: config.count,
        elapsed: started.elapsed(),
        requests_started: 0,
        requests: 0,
        succeeded: 0,
        ids: 0,
        errors: 0,
        wrong_counts: 0,
        first_error: None,
        latencies_us: Vec::new(),
        events: Vec::new(),
        window_ns: (start_ns, stop_ns),
    };
    for task in tasks {
        let (events, first_error) = match task.await {
            Ok(done) => done,
            // A panicking caller (an overflow check, a broken invariant) is a bug to see,
            // not one error among many: its events would vanish from the history.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("bench caller task did not finish: {e}"),
        };
        report.add(&events, stop_ns);
        report.events.extend(events);
        if report.first_error.is_none() {
            report.first_error = first_error;
        }
    }
    report.latencies_us.sort_unstable();
    report
}

/// One caller: requests `count` IDs from `source`, one request after another, until
/// `stop`, recording each; counts the IDs it got in `ids_done` (for progress lines).
async fn caller<S: IdSource>(
    source: Arc<S>,
    count: u64,
    stop: Arc<AtomicBool>,
    ids_done: Arc<AtomicU64>,
) -> CallerLog {
    let mut events = Vec::new();
    let mut first_error = None;
    while !stop.load(Ordering::Relaxed) {
        let invoke_ns = monotonic_ns();
        let result = source.next_ids(count).await;
        let return_ns = monotonic_ns();
        let outcome = match result {
            Ok(range) => {
                if range.holds_exactly(count) {
                    ids_done.fetch_add(count, Ordering::Relaxed);
                }
                Some(range)
            }
            Err(e) => {
                first_error.get_or_insert_with(|| e.to_string());
                None
            }
        };
        events.push(Event {
            invoke_ns,
            return_ns,
            outcome,
        });
    }
    (events, first_error)
}

/// Sleeps until the run's duration is over, printing a progress line every second
/// when asked to.
async fn wait_out(config: &BenchConfig, started: tokio::time::Instant, ids_done: &AtomicU64) {
    let mut next_tick = started + Duration::from_secs(1);
    while started.elapsed() < config.duration {
        let wake = next_tick.min(started + config.duration);
        tokio::time::sleep_until(wake).await;
        if config.progress && wake == next_tick {
            let secs = started.elapsed().as_secs_f64();
            let ids = ids_done.load(Ordering::Relaxed);
            eprintln!(
                "bench: {secs:.0}s, {ids} IDs, {:.0} IDs/s",
                ids as f64 / secs
            );
        }
        if wake == next_tick {
            next_tick += Duration::from_secs(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idproto::{IdError, IdRange};

    /// A source that answers after `delay`: an error, a panic, or a range of `len` IDs.
    struct Slow {
        delay: Duration,
        answer: Answer,
        next: AtomicU64,
    }

    #[derive(Clone, Copy)]
    enum Answer {
        Fail,
        Panic,
        Ids { len: u64 },
    }

    impl IdSource for Slow {
        async fn next_ids(&self, _n: u64) -> Result<IdRange, IdError> {
            tokio::time::sleep(self.delay).await;
            match self.answer {
                Answer::Fail => Err(IdError::Deadline {
                    deadline: self.delay,
                    rounds: 1,
                }),
                Answer::Panic => panic!("a caller's bug"),
                Answer::Ids { len } => {
                    let lo = self.next.fetch_add(len, Ordering::Relaxed) + 1;
                    Ok(IdRange {
                        lo,
                        hi: lo + len - 1,
                    })
                }
            }
        }
    }

    fn bench(answer: Answer, delay: Duration) -> BenchReport {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let source = Arc::new(Slow {
            delay,
            answer,
            next: AtomicU64::new(0),
        });
        let config = BenchConfig {
            clients: 4,
            duration: Duration::from_millis(20),
            count: 3,
            progress: false,
        };
        rt.block_on(run(&config, &[source]))
    }

    #[test]
    fn failures_after_the_window_are_errors() {
        // Every request outlives the 20 ms window and fails: all of them are errors.
        let r = bench(Answer::Fail, Duration::from_millis(200));
        assert_eq!(r.requests_started, 4, "{}", r.summary_line());
        assert_eq!(r.errors, 4, "{}", r.summary_line());
        assert_eq!(r.requests, 0);
        let json: serde_json::Value = serde_json::from_str(&r.json()).expect("JSON");
        assert_eq!(json["errors"], 4);
        assert_eq!(json["requests_started"], 4);
        assert!(r.first_error.is_some());
    }

    #[test]
    fn the_longest_stall_is_the_longest_gap_between_successes_in_the_window() {
        let mut r = bench(Answer::Ids { len: 3 }, Duration::from_millis(1));
        let event = |return_ns, ok: bool| Event {
            invoke_ns: 0,
            return_ns,
            outcome: ok.then_some(IdRange { lo: 1, hi: 3 }),
        };
        r.window_ns = (1_000, 10_000);
        // Successes at 2k and 3k, a failure at 8k (no progress), a success after the end.
        r.events = vec![
            event(3_000, true),
            event(2_000, true),
            event(8_000, false),
            event(20_000, true),
        ];
        assert_eq!(r.longest_stall(), Duration::from_nanos(7_000));
        r.events.clear();
        assert_eq!(
            r.longest_stall(),
            Duration::from_nanos(9_000),
            "nothing at all"
        );
    }

    #[test]
    #[should_panic(expected = "a caller's bug")]
    fn a_panicking_caller_panics_the_bench() {
        bench(Answer::Panic, Duration::from_millis(1));
    }

    #[test]
    fn a_short_range_is_an_error() {
        let r = bench(Answer::Ids { len: 2 }, Duration::from_millis(1));
        assert!(r.wrong_counts > 0, "{}", r.summary_line());
        assert_eq!(r.errors, r.requests_started);
        assert_eq!(r.ids, 0);
        assert!(matches!(
            r.check(),
            Err(Violation::WrongCount { requested: 3, .. })
        ));
        let ok = bench(Answer::Ids { len: 3 }, Duration::from_millis(1));
        assert_eq!(
            (ok.errors, ok.wrong_counts),
            (0, 0),
            "{}",
            ok.summary_line()
        );
        assert_eq!(ok.check(), Ok(()));
    }
}

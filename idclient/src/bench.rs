//! The load generator behind `idctl bench` and the contention tests: C concurrent callers
//! of an [`IdSource`] for a fixed time, with latency percentiles, holes, and the full
//! request history for the checker.

use crate::history::{monotonic_ns, Event};
use crate::IdSource;
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

/// What happened.
#[derive(Debug, Clone)]
pub struct BenchReport {
    pub clients: usize,
    pub count: u64,
    pub elapsed: Duration,
    pub requests: u64,
    pub ids: u64,
    pub errors: u64,
    /// The first error seen, for the summary.
    pub first_error: Option<String>,
    /// Latency of every successful request (also those still in flight at the end of the
    /// run), microseconds, sorted.
    pub latencies_us: Vec<u64>,
    /// Every request, in no particular order, including those that returned after the
    /// run's end (they count in the history, not in the rates).
    pub events: Vec<Event>,
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

    pub fn ids_per_sec(&self) -> f64 {
        self.ids as f64 / self.elapsed.as_secs_f64()
    }

    pub fn requests_per_sec(&self) -> f64 {
        (self.requests - self.errors) as f64 / self.elapsed.as_secs_f64()
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
            "errors": self.errors,
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
            "{} clients x {} IDs/request for {:.1}s: {:.0} IDs/s, {:.0} requests/s, p50 {} us, p99 {} us, holes {:.2}%, {} errors",
            self.clients,
            self.count,
            self.elapsed.as_secs_f64(),
            self.ids_per_sec(),
            self.requests_per_sec(),
            self.percentile_us(0.5),
            self.percentile_us(0.99),
            self.holes_pct(),
            self.errors
        );
        if let Some(e) = &self.first_error {
            line.push_str(&format!(" (first: {e})"));
        }
        line
    }
}

/// Runs `config.clients` callers, caller `i` using `sources[i % sources.len()]`.
///
/// # Panics
/// If `sources` is empty.
pub async fn run<S: IdSource + 'static>(config: &BenchConfig, sources: &[Arc<S>]) -> BenchReport {
    assert!(!sources.is_empty(), "bench needs at least one source");
    let stop = Arc::new(AtomicBool::new(false));
    let ids_done = Arc::new(AtomicU64::new(0));
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(config.clients);
    for i in 0..config.clients {
        let source = Arc::clone(&sources[i % sources.len()]);
        let (stop, ids_done, count) = (Arc::clone(&stop), Arc::clone(&ids_done), config.count);
        tasks.push(tokio::spawn(async move {
            let mut events = Vec::new();
            let mut first_error = None;
            while !stop.load(Ordering::Relaxed) {
                let invoke_ns = monotonic_ns();
                let result = source.next_ids(count).await;
                let return_ns = monotonic_ns();
                match result {
                    Ok(range) => {
                        ids_done.fetch_add(range.len(), Ordering::Relaxed);
                        events.push(Event {
                            invoke_ns,
                            return_ns,
                            outcome: Some(range),
                        });
                    }
                    Err(e) => {
                        first_error.get_or_insert_with(|| e.to_string());
                        events.push(Event {
                            invoke_ns,
                            return_ns,
                            outcome: None,
                        });
                    }
                }
            }
            (events, first_error)
        }));
    }
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
    stop.store(true, Ordering::Relaxed);
    // Rates count what returned within the run; requests still in flight (some may be
    // sleeping in backoff) finish and go into the history, but not into the figures.
    let stop_ns = monotonic_ns();
    let mut report = BenchReport {
        clients: config.clients,
        count: config.count,
        elapsed: started.elapsed(),
        requests: 0,
        ids: 0,
        errors: 0,
        first_error: None,
        latencies_us: Vec::new(),
        events: Vec::new(),
    };
    for task in tasks {
        match task.await {
            Ok((events, first_error)) => {
                for e in &events {
                    // Latency counts every success, also those that returned late: a
                    // starved caller must show in the tail, not vanish from it.
                    if e.outcome.is_some() {
                        report.latencies_us.push((e.return_ns - e.invoke_ns) / 1000);
                    }
                    if e.return_ns <= stop_ns {
                        report.requests += 1;
                        match e.outcome {
                            Some(r) => report.ids += r.len(),
                            None => report.errors += 1,
                        }
                    }
                }
                report.events.extend(events);
                if report.first_error.is_none() {
                    report.first_error = first_error;
                }
            }
            Err(e) => {
                report.errors += 1;
                report
                    .first_error
                    .get_or_insert_with(|| format!("bench task failed: {e}"));
            }
        }
    }
    report.latencies_us.sort_unstable();
    report
}

//! A checker for recorded ID histories: every returned ID is unique, and greater than
//! every ID returned before its request was invoked (linearizability of a counter).
//!
//! Times are [`monotonic_ns`] readings, comparable across processes on one machine.
//! Requests with an unknown outcome (errors, timeouts) add no constraint: they may have
//! burned IDs, but returned none.
//!
//! ID 0 is never handed out: a missing register counts as 0 and the first range starts
//! at 1 (and a published batch result starting at 0 is refused), so a range holding 0 is
//! a violation. A range must also hold exactly the count its request asked for
//! ([`check_count`]); the history format does not carry the count, so whoever records a
//! request checks it.

use idproto::IdRange;
use std::fmt;
use std::future::Future;
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process on this machine, so
/// histories recorded by several processes can be checked together.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass; CLOCK_MONOTONIC always exists.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One request: when it was invoked, when it returned, and the range it got (`None` when
/// it failed or its outcome is unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub invoke_ns: u64,
    pub return_ns: u64,
    pub outcome: Option<IdRange>,
}

/// A broken guarantee, with the two requests that show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Two requests got overlapping ranges.
    Duplicate { a: Event, b: Event },
    /// `later` was invoked after `earlier` returned, yet got a range not wholly above it.
    RealTime { earlier: Event, later: Event },
    /// A malformed event (range with lo > hi, or returned before invoked).
    Malformed(Event),
    /// A request got ID 0, which no correct generator hands out.
    ZeroId(Event),
    /// A request got a range of another length than the `requested` count.
    WrongCount { event: Event, requested: u64 },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Duplicate { a, b } => write!(f, "duplicate IDs: {a:?} and {b:?} overlap"),
            Violation::RealTime { earlier, later } => {
                write!(f, "real-time order broken: {later:?} was invoked after {earlier:?} returned, but is not above it")
            }
            Violation::Malformed(e) => write!(f, "malformed event {e:?}"),
            Violation::ZeroId(e) => write!(f, "ID 0 handed out: {e:?}"),
            Violation::WrongCount { event, requested } => {
                write!(
                    f,
                    "asked for {requested} IDs, got another number: {event:?}"
                )
            }
        }
    }
}

impl std::error::Error for Violation {}

/// Checks a history in O(n log n).
///
/// # Errors
/// The first violation found.
pub fn check(events: &[Event]) -> Result<(), Violation> {
    let mut ok: Vec<(Event, IdRange)> = Vec::with_capacity(events.len());
    for e in events {
        if e.return_ns < e.invoke_ns {
            return Err(Violation::Malformed(*e));
        }
        if let Some(r) = e.outcome {
            if r.lo > r.hi {
                return Err(Violation::Malformed(*e));
            }
            if r.lo == 0 {
                return Err(Violation::ZeroId(*e));
            }
            ok.push((*e, r));
        }
    }
    // Uniqueness: sorted by lo, each range starts above the previous one's end.
    ok.sort_by_key(|(_, r)| (r.lo, r.hi));
    for pair in ok.windows(2) {
        if pair[1].1.lo <= pair[0].1.hi {
            return Err(Violation::Duplicate {
                a: pair[0].0,
                b: pair[1].0,
            });
        }
    }
    // Real time: sweep requests in invoke order, folding in every request that returned
    // strictly before the invoke; each range must lie above the running maximum.
    let mut by_return: Vec<&(Event, IdRange)> = ok.iter().collect();
    by_return.sort_by_key(|(e, _)| e.return_ns);
    let mut by_invoke: Vec<&(Event, IdRange)> = ok.iter().collect();
    by_invoke.sort_by_key(|(e, _)| e.invoke_ns);
    let mut returned = by_return.into_iter().peekable();
    let mut max: Option<&(Event, IdRange)> = None;
    for later in by_invoke {
        while let Some(&&earlier) = returned
            .peek()
            .filter(|(e, _)| e.return_ns < later.0.invoke_ns)
            .as_ref()
        {
            if max.is_none_or(|m| earlier.1.hi > m.1.hi) {
                max = Some(earlier);
            }
            returned.next();
        }
        if let Some(m) = max {
            if later.1.lo <= m.1.hi {
                return Err(Violation::RealTime {
                    earlier: m.0,
                    later: later.0,
                });
            }
        }
    }
    Ok(())
}

/// Panics with the violation unless `events` pass [`check`]: the tests' one-line check.
///
/// # Panics
/// On the first violation [`check`] finds.
#[track_caller]
pub fn assert_linearizable(events: &[Event]) {
    if let Err(v) = check(events) {
        panic!(
            "history of {} requests violates the guarantee: {v}",
            events.len()
        );
    }
}

/// A history that concurrent callers record into, each request timed with
/// [`monotonic_ns`] around its future. Cheap to clone (the clones share one history), so
/// each caller task holds its own; a test may look at what was recorded so far while the
/// callers still run ([`Recorder::events`]).
#[derive(Clone, Default)]
pub struct Recorder {
    events: Arc<Mutex<Vec<Event>>>,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// Runs `request` and records when it was invoked and returned and the range it got
    /// (none for an error); returns its result.
    pub async fn record<E>(
        &self,
        request: impl Future<Output = Result<IdRange, E>>,
    ) -> Result<IdRange, E> {
        self.record_event(request).await.0
    }

    /// As [`Recorder::record`], also handing back the event recorded: for a caller that
    /// needs a request's times besides its result (when an ID was served, and by whom).
    pub async fn record_event<E>(
        &self,
        request: impl Future<Output = Result<IdRange, E>>,
    ) -> (Result<IdRange, E>, Event) {
        let invoke_ns = monotonic_ns();
        let result = request.await;
        let event = Event {
            invoke_ns,
            return_ns: monotonic_ns(),
            outcome: result.as_ref().ok().copied(),
        };
        self.lock().push(event);
        (result, event)
    }

    /// One caller's loop: `request(i)` for i = 0, 1, 2, ... while `more(i)` holds (a
    /// count, or a stop flag), one request after another, each recorded as by
    /// [`Recorder::record`]. Returns the errors of the requests that failed, in order.
    pub async fn call_while<E, F>(
        &self,
        mut more: impl FnMut(usize) -> bool,
        mut request: impl FnMut(usize) -> F,
    ) -> Vec<E>
    where
        F: Future<Output = Result<IdRange, E>>,
    {
        let mut errors = Vec::new();
        let mut i = 0;
        while more(i) {
            if let Err(e) = self.record(request(i)).await {
                errors.push(e);
            }
            i += 1;
        }
        errors
    }

    /// A copy of what was recorded so far.
    pub fn events(&self) -> Vec<Event> {
        self.lock().clone()
    }

    /// What was recorded so far, leaving the history empty.
    pub fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Event>> {
        self.events.lock().expect("history lock")
    }
}

/// Checks that a request for `requested` IDs got exactly that many (or failed).
///
/// # Errors
/// [`Violation::WrongCount`] (also for a malformed range, which holds no count).
pub fn check_count(event: &Event, requested: u64) -> Result<(), Violation> {
    match event.outcome {
        Some(r) if !r.holds_exactly(requested) => Err(Violation::WrongCount {
            event: *event,
            requested,
        }),
        _ => Ok(()),
    }
}

/// Writes events one a line: `invoke_ns return_ns lo hi`, or `invoke_ns return_ns -` for
/// an unknown outcome.
///
/// # Errors
/// I/O errors of the writer.
pub fn write_events(mut w: impl Write, events: &[Event]) -> std::io::Result<()> {
    for e in events {
        match e.outcome {
            Some(r) => writeln!(w, "{} {} {} {}", e.invoke_ns, e.return_ns, r.lo, r.hi)?,
            None => writeln!(w, "{} {} -", e.invoke_ns, e.return_ns)?,
        }
    }
    w.flush()
}

/// Reads a file written by [`write_events`].
///
/// # Errors
/// I/O errors, or a line that does not parse (named with its line number).
pub fn read_events(path: &Path) -> std::io::Result<Vec<Event>> {
    let file = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut events = Vec::new();
    for (i, line) in file.lines().enumerate() {
        let line = line?;
        let bad = || {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}:{}: bad history line {line:?}", path.display(), i + 1),
            )
        };
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
        let event = match f.as_slice() {
            [inv, ret, "-"] => Event {
                invoke_ns: num(inv)?,
                return_ns: num(ret)?,
                outcome: None,
            },
            [inv, ret, lo, hi] => Event {
                invoke_ns: num(inv)?,
                return_ns: num(ret)?,
                outcome: Some(IdRange {
                    lo: num(lo)?,
                    hi: num(hi)?,
                }),
            },
            _ => return Err(bad()),
        };
        events.push(event);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ev(invoke_ns: u64, return_ns: u64, lo: u64, hi: u64) -> Event {
        Event {
            invoke_ns,
            return_ns,
            outcome: Some(IdRange { lo, hi }),
        }
    }

    #[test]
    fn sequential_history_passes() {
        assert_eq!(
            check(&[ev(0, 1, 1, 1), ev(2, 3, 2, 5), ev(4, 5, 9, 9)]),
            Ok(())
        );
    }

    #[test]
    fn concurrent_requests_may_get_any_order() {
        // Both in flight at once: the later-invoked one may get the smaller ID.
        assert_eq!(check(&[ev(0, 10, 5, 5), ev(1, 9, 4, 4)]), Ok(()));
    }

    #[test]
    fn duplicate_is_caught() {
        assert!(matches!(
            check(&[ev(0, 1, 1, 3), ev(5, 6, 3, 4)]),
            Err(Violation::Duplicate { .. })
        ));
        assert!(matches!(
            check(&[ev(0, 10, 7, 7), ev(1, 9, 7, 7)]),
            Err(Violation::Duplicate { .. })
        ));
    }

    #[test]
    fn real_time_inversion_is_caught() {
        assert!(matches!(
            check(&[ev(0, 1, 10, 10), ev(2, 3, 5, 5)]),
            Err(Violation::RealTime { .. })
        ));
    }

    #[test]
    fn equal_timestamps_are_not_before() {
        // Returned at 5, invoked at 5: not strictly before, so no order is required.
        assert_eq!(check(&[ev(0, 5, 10, 10), ev(5, 6, 5, 5)]), Ok(()));
        assert!(check(&[ev(0, 5, 10, 10), ev(6, 7, 5, 5)]).is_err());
    }

    #[test]
    fn unknown_outcomes_add_no_constraint() {
        let unknown = Event {
            invoke_ns: 0,
            return_ns: 1,
            outcome: None,
        };
        assert_eq!(check(&[unknown, ev(2, 3, 1, 1)]), Ok(()));
    }

    #[test]
    fn malformed_events_are_caught() {
        assert!(matches!(
            check(&[ev(5, 4, 1, 1)]),
            Err(Violation::Malformed(_))
        ));
        assert!(matches!(
            check(&[ev(0, 1, 3, 2)]),
            Err(Violation::Malformed(_))
        ));
    }

    #[test]
    fn id_zero_is_caught() {
        assert!(matches!(
            check(&[ev(0, 1, 0, 3)]),
            Err(Violation::ZeroId(_))
        ));
        assert_eq!(check(&[ev(0, 1, 1, 3)]), Ok(()));
    }

    #[test]
    fn wrong_counts_are_caught() {
        assert_eq!(check_count(&ev(0, 1, 5, 9), 5), Ok(()));
        for (lo, hi, n) in [(5, 9, 6), (5, 9, 4), (9, 5, 1), (0, u64::MAX, 0)] {
            assert!(
                matches!(
                    check_count(&ev(0, 1, lo, hi), n),
                    Err(Violation::WrongCount { requested, .. }) if requested == n
                ),
                "{lo}..={hi} for {n}"
            );
        }
        let failed = Event {
            invoke_ns: 0,
            return_ns: 1,
            outcome: None,
        };
        assert_eq!(check_count(&failed, 3), Ok(()));
    }

    #[test]
    fn file_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("h.txt");
        let events = vec![
            ev(1, 2, 3, 4),
            Event {
                invoke_ns: 5,
                return_ns: 6,
                outcome: None,
            },
        ];
        write_events(std::fs::File::create(&path).expect("create"), &events).expect("write");
        assert_eq!(read_events(&path).expect("read"), events);
        std::fs::write(&path, "1 2 x\n").expect("write");
        let err = read_events(&path).expect_err("bad line");
        assert!(err.to_string().contains(":1: bad history line"), "{err}");
    }

    /// A history a correct generator could produce: grants in a sequential order, each at
    /// a linearization point inside its request's interval. The points advance by 0-2
    /// ticks and intervals reach up to 20 ticks either side, so requests overlap (many
    /// in flight at once), and invoke and return times tie (also with the point of
    /// another request). Random ranges, holes, some unknown outcomes.
    fn valid_history() -> impl Strategy<Value = Vec<Event>> {
        prop::collection::vec(
            (1u64..4, 0u64..3, 0u64..20, 0u64..20, any::<bool>(), 0u64..3),
            1..60,
        )
        .prop_map(|steps| {
            let mut next = 1;
            let mut t = 0; // the linearization point: never decreases
            let mut events = Vec::new();
            for (len, step, before, after, unknown, gap) in steps {
                t += step;
                next += gap; // holes are allowed
                let range = IdRange {
                    lo: next,
                    hi: next + len - 1,
                };
                next += len;
                events.push(Event {
                    invoke_ns: t.saturating_sub(before),
                    return_ns: t + after,
                    outcome: (!unknown).then_some(range),
                });
            }
            events
        })
    }

    #[test]
    fn valid_histories_overlap_and_tie() {
        // The property tests below are only as good as their histories: they must hold
        // concurrent requests and equal timestamps, not just a sequence.
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut overlapping, mut tied) = (0, 0);
        for _ in 0..200 {
            let events = valid_history()
                .new_tree(&mut runner)
                .expect("a history")
                .current();
            let pairs = || {
                events
                    .iter()
                    .enumerate()
                    .flat_map(|(i, a)| events[i + 1..].iter().map(move |b| (a, b)))
            };
            if pairs().any(|(a, b)| a.invoke_ns < b.return_ns && b.invoke_ns < a.return_ns) {
                overlapping += 1;
            }
            if pairs().any(|(a, b)| {
                a.return_ns == b.invoke_ns
                    || b.return_ns == a.invoke_ns
                    || a.invoke_ns == b.invoke_ns
            }) {
                tied += 1;
            }
        }
        assert!(
            overlapping > 150,
            "only {overlapping} of 200 histories overlap"
        );
        assert!(
            tied > 100,
            "only {tied} of 200 histories have equal timestamps"
        );
    }

    /// Naive O(n^2) reference.
    fn naive_ok(events: &[Event]) -> bool {
        let ok: Vec<(Event, IdRange)> = events
            .iter()
            .filter_map(|e| e.outcome.map(|r| (*e, r)))
            .collect();
        for (i, (a, ra)) in ok.iter().enumerate() {
            if ra.lo == 0 || ra.lo > ra.hi || a.return_ns < a.invoke_ns {
                return false;
            }
            for (j, (b, rb)) in ok.iter().enumerate() {
                if i != j && ra.lo <= rb.hi && rb.lo <= ra.hi {
                    return false;
                }
                if a.return_ns < b.invoke_ns && rb.lo <= ra.hi {
                    return false;
                }
            }
        }
        true
    }

    /// The loop stops where `more` says, records each request in order with its times,
    /// and hands back the errors, which are recorded without an outcome.
    #[tokio::test]
    async fn recorder_call_while_records_every_request() {
        let r = Recorder::new();
        let errors = r
            .call_while(
                |i| i < 3,
                |i| async move {
                    match i {
                        1 => Err(format!("request {i} failed")),
                        _ => Ok(IdRange {
                            lo: 1 + i as u64,
                            hi: 1 + i as u64,
                        }),
                    }
                },
            )
            .await;
        assert_eq!(errors, vec!["request 1 failed".to_string()]);
        let events = r.take();
        let outcomes: Vec<_> = events.iter().map(|e| e.outcome).collect();
        assert_eq!(
            outcomes,
            vec![
                Some(IdRange { lo: 1, hi: 1 }),
                None,
                Some(IdRange { lo: 3, hi: 3 })
            ]
        );
        assert!(events.windows(2).all(|w| w[0].return_ns <= w[1].invoke_ns));
        assert!(events.iter().all(|e| e.invoke_ns <= e.return_ns));
        assert!(r.events().is_empty(), "take leaves the history empty");
    }

    /// `record_event` hands back exactly the event it recorded.
    #[tokio::test]
    async fn recorder_record_event_returns_what_it_recorded() {
        let r = Recorder::new();
        let range = IdRange { lo: 4, hi: 6 };
        let (result, event) = r.record_event(async { Ok::<_, ()>(range) }).await;
        assert_eq!(result, Ok(range));
        assert_eq!(event.outcome, Some(range));
        assert_eq!(r.take(), vec![event]);
    }

    proptest! {
        #[test]
        fn valid_histories_pass(mut events in valid_history(), seed: u64) {
            // The order events are given in does not matter.
            let n = events.len();
            for i in 0..n { events.swap(i, (seed as usize).wrapping_mul(i + 7) % n); }
            prop_assert_eq!(check(&events), Ok(()));
        }

        #[test]
        fn agrees_with_naive_reference(mut events in valid_history(), i: usize, j: usize, delta in 0u64..4, late: bool) {
            let n = events.len();
            let (i, j) = (i % n, j % n);
            if late {
                // Break real time only: invoke request i just around request j's return,
                // so it may start after j returned while its range is below j's.
                let at = events[j].return_ns + delta.saturating_sub(1);
                events[i].invoke_ns = at;
                events[i].return_ns = events[i].return_ns.max(at);
            } else if let (Some(a), Some(b)) = (events[i].outcome, events[j].outcome) {
                // Move one range onto another's neighbourhood.
                let lo = b.lo.saturating_sub(delta).max(1);
                events[i].outcome = Some(IdRange { lo, hi: lo + (a.hi - a.lo) });
            }
            prop_assert_eq!(check(&events).is_ok(), naive_ok(&events));
        }

        #[test]
        fn a_duplicated_grant_is_always_caught(events in valid_history(), i: usize) {
            let granted: Vec<Event> = events.iter().copied().filter(|e| e.outcome.is_some()).collect();
            prop_assume!(!granted.is_empty());
            let mut events = events;
            let dup = granted[i % granted.len()];
            events.push(Event { invoke_ns: dup.invoke_ns, return_ns: dup.return_ns + 1, outcome: dup.outcome });
            prop_assert!(check(&events).is_err());
        }
    }
}

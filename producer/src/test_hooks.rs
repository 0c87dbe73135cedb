//! Test hooks, compiled only with the `test-hooks` feature: the producer's own tests
//! enable it through a dev-dependency, so `cargo build` (and `make build`, the demo, a
//! deployment) makes a producer with no hook at all.
//!
//! The hooks let a test stop the producer at an exact point, without racing a fast
//! machine: [`STALL_ENV`] once that many items are durable (the test then kills it or
//! changes its input, and lets it go on with a line on stdin), [`SEAL_STALL_ENV`] once
//! sealing has written that many items into the run (the test kills it mid-upload),
//! [`PUBLISH_ABORT_ENV`] right after a publication's segment or checkpoint (the process
//! aborts, as kill -9 would leave it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// What the producer prints on stderr when a hook stalls it.
pub const STALL_ANNOUNCE: &str = "test stall:";

/// Stall once at least this many items are durable, until a line (or EOF) on stdin.
pub const STALL_ENV: &str = "QLIST_PRODUCER_TEST_STALL_AFTER";

/// Stall for good once sealing has written this many items into the run.
pub const SEAL_STALL_ENV: &str = "QLIST_PRODUCER_TEST_SEAL_STALL_AFTER";

/// Abort (SIGABRT, no cleanup) right after the K-th segment (`segment:K`: before its
/// checkpoint) or the K-th checkpoint (`checkpoint:K`) this process publishes.
pub const PUBLISH_ABORT_ENV: &str = "QLIST_PRODUCER_TEST_PUBLISH_ABORT";

/// Where [`PUBLISH_ABORT_ENV`] aborts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishPoint {
    /// A segment's upload finished; its checkpoint is not written.
    Segment,
    /// A checkpoint was written.
    Checkpoint,
}

static STALL_AFTER: OnceLock<Option<u64>> = OnceLock::new();
static PUBLISH_ABORT: OnceLock<Option<(PublishPoint, u64)>> = OnceLock::new();
static SEAL_STALL_AFTER: OnceLock<Option<u64>> = OnceLock::new();
/// The durable-items stall happens once per process (one run).
static STALLED: AtomicBool = AtomicBool::new(false);

/// Reads both variables; the binary calls it once at start.
///
/// # Errors
/// A variable that is set but not a number: names it and its value.
pub fn from_env() -> Result<(), String> {
    let read = |name: &str| match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}={v:?} is not a number")),
        Err(_) => Ok(None),
    };
    let _ = STALL_AFTER.set(read(STALL_ENV)?);
    let _ = SEAL_STALL_AFTER.set(read(SEAL_STALL_ENV)?);
    let abort = match std::env::var(PUBLISH_ABORT_ENV) {
        Ok(v) => Some(parse_publish_abort(&v).ok_or_else(|| {
            format!("{PUBLISH_ABORT_ENV}={v:?} is not segment:K or checkpoint:K")
        })?),
        Err(_) => None,
    };
    let _ = PUBLISH_ABORT.set(abort);
    Ok(())
}

fn parse_publish_abort(v: &str) -> Option<(PublishPoint, u64)> {
    let (point, k) = v.split_once(':')?;
    let point = match point {
        "segment" => PublishPoint::Segment,
        "checkpoint" => PublishPoint::Checkpoint,
        _ => return None,
    };
    Some((point, k.parse().ok()?))
}

/// With the `nth` segment or checkpoint of this process just written: aborts the process
/// at the [`PUBLISH_ABORT_ENV`] point.
pub(crate) fn maybe_abort_publishing(point: PublishPoint, nth: u64) {
    if PUBLISH_ABORT.get().copied().flatten() == Some((point, nth)) {
        eprintln!("{STALL_ANNOUNCE} aborting after {point:?} {nth}");
        std::process::abort();
    }
}

/// With `durable` items durable and the writer idle: stalls here the first time the
/// [`STALL_ENV`] point is reached. Printed directly, not as a `tracing` event, so the
/// test sees it whatever `RUST_LOG` says.
pub(crate) async fn maybe_stall(durable: u64) {
    let Some(after) = STALL_AFTER.get().copied().flatten() else {
        return;
    };
    if durable < after || STALLED.swap(true, Ordering::Relaxed) {
        return;
    }
    eprintln!("{STALL_ANNOUNCE} {durable} items durable");
    let waited = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)
    })
    .await;
    if let Err(e) = waited {
        tracing::warn!(error = %e, "test stall: waiting for stdin failed");
    }
}

/// With `records` items written into the run being sealed: at the [`SEAL_STALL_ENV`]
/// point, announces it and never returns (the upload stays open; the test kills it).
pub fn maybe_stall_sealing(records: u64) {
    let Some(after) = SEAL_STALL_AFTER.get().copied().flatten() else {
        return;
    };
    if records < after {
        return;
    }
    eprintln!("{STALL_ANNOUNCE} sealing: {records} items written");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

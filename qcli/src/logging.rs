//! The one logging setup of every binary.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Installs the `tracing` subscriber: human-readable lines on stderr (colours only on a
/// terminal), filtered by `RUST_LOG` (e.g. `RUST_LOG=debug`, `RUST_LOG=idclient=trace`),
/// or by `default_filter` when `RUST_LOG` is unset or unparsable.
///
/// Call it once, first thing in `main`; a second call leaves the first subscriber in place.
pub fn init_logging(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // Only fails if a subscriber is already installed, which then stays: nothing to do.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

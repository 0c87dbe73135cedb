//! The one logging setup of every binary: text or JSON lines on stderr.

use clap::{Arg, ValueEnum};
use std::io::IsTerminal;
use std::sync::OnceLock;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Layered, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, Layer, Registry};

/// How log lines look (`--log-format`, `QLIST_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (colours only on a terminal).
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `target`, `span`), for
    /// log collectors.
    Json,
}

type Inner = Layered<Targets, Registry>;
type Output = Box<dyn Layer<Inner> + Send + Sync>;

/// The format [`crate::parse`] read, if it ran.
static FORMAT: OnceLock<LogFormat> = OnceLock::new();
/// The installed subscriber's output layer, if [`init_logging`] installed one.
static OUTPUT: OnceLock<reload::Handle<Output, Inner>> = OnceLock::new();

/// The `--log-format` flag [`crate::parse`] adds to every binary (and its subcommands).
pub(crate) fn log_format_arg() -> Arg {
    Arg::new(LOG_FORMAT_ID)
        .long("log-format")
        .value_name("FORMAT")
        .value_parser(clap::value_parser!(LogFormat))
        .default_value("text")
        .env("QLIST_LOG_FORMAT")
        .global(true)
        .help("Log lines on stderr: text, or json (one JSON object per line)")
}

/// The id of [`log_format_arg`].
pub(crate) const LOG_FORMAT_ID: &str = "log_format";

/// The format [`crate::parse`] read (text if it did not run).
pub(crate) fn format() -> LogFormat {
    FORMAT.get().copied().unwrap_or(LogFormat::Text)
}

/// Switches the log lines to `format` (from now on, if logging is already installed).
pub(crate) fn set_format(format: LogFormat) {
    let _ = FORMAT.set(format);
    if let Some(handle) = OUTPUT.get() {
        // Fails only if the subscriber is gone, and then nothing logs anyway.
        let _ = handle.reload(output(format));
    }
}

fn output(format: LogFormat) -> Output {
    match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
    }
}

/// Installs the `tracing` subscriber: lines on stderr, human-readable (colours only on a
/// terminal) or JSON (`--log-format json` or `QLIST_LOG_FORMAT=json`, read by
/// [`crate::parse`], before or after this call), filtered by `RUST_LOG` (a level, or
/// comma-separated `target=level` pairs: `RUST_LOG=debug`, `RUST_LOG=warn,idclient=trace`),
/// or by `default_filter` when `RUST_LOG` is unset or unparsable.
///
/// The filter is tracing-subscriber's `Targets`, not its `EnvFilter`: the same syntax
/// for levels and targets, without span and field matching, which nobody here used and
/// which cost the first build an optimized regex engine (BENCHMARKS.md, "The first build").
///
/// Call it once, first thing in `main`; a second call leaves the first subscriber in place.
pub fn init_logging(default_filter: &str) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.parse::<Targets>().ok())
        .or_else(|| default_filter.parse().ok())
        .unwrap_or_default();
    let (layer, handle) = reload::Layer::new(output(format()));
    // Only fails if a subscriber is already installed, which then stays: nothing to do.
    if tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init()
        .is_ok()
    {
        let _ = OUTPUT.set(handle);
    }
}

//! qcli: the command-line conventions shared by qlist's four binaries (`idctl`,
//! `idbroker`, `producer`, `merger`), so that one flag means one thing everywhere.
//!
//! It owns:
//! - the ID-source flags (`src/flags.rs`), as clap structs to `#[command(flatten)]`:
//!   [`QuorumArgs`] (the quorum nodes and everything of the quorum client's configuration
//!   a user sets), [`BrokerArgs`] (brokers, connections, token, TLS: [`BrokerTlsArgs`]),
//!   [`DeadlineArgs`] (`--deadline-ms`), and [`SourceArgs`], "either `--nodes` or
//!   `--broker`";
//!   (the crate `idflags` turns them into the ID client's configurations);
//! - [`parse`]: clap parsing with per-binary defaults and the exit-code table in `--help`;
//! - [`mod@env`]: every flag of every binary from an environment variable too
//!   (`QLIST_NODES`, `IDBROKER_LISTEN`, ...), named by one rule;
//! - [`init_logging`]: the one `tracing` subscriber (stderr, `RUST_LOG`, `--log-format
//!   text|json`);
//! - the exit-code convention ([`Cause`], [`exit`]): 0 ok, 1 other, 2 usage, 3 input,
//!   4 output, 5 ID generator unavailable or unsafe.
//!
//! Libraries do not depend on clap; this crate is for binaries only. It needs neither
//! Redis nor RocksDB nor the ID client: the exit codes know ID errors from `idproto`, so
//! `merger`, which gets no IDs, links none of the client (Redis, the rendezvous, the
//! broker client).

pub mod env;
mod exit;
mod flags;
mod logging;
mod parse;

pub use exit::{cause_of, exit, fail, id_error_cause, usage, Cause, Failure, EXIT_CODES_HELP};
pub use flags::{
    BrokerArgs, BrokerTlsArgs, CombineArg, DeadlineArgs, NodeList, NodeTimeouts, QuorumArgs,
    SourceArgs, TlsArgs,
};
pub use logging::{init_logging, LogFormat};
pub use parse::parse;

/// The `--version` text of the crate it is written in: its version and, in a build with
/// that crate's `test-hooks` feature (`cargo test` turns it on for the crate's own tests),
/// a warning that says so. `scripts/check-release.sh` reads it off the built binaries: a
/// release must never say it. A macro, so that the version and the feature are the
/// calling crate's.
#[macro_export]
macro_rules! version {
    () => {
        if cfg!(feature = "test-hooks") {
            concat!(
                env!("CARGO_PKG_VERSION"),
                " (built with test hooks: not for production)"
            )
        } else {
            env!("CARGO_PKG_VERSION")
        }
    };
}

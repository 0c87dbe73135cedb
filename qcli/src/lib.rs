//! qcli: the command-line conventions shared by qlist's four binaries (`idctl`,
//! `idbroker`, `producer`, `merger`), so that one flag means one thing everywhere.
//!
//! It owns:
//! - the ID-source flags, as clap structs to `#[command(flatten)]`: [`QuorumArgs`] (the
//!   quorum nodes and everything [`idclient::ClientConfig`] exposes to a user),
//!   [`BrokerArgs`] (brokers, connections, token, TLS: [`BrokerTlsArgs`]), [`DeadlineArgs`] (`--deadline-ms`), and
//!   [`SourceArgs`], "either `--nodes` or `--broker`", turned into a [`Source`];
//! - [`parse`]: clap parsing with per-binary defaults and the exit-code table in `--help`;
//! - [`mod@env`]: every flag of every binary from an environment variable too
//!   (`QLIST_NODES`, `IDBROKER_LISTEN`, ...), named by one rule;
//! - [`init_logging`]: the one `tracing` subscriber (stderr, `RUST_LOG`, `--log-format
//!   text|json`);
//! - the exit-code convention ([`Cause`], [`exit`]): 0 ok, 1 other, 2 usage, 3 input,
//!   4 output, 5 ID generator unavailable or unsafe.
//!
//! Libraries do not depend on clap; this crate is for binaries only. It needs neither
//! Redis nor RocksDB.

pub mod env;
mod exit;
mod flags;
mod logging;

pub use exit::{cause_of, exit, fail, id_error_cause, usage, Cause, Failure, EXIT_CODES_HELP};
pub use flags::{
    parse, BrokerArgs, BrokerTlsArgs, CombineArg, DeadlineArgs, NodeList, NodeTimeouts, QuorumArgs,
    Source, SourceArgs, TlsArgs,
};
pub use logging::{init_logging, LogFormat};

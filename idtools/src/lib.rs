//! idtools: the tooling around the ID client, none of it on the ID path.
//!
//! - [`cluster`]: starts and stops a local `redis-server` quorum (`idctl cluster up`,
//!   tests and benchmarks; [`cluster::test_quorum`] for a test), and checks the server's
//!   version.
//! - [`history`]: records ID requests ([`history::Recorder`]) and checks a history is
//!   linearizable.
//! - [`mod@bench`]: the closed-loop load driver behind `idctl bench` and the fault tests.
//! - [`failover`]: leader failover under load, measured (`idctl failover`).
//! - [`chart`]: the benchmark sweep as an SVG picture (`idctl chart`, BENCHMARKS.md).
//! - [`announced`]: child processes that announce their addresses (`idbroker`), stopped
//!   by pid on drop: for `idctl failover` (and testkit's test brokers).
//! - [`child`]: the one child-process guard ([`child::ChildGuard`]: SIGTERM, a grace,
//!   SIGKILL, by pid; reaped), of `idctl`'s children and of every test (testkit
//!   re-exports it).
//!
//! The binary `idctl` (src/bin/idctl.rs) is the command-line face of them all. What only
//! tests use (test brokers, certificates, raw clients, the deterministic simulation's
//! node model) is in the `testkit` crate.

pub mod announced;
pub mod bench;
pub mod chart;
pub mod child;
pub mod cluster;
pub mod failover;
pub mod history;

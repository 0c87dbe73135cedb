//! idtools: the tooling around the ID client, none of it on the ID path.
//!
//! - [`cluster`]: starts and stops a local `redis-server` quorum (`idctl cluster up`,
//!   tests and benchmarks; [`cluster::test_quorum`] for a test), and checks the server's
//!   version.
//! - [`history`]: records ID requests ([`history::Recorder`]) and checks a history is
//!   linearizable.
//! - [`sim`]: the deterministic simulation's in-memory node model (message loss, delay,
//!   reordering, duplication, crashes, amnesia, mutants; the rendezvous, the broker
//!   leader's heartbeat and term register), driven on tokio's paused clock.
//! - [`mod@bench`]: the closed-loop load driver behind `idctl bench` and the fault tests.
//! - [`failover`]: leader failover under load, measured (`idctl failover`).
//! - [`chart`]: the benchmark sweep as an SVG picture (`idctl chart`, BENCHMARKS.md).
//! - [`announced`]: child processes that announce their addresses (`idbroker`), killed by
//!   pid on drop: for `idctl failover` and the real-process tests.
//! - [`proc`]: test brokers on free ports ([`proc::TestBroker`]), on top of `announced`.
//! - [`pki`]: throwaway certificates for the TLS tests.
//! - [`resp`]: `redis-cli` runs and `QLIST.NEXT` replies, for the broker's RESP tests.
//! - [`raw`]: hand-driven connections to a broker's binary listener (Hello, one message,
//!   one reply, waiting for the close), for the broker's bad-input tests.
//!
//! The binary `idctl` (src/bin/idctl.rs) is the command-line face of them all.

pub mod announced;
pub mod bench;
pub mod chart;
pub mod cluster;
pub mod failover;
pub mod history;
pub mod pki;
pub mod proc;
pub mod raw;
pub mod resp;
pub mod sim;

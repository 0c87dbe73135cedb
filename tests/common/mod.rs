//! Shared harness of the fault suite: locating the workspace binaries, reading histories,
//! checking who holds a port. Child processes, the TCP proxy and the tmpfs mount are
//! testkit's (re-exported here).

// Each test file uses a different subset.
#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

/// A workspace binary, next to this test executable's directory (target/release/).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test executable");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace binaries first with `cargo build --release --workspace --bins`",
        path.display()
    );
    path
}

/// Asserts that a command succeeded without a panic (testkit's exit assertion); `what`
/// names it in the message.
#[track_caller]
pub fn check_output(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        testkit::printed(out)
    );
    testkit::assert_exit(out, 0, "");
}

/// The suite's child processes, proxies and tmpfs mounts are testkit's.
pub use testkit::proxy::{Mode, Proxy};
pub use testkit::tmpfs::Tmpfs;
pub use testkit::ChildGuard as Proc;

/// The history events of a file written by `idctl bench --history`, or a clear panic.
pub fn read_history(path: &Path) -> Vec<idtools::history::Event> {
    idtools::history::read_events(path)
        .unwrap_or_else(|e| panic!("read history {}: {e}", path.display()))
}

/// Shared list of history events recorded in this process.
pub type History = Arc<std::sync::Mutex<Vec<idtools::history::Event>>>;

/// True when the TCP socket listening on 127.0.0.1:`port` belongs to process `pid`: a
/// connect alone could reach another process that took the port (another test's server,
/// or a previous instance not yet gone). Linux only: /proc/net/tcp names the listening
/// socket's inode, /proc/PID/fd shows whether the process holds it.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    // "sl local_address rem_address st ... inode": 127.0.0.1 is 0100007F, LISTEN is 0A.
    let local = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() > 9 && f[1] == local && f[3] == "0A").then(|| format!("socket:[{}]", f[9]))
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok).any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}

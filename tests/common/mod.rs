//! Shared harness of the fault suite: locating the workspace binaries, a TCP proxy with
//! blackhole and delay switches, a sized tmpfs mount, and child processes that are
//! killed (by pid) on drop.

// Each test file uses a different subset.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

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

#[track_caller]
pub fn check_output(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A child process killed with SIGKILL (by its own pid) and reaped on drop.
pub struct Proc {
    pub name: String,
    pub child: Option<Child>,
}

impl Proc {
    /// Spawns `cmd`, naming it for messages.
    pub fn spawn(name: impl Into<String>, cmd: &mut Command) -> Proc {
        let name = name.into();
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Proc {
            name,
            child: Some(child),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn signal(&self, sig: libc::c_int) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) on a child we spawned and have not reaped.
            unsafe {
                libc::kill(pid as libc::pid_t, sig);
            }
        }
    }

    /// kill -9 and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The exit status if it has exited (reaped), `None` while it runs.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten();
        if status.is_some() {
            self.child = None;
        }
        status
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a [`Proxy`] does with the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// Accept connections but forward nothing: bytes wait in the proxy (and the kernel),
    /// as in a partition where TCP keeps retransmitting. Switching back to `Pass`
    /// delivers them late, as a healed network does: stale requests can still land.
    Blackhole,
    /// Forward each chunk after this delay (order kept).
    Delay(Duration),
}

/// A TCP proxy on a free loopback port in front of `target`, run by its own thread and
/// runtime (so it works from sync and async tests alike); stops on drop.
pub struct Proxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a proxy port");
        listener
            .set_nonblocking(true)
            .expect("non-blocking proxy listener");
        let port = listener.local_addr().expect("proxy address").port();
        let (mode, mode_rx) = watch::channel(Mode::Pass);
        let (stop, stop_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("tokio proxy listener");
                let accept = async {
                    loop {
                        let Ok((inbound, _)) = listener.accept().await else {
                            continue;
                        };
                        let mode = mode_rx.clone();
                        tokio::spawn(async move {
                            let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
                                return;
                            };
                            let _ = inbound.set_nodelay(true);
                            let _ = outbound.set_nodelay(true);
                            let (ri, wi) = inbound.into_split();
                            let (ro, wo) = outbound.into_split();
                            let a = tokio::spawn(pump(ri, wo, mode.clone()));
                            let b = tokio::spawn(pump(ro, wi, mode));
                            let _ = a.await;
                            let _ = b.await;
                        });
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = stop_rx => {}
                }
            });
            // Dropping the runtime cancels every connection task, closing its sockets.
        });
        Proxy {
            port,
            mode,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Copies `from` to `to` chunk by chunk, obeying the mode at the time each chunk is
/// forwarded. Closes `to` when `from` ends.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Hold the chunk while blackholed; stop reading more meanwhile (backpressure).
        let current = match mode.wait_for(|m| *m != Mode::Blackhole).await {
            Ok(m) => *m,
            Err(_) => return,
        };
        if let Mode::Delay(d) = current {
            tokio::time::sleep(d).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    // Deliver the EOF only once the link is up again, like everything else.
    let _ = mode.wait_for(|m| *m != Mode::Blackhole).await;
    let _ = to.shutdown().await;
}

/// A sized tmpfs mounted on a fresh directory, unmounted (lazily, so open files of
/// killed processes cannot block it) and removed on drop. Needs root, as CI has.
pub struct Tmpfs {
    pub dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` bytes.
    pub fn mount(bytes: u64) -> Tmpfs {
        let parent = tempfile::tempdir().expect("tempdir for the tmpfs mount point");
        let dir = parent.path().join("fs");
        std::fs::create_dir(&dir).expect("create the mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&dir)
            .output()
            .expect("run mount(8)");
        assert!(
            out.status.success(),
            "this test mounts a {bytes}-byte tmpfs to fill a disk and needs root (or CAP_SYS_ADMIN) for it: `mount -t tmpfs` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs {
            dir,
            _parent: parent,
        }
    }

    /// Changes the filesystem's size (more space returns at once).
    pub fn resize(&self, bytes: u64) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={bytes}")])
            .arg(&self.dir)
            .output()
            .expect("run mount(8)");
        assert!(
            out.status.success(),
            "remount tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Fills the filesystem up with a filler file; returns its path (delete it to free
    /// the space).
    pub fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.dir.join("filler");
        let mut f = std::fs::File::create(&path).expect("create filler");
        let chunk = vec![0xa5u8; 64 * 1024];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        // Byte-level fill of the last partial block.
        while let Ok(n) = f.write(&chunk[..1]) {
            if n == 0 {
                break;
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

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

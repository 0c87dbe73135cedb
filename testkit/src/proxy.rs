//! The one TCP proxy of the tests: on a free loopback port in front of one or more
//! backends, run by its own thread and runtime (so sync and async tests alike use it),
//! stopped with every connection on drop. It can be cut ([`Mode::Blackhole`], for
//! partition tests), slowed ([`Mode::Delay`]), stand as a load balancer ([`Pick`]), and
//! counts the connections it accepted.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

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

/// How the proxy picks a backend for each new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The next backend in turn, as most load balancers do.
    RoundRobin,
    /// Always the first backend, as a load balancer with client-IP affinity does for
    /// clients on one host.
    Sticky,
}

/// A TCP proxy; see the module. A connection accepted while it has no backend, or whose
/// backend refuses, is closed.
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    backends: Arc<Mutex<Vec<String>>>,
    conns: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on 127.0.0.1 in front of `target` alone.
    ///
    /// # Panics
    /// As [`Proxy::start`].
    pub fn to(target: SocketAddr) -> Proxy {
        let proxy = Proxy::start("127.0.0.1", Pick::Sticky);
        proxy.route(&[&target.to_string()]);
        proxy
    }

    /// Listens on `ip`, a free port, with no backend yet ([`Proxy::route`]), so that a
    /// server can be told the proxy's address before the server behind it starts.
    ///
    /// # Panics
    /// If it cannot bind or start its thread.
    pub fn start(ip: &str, pick: Pick) -> Proxy {
        let listener = std::net::TcpListener::bind((ip, 0)).expect("bind a proxy port");
        listener
            .set_nonblocking(true)
            .expect("non-blocking proxy listener");
        let addr = listener.local_addr().expect("proxy address");
        let (mode, mode_rx) = watch::channel(Mode::Pass);
        let (stop, stop_rx) = tokio::sync::oneshot::channel();
        let backends = Arc::new(Mutex::new(Vec::new()));
        let conns = Arc::new(AtomicUsize::new(0));
        let (b, c) = (backends.clone(), conns.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(async move {
                let listener =
                    tokio::net::TcpListener::from_std(listener).expect("tokio proxy listener");
                tokio::select! {
                    _ = accept_loop(listener, pick, mode_rx, b, c) => {}
                    _ = stop_rx => {}
                }
            });
            // Dropping the runtime cancels every connection task, closing its sockets.
        });
        Proxy {
            addr,
            mode,
            backends,
            conns,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The backends (`host:port`) of the connections accepted from now on.
    pub fn route(&self, backends: &[&str]) {
        *self.backends.lock().expect("backends lock") =
            backends.iter().map(|b| b.to_string()).collect();
    }

    /// What it does with bytes from now on, on every connection.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// How many connections it accepted so far.
    pub fn conns(&self) -> usize {
        self.conns.load(Relaxed)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `host:port`.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// `redis://host:port`, for a proxy in front of a Redis node.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
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

async fn accept_loop(
    listener: tokio::net::TcpListener,
    pick: Pick,
    mode: watch::Receiver<Mode>,
    backends: Arc<Mutex<Vec<String>>>,
    conns: Arc<AtomicUsize>,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        let n = conns.fetch_add(1, Relaxed);
        let backend = {
            let b = backends.lock().expect("backends lock");
            match pick {
                Pick::RoundRobin if !b.is_empty() => Some(b[n % b.len()].clone()),
                Pick::Sticky => b.first().cloned(),
                Pick::RoundRobin => None,
            }
        };
        let Some(backend) = backend else { continue };
        let mode = mode.clone();
        tokio::spawn(async move {
            let Ok(outbound) = tokio::net::TcpStream::connect(&backend).await else {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// An echo server on a free port: each connection gets its bytes back.
    fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[test]
    fn passes_holds_while_cut_and_delivers_when_healed() {
        let p = Proxy::to(echo());
        let mut s = TcpStream::connect(p.addr()).expect("connect");
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        let mut got = [0u8; 2];
        s.write_all(b"hi").expect("write");
        s.read_exact(&mut got).expect("echo through the proxy");
        assert_eq!(&got, b"hi");
        p.set(Mode::Blackhole);
        s.write_all(b"yo").expect("write");
        assert!(s.read_exact(&mut got).is_err(), "nothing passes while cut");
        p.set(Mode::Pass);
        s.set_read_timeout(Some(crate::WAIT_LIMIT))
            .expect("timeout");
        s.read_exact(&mut got).expect("delivered once healed");
        assert_eq!(&got, b"yo");
        assert_eq!(p.conns(), 1);
    }

    #[test]
    fn round_robin_spreads_connections_and_no_backend_closes() {
        let p = Proxy::start("127.0.0.1", Pick::RoundRobin);
        let mut s = TcpStream::connect(p.addr()).expect("connect");
        s.set_read_timeout(Some(crate::WAIT_LIMIT))
            .expect("timeout");
        assert_eq!(s.read(&mut [0u8; 1]).expect("closed, not reset"), 0);
        p.route(&[&echo().to_string(), &echo().to_string()]);
        for _ in 0..2 {
            let mut s = TcpStream::connect(p.addr()).expect("connect");
            s.write_all(b"x").expect("write");
            let mut got = [0u8; 1];
            s.read_exact(&mut got).expect("echo");
        }
        assert_eq!(p.conns(), 3);
    }
}

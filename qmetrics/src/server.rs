//! The HTTP side: hyper's HTTP/1 server on a listener, three paths, bounded.

use crate::MetricsError;
use futures::future::BoxFuture;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default time a client has from connecting (or from its previous response) to the end
/// of a request's headers: a client that trickles headers (slowloris) loses its slot
/// after this. Prometheus sends a whole request at once, in one packet.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// Default cap on open connections: a few scrapers and probes need a handful; the cap
/// bounds what slow or hostile clients can hold (memory, descriptors).
pub const MAX_CONNECTIONS: usize = 64;

/// Default cap on open connections from one peer (one IPv4 address, or one IPv6 /64):
/// a scraper uses one (kept alive), a probe another. A connection over it is closed at
/// once, so one hostile peer holds at most this many of [`MAX_CONNECTIONS`] and the
/// others always find a slot.
pub const MAX_CONNECTIONS_PER_PEER: usize = 4;

/// Default longest life of one connection (then it is closed, even mid-response): a
/// client that stops reading its response must not hold a slot forever. Scrapers
/// reconnect.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// Default time `/readyz` gives the readiness check before answering 503.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// The endpoint's bounds.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Time from connect (or the previous response) to the end of a request's headers.
    pub header_read_timeout: Duration,
    /// Open connections at most; one more is closed at once.
    pub max_connections: usize,
    /// Open connections at most from one IPv4 address or one IPv6 /64.
    pub max_connections_per_peer: usize,
    /// Longest life of one connection, then it is closed, even mid-response.
    pub connection_lifetime: Duration,
    /// Time `/readyz` gives the readiness check before answering 503.
    pub ready_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            max_connections_per_peer: MAX_CONNECTIONS_PER_PEER,
            connection_lifetime: CONNECTION_LIFETIME,
            ready_timeout: READY_TIMEOUT,
        }
    }
}

/// The readiness check: `Ok` when ready, else the one-line reason.
pub type ReadyCheck = Box<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// What the endpoint serves.
pub struct Endpoints {
    /// Encoded on every `GET /metrics`.
    pub registry: Registry,
    /// Run on every `GET /readyz`, within [`Limits::ready_timeout`].
    pub ready: ReadyCheck,
}

impl Endpoints {
    /// The `/metrics` body: the registry in the Prometheus text format.
    ///
    /// # Errors
    /// Only a collector's formatting error.
    pub fn metrics_text(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Binds `addr` for [`serve`].
///
/// # Errors
/// [`MetricsError::Bind`] naming the address.
pub async fn bind(addr: &str) -> Result<TcpListener, MetricsError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// Serves `endpoints` on `listener` forever (abort the task to stop). Each connection
/// runs in its own task, so a slow one never delays another. A new connection over its
/// peer's limit or over the connection cap is closed at once. Besides the endpoints'
/// registry, `/metrics` carries the endpoint's own counters
/// (`qlist_metrics_connections_refused_total`, `..._timed_out_total`).
pub async fn serve(listener: TcpListener, endpoints: Arc<Endpoints>, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let peers = Arc::new(Peers::new(limits.max_connections_per_peer));
    let served = Arc::new(Served::new(endpoints));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Typically EMFILE: pausing lets connections close instead of spinning.
                tracing::warn!("metrics endpoint: accept failed: {e}; pausing 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(peer_slot) = peers.admit(peer.ip()) else {
            tracing::debug!(%peer, "metrics endpoint: peer's connection limit reached, closing");
            served.counters.refused(REFUSED_PEER_LIMIT);
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics endpoint: connection cap reached, closing");
            served.counters.refused(REFUSED_CONNECTION_CAP);
            continue;
        };
        tokio::spawn(serve_connection(
            stream,
            peer,
            served.clone(),
            limits.clone(),
            (slot, peer_slot),
        ));
    }
}

/// One connection, under the header deadline and the lifetime; `slots` are released when
/// it ends.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    served: Arc<Served>,
    limits: Limits,
    slots: (OwnedSemaphorePermit, PeerSlot),
) {
    let ready_timeout = limits.ready_timeout;
    let for_service = served.clone();
    let service = hyper::service::service_fn(move |req| {
        let served = for_service.clone();
        async move { Ok::<_, Infallible>(respond(&served, &req, ready_timeout).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(limits.connection_lifetime, conn).await {
        Ok(Err(e)) if e.is_timeout() => {
            tracing::debug!(%peer, "metrics endpoint: request headers not complete in time");
            served.counters.timed_out(TIMED_OUT_HEADERS);
        }
        Ok(Err(e)) => tracing::debug!(%peer, "metrics endpoint: connection: {e}"),
        Err(_) => {
            tracing::debug!(%peer, "metrics endpoint: connection lifetime over");
            served.counters.timed_out(TIMED_OUT_LIFETIME);
        }
        Ok(Ok(())) => {}
    }
    drop(slots);
}

/// What a connection task needs: the binary's endpoints and the endpoint's own counters.
struct Served {
    endpoints: Arc<Endpoints>,
    counters: ConnectionCounters,
    /// Holds `counters` only: encoded after the endpoints' registry on `/metrics`.
    own: Registry,
}

impl Served {
    fn new(endpoints: Arc<Endpoints>) -> Served {
        let mut own = Registry::default();
        let counters = ConnectionCounters::new(&mut own);
        Served {
            endpoints,
            counters,
            own,
        }
    }

    /// The `/metrics` body: the binary's registry, then the endpoint's own counters.
    fn metrics_text(&self) -> Result<String, std::fmt::Error> {
        let mut out = self.endpoints.metrics_text()?;
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.own)?;
        Ok(out)
    }
}

/// `reason` of a connection closed at once because its peer already had
/// [`Limits::max_connections_per_peer`] open.
const REFUSED_PEER_LIMIT: &str = "peer_limit";
/// `reason` of a connection closed at once at [`Limits::max_connections`].
const REFUSED_CONNECTION_CAP: &str = "connection_cap";
/// `reason` of a connection closed because its request headers were not complete within
/// [`Limits::header_read_timeout`] (an idle kept-alive connection closed then is not
/// counted: that is normal).
const TIMED_OUT_HEADERS: &str = "headers";
/// `reason` of a connection closed at [`Limits::connection_lifetime`].
const TIMED_OUT_LIFETIME: &str = "lifetime";

type Reason = [(&'static str, &'static str); 1];

/// The endpoint's own counters, so an operator sees a slow or hostile client at work:
/// `qlist_metrics_connections_refused_total{reason}` and
/// `qlist_metrics_connections_timed_out_total{reason}`.
struct ConnectionCounters {
    refused: Family<Reason, Counter>,
    timed_out: Family<Reason, Counter>,
}

impl ConnectionCounters {
    /// Registers both families in `registry`, every reason at 0 (so `rate()` and alerts
    /// see the series before the first event).
    fn new(registry: &mut Registry) -> ConnectionCounters {
        let counters = ConnectionCounters {
            refused: Family::default(),
            timed_out: Family::default(),
        };
        for r in [REFUSED_PEER_LIMIT, REFUSED_CONNECTION_CAP] {
            drop(counters.refused.get_or_create(&[("reason", r)]));
        }
        for r in [TIMED_OUT_HEADERS, TIMED_OUT_LIFETIME] {
            drop(counters.timed_out.get_or_create(&[("reason", r)]));
        }
        registry.register(
            "qlist_metrics_connections_refused",
            "Connections to the metrics endpoint closed at once: over the peer's limit or the connection cap",
            counters.refused.clone(),
        );
        registry.register(
            "qlist_metrics_connections_timed_out",
            "Connections to the metrics endpoint closed by a deadline: request headers too slow, or lifetime over",
            counters.timed_out.clone(),
        );
        counters
    }

    fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&[("reason", reason)]).inc();
    }

    fn timed_out(&self, reason: &'static str) {
        self.timed_out.get_or_create(&[("reason", reason)]).inc();
    }
}

/// Open connections per peer, so that one peer cannot hold every connection slot.
/// Only peers with a connection open have an entry: the table is never larger than
/// [`Limits::max_connections`] plus the connections being refused.
struct Peers {
    open: Mutex<HashMap<IpAddr, usize>>,
    max: usize,
}

impl Peers {
    fn new(max: usize) -> Peers {
        Peers {
            open: Mutex::new(HashMap::new()),
            max,
        }
    }

    /// A slot for one more connection from `ip`, or `None` when its peer has `max` open.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<PeerSlot> {
        let key = peer_key(ip);
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(key).or_insert(0);
        if *n >= self.max {
            if *n == 0 {
                open.remove(&key);
            }
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            key,
        })
    }
}

/// One open connection of a peer, given back on drop.
struct PeerSlot {
    peers: Arc<Peers>,
    key: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// Who counts as one peer: an IPv4 address (also when it arrives IPv4-mapped on an IPv6
/// listener), or an IPv6 /64, since one IPv6 host usually has a whole /64 to pick
/// source addresses from.
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(prefix))
        }
        v4 => v4,
    }
}

async fn respond(
    served: &Served,
    req: &Request<Incoming>,
    ready_timeout: Duration,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".to_string());
    }
    match req.uri().path() {
        "/metrics" => match served.metrics_text() {
            Ok(body) => {
                let mut resp = text(StatusCode::OK, body);
                resp.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static(
                        prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                    ),
                );
                resp
            }
            Err(_) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot encode the metrics\n".to_string(),
            ),
        },
        "/healthz" => text(StatusCode::OK, "ok\n".to_string()),
        "/readyz" => match tokio::time::timeout(ready_timeout, (served.endpoints.ready)()).await {
            Ok(Ok(())) => text(StatusCode::OK, "ready\n".to_string()),
            Ok(Err(reason)) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {}\n", one_line(&reason)),
            ),
            Err(_) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: readiness check took longer than {ready_timeout:?}\n"),
            ),
        },
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n".to_string(),
        ),
    }
}

/// `reason` on one line (a multi-line error would break the one-line contract).
fn one_line(reason: &str) -> String {
    reason.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_is_an_ipv4_address_or_an_ipv6_slash_64() {
        let key = |s: &str| peer_key(s.parse().expect("address"));
        assert_eq!(key("192.0.2.7"), key("192.0.2.7"));
        assert_ne!(key("192.0.2.7"), key("192.0.2.8"));
        assert_eq!(key("::ffff:192.0.2.7"), key("192.0.2.7"), "IPv4-mapped");
        assert_eq!(
            key("2001:db8:1:2::1"),
            key("2001:db8:1:2:ffff::9"),
            "same /64"
        );
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
    }

    #[test]
    fn a_peer_gets_its_limit_and_its_slots_back() {
        let peers = Arc::new(Peers::new(2));
        let a: IpAddr = "10.0.0.1".parse().expect("a");
        let b: IpAddr = "10.0.0.2".parse().expect("b");
        let first = peers.admit(a).expect("first");
        let _second = peers.admit(a).expect("second");
        assert!(peers.admit(a).is_none(), "a third from the same peer");
        let _other = peers.admit(b).expect("another peer is not affected");
        drop(first);
        assert!(peers.admit(a).is_some(), "a slot given back");
        let none = Arc::new(Peers::new(0));
        assert!(none.admit(a).is_none());
        assert!(none.open.lock().expect("lock").is_empty(), "no entry left");
    }
}

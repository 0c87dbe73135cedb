//! The HTTP side: hyper's HTTP/1 server on a listener, three paths, bounded.

use crate::MetricsError;
use futures::future::BoxFuture;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Default time a client has from connecting (or from its previous response) to the end
/// of a request's headers: a client that trickles headers (slowloris) loses its slot
/// after this. Prometheus sends a whole request at once.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Default cap on open connections: a few scrapers and probes need a handful; the cap
/// bounds what slow or hostile clients can hold.
pub const MAX_CONNECTIONS: usize = 64;

/// Default longest life of one connection (then it is closed, even mid-response): a
/// client that stops reading its response must not hold a slot forever. Scrapers
/// reconnect.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// Default time `/readyz` gives the readiness check before answering 503.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// The endpoint's bounds.
#[derive(Debug, Clone)]
pub struct Limits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
    pub connection_lifetime: Duration,
    pub ready_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_read_timeout: HEADER_READ_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
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
/// runs in its own task, so a slow one never delays another; at the connection cap a
/// new connection is closed at once.
pub async fn serve(listener: TcpListener, endpoints: Arc<Endpoints>, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
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
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "metrics endpoint: connection cap reached, closing");
            continue;
        };
        let endpoints = endpoints.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            let ready_timeout = limits.ready_timeout;
            let service = hyper::service::service_fn(move |req| {
                let endpoints = endpoints.clone();
                async move { Ok::<_, Infallible>(respond(&endpoints, &req, ready_timeout).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(limits.connection_lifetime, conn).await {
                Ok(Err(e)) => tracing::debug!(%peer, "metrics endpoint: connection: {e}"),
                Err(_) => tracing::debug!(%peer, "metrics endpoint: connection lifetime over"),
                Ok(Ok(())) => {}
            }
            drop(slot);
        });
    }
}

async fn respond(
    endpoints: &Endpoints,
    req: &Request<Incoming>,
    ready_timeout: Duration,
) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".to_string());
    }
    match req.uri().path() {
        "/metrics" => match endpoints.metrics_text() {
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
        "/readyz" => match tokio::time::timeout(ready_timeout, (endpoints.ready)()).await {
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

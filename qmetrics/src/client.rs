//! A one-shot HTTP/1 GET over hyper's client connection: enough for tests and tools to
//! read `/metrics`, `/readyz` or Prometheus' query API without another HTTP stack.

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::time::Duration;
use tokio::net::TcpStream;

/// Why a [`get`] failed.
#[derive(Debug, thiserror::Error)]
pub enum GetError {
    /// The GET did not complete: no connection, a broken exchange, or the timeout.
    #[error("GET http://{addr}{path}: {what}")]
    Failed {
        /// The server's `host:port`, as given to [`get`].
        addr: String,
        /// The request path with its query string, as given to [`get`].
        path: String,
        /// What failed (connect, request, body, timeout), for a person to read.
        what: String,
    },
}

/// `GET http://{addr}{path}` (path with its query string), within `timeout`: the status
/// code and the body (lossily decoded as UTF-8).
///
/// # Errors
/// [`GetError`] naming the URL and what failed (connect, request, body, timeout).
pub async fn get(addr: &str, path: &str, timeout: Duration) -> Result<(u16, String), GetError> {
    let fail = |what: String| GetError::Failed {
        addr: addr.to_string(),
        path: path.to_string(),
        what,
    };
    let exchange = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| fail(format!("connect: {e}")))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| fail(format!("handshake: {e}")))?;
        let driver = tokio::spawn(conn);
        let req = hyper::Request::get(path)
            .header(hyper::header::HOST, addr)
            .body(Empty::<Bytes>::new())
            .map_err(|e| fail(format!("request: {e}")))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| fail(format!("send: {e}")))?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| fail(format!("body: {e}")))?
            .to_bytes();
        driver.abort();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| fail(format!("no answer within {timeout:?}")))?
}

/// Runs `promtool check metrics` (Debian package prometheus) on `exposition`: `Ok` when
/// it accepts it, else why not (promtool's own words, and the exposition). For tests and
/// tools that check what `/metrics` serves with Prometheus' own linter.
///
/// # Errors
/// promtool missing, failing to run, or rejecting the exposition.
pub fn promtool_check(exposition: &str) -> Result<(), String> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start promtool (Debian package prometheus): {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(exposition.as_bytes())
            .map_err(|e| format!("cannot pipe the exposition to promtool: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("promtool: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "promtool check metrics failed ({}):\n{}{}\n--- exposition ---\n{exposition}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

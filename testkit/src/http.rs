//! The tests' own small HTTP/1.1 client, for the servers they start (SeaweedFS's filer
//! and master, Prometheus's query API): one request per connection, the whole response
//! read, a limit on every wait. No HTTP crate: this needs neither TLS nor keep-alive.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How long one request may wait to connect, send or read: the servers are local.
pub(crate) const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// A response: its status and whole body.
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

/// One HTTP/1.1 request to `addr` (`Connection: close`), the whole response read.
pub(crate) fn http(addr: &str, method: &str, path: &str, body: &[u8]) -> std::io::Result<Response> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(HTTP_TIMEOUT))?;
    s.set_write_timeout(Some(HTTP_TIMEOUT))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\n\
         Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse_response(&raw).ok_or_else(|| {
        let start = String::from_utf8_lossy(&raw[..raw.len().min(200)]).into_owned();
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad HTTP response: {start:?}"),
        )
    })
}

/// Status and body of a whole response (body as sent, or de-chunked).
fn parse_response(raw: &[u8]) -> Option<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let rest = &raw[end + 4..];
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Some(Response { status, body })
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n")?;
        let size_field = std::str::from_utf8(&rest[..eol]).ok()?;
        let size = usize::from_str_radix(size_field.split(';').next()?.trim(), 16).ok()?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_and_plain_responses_parse() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n")
            .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"abcde"[..]));
        let r = parse_response(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"no"[..]));
    }
}

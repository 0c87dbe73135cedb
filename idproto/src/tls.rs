//! What both ends of a broker connection need of TLS (feature `tls`): a connection's
//! halves, plain or TLS ([`ReadHalf`], [`WriteHalf`]), which the framed connection of
//! the broker client and of the broker's listeners reads and writes through, and PEM
//! loading with errors that name the file and never show a key ([`load_certs`],
//! [`load_key`]). Plain TCP keeps tokio's lock-free owned halves; only TLS goes through
//! `tokio::io::split`. rustls with the `ring` provider; no OpenSSL.
//!
//! Here rather than in `idclient` so that the server does not link the client for its
//! own sockets.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::TlsStream;

/// Makes rustls' `ring` provider the process default, unless one is already installed:
/// rustls cannot pick one itself when several are compiled in.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: a provider is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The content of `path`, or an error naming it as `what` (never its content).
///
/// # Errors
/// The file cannot be read.
pub fn read_pem_file(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{what} {}: cannot read it: {e}", path.display()))
}

/// The certificates in `pem` (read from `path`, named `what` in errors): at least one,
/// and only well-formed ones.
///
/// # Errors
/// No certificate, or a malformed one (named).
pub fn certificates(
    pem: &[u8],
    path: &Path,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let mut certs = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem) {
        certs.push(
            cert.map_err(|e| format!("{what} {}: bad PEM certificate: {e}", path.display()))?,
        );
    }
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}

/// The certificates (PEM) in `path`, named `what` in errors.
///
/// # Errors
/// The file cannot be read, or holds no certificate or a malformed one (named).
pub fn load_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    certificates(&read_pem_file(path, what)?, path, what)
}

/// The private key (PEM: PKCS#8, PKCS#1 or SEC1) in `path`, named `what` in errors.
///
/// # Errors
/// The file cannot be read or holds no usable key; the error names the file and never
/// shows its content.
pub fn load_key(path: &Path, what: &str) -> Result<PrivateKeyDer<'static>, String> {
    let pem = read_pem_file(path, what)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("{what} {}: no usable PEM private key ({e})", path.display()))
}

/// An I/O error on a connection, in words when TLS failed: certificate verification, a
/// client certificate the peer requires, another alert, or a peer that does not speak
/// TLS. Any other error as it is.
pub fn describe(e: &io::Error) -> String {
    use rustls::{AlertDescription, Error};
    match e.get_ref().and_then(|i| i.downcast_ref::<Error>()) {
        Some(Error::InvalidCertificate(_)) => format!(
            "TLS: certificate verification failed: {e} (is the CA file the one that signed the peer's certificate, and is that certificate issued to this name?)"
        ),
        Some(Error::AlertReceived(AlertDescription::CertificateRequired)) => format!(
            "TLS: the broker requires a client certificate (--broker-tls-cert, --broker-tls-key): {e}"
        ),
        Some(Error::AlertReceived(_)) => {
            format!("TLS handshake failed: the peer refused it: {e}")
        }
        Some(_) => format!("TLS handshake failed: {e} (does the peer listen with TLS?)"),
        None => e.to_string(),
    }
}

/// The reading half of a connection, plain or TLS.
#[derive(Debug)]
pub enum ReadHalf {
    /// A plain TCP connection's.
    Plain(OwnedReadHalf),
    /// A TLS connection's (client or server side).
    Tls(tokio::io::ReadHalf<TlsStream<TcpStream>>),
}

/// The writing half of a connection, plain or TLS.
#[derive(Debug)]
pub enum WriteHalf {
    /// A plain TCP connection's.
    Plain(OwnedWriteHalf),
    /// A TLS connection's (client or server side).
    Tls(tokio::io::WriteHalf<TlsStream<TcpStream>>),
}

/// A plain TCP connection's halves, Nagle off (requests and replies are small and
/// latency-bound; both ends batch their writes themselves).
///
/// # Errors
/// If the socket option cannot be set.
pub fn split_plain(stream: TcpStream) -> io::Result<(ReadHalf, WriteHalf)> {
    stream.set_nodelay(true)?;
    let (rd, wr) = stream.into_split();
    Ok((ReadHalf::Plain(rd), WriteHalf::Plain(wr)))
}

/// A TLS connection's halves (Nagle is set on the TCP stream before the handshake).
pub fn split_tls(stream: TlsStream<TcpStream>) -> (ReadHalf, WriteHalf) {
    let (rd, wr) = tokio::io::split(stream);
    (ReadHalf::Tls(rd), WriteHalf::Tls(wr))
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadHalf::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ReadHalf::Tls(r) => match Pin::new(r).poll_read(cx, buf) {
                // A peer that closes without TLS close_notify (most clients, on exit):
                // an end of stream like TCP's. Both protocols delimit their messages,
                // so a message cut short is still seen as truncated.
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    Poll::Ready(Ok(()))
                }
                other => other,
            },
        }
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Tls(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            WriteHalf::Tls(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WriteHalf::Plain(w) => w.is_write_vectored(),
            WriteHalf::Tls(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            WriteHalf::Plain(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

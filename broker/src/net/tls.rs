//! TLS on the broker's own listeners (`--listen-tls-cert`, `--listen-tls-key`, and
//! optionally `--listen-tls-client-ca`): one layer under both protocols, binary and RESP.
//!
//! The TLS handshake runs in the connection's own task ([`accept`]), never in the accept
//! loop, and within the handshake timeout counted from accept (the same budget as the
//! binary `Hello`, which follows it): a client that opens TCP and sends nothing costs
//! only its slot until then. A client that speaks plain TCP to a TLS listener is told so
//! in its own protocol (a `Refused` frame, a RESP `-ERR`), in clear text, and closed.
//!
//! Connections then read and write through [`ReadHalf`] and [`WriteHalf`] (idproto's,
//! the broker client's too): tokio's owned TCP halves for plain connections, as before,
//! `tokio::io::split` halves of the TLS stream otherwise.

use crate::net::refuse::{self, Protocol};
use idproto::tls::{self as socket, load_certs, load_key, ReadHalf, WriteHalf};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout_at, Instant};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsStream};

/// The first two bytes of every TLS connection: a handshake record (22), version 3.x.
/// A binary frame cannot start so unless its length is at least 0x0316 and a RESP
/// request starts with `*`, so a mismatch is a plain-TCP client.
const TLS_RECORD_START: [u8; 2] = [0x16, 0x03];

/// Pause between two looks at a connection whose first byte came alone.
const PEEK_PAUSE: Duration = Duration::from_millis(10);

/// The listeners' certificate and key, and the CA client certificates must chain to
/// (if any). Its `Debug` names the files, never their contents.
#[derive(Clone)]
pub struct ListenTls {
    cert_file: PathBuf,
    client_ca_file: Option<PathBuf>,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for ListenTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenTls")
            .field("cert_file", &self.cert_file)
            .field("client_ca_file", &self.client_ca_file)
            .finish_non_exhaustive()
    }
}

impl ListenTls {
    /// Loads the certificate chain in `cert_file` (PEM, leaf first) and its private key
    /// in `key_file`; with `client_ca_file`, clients must present a certificate that
    /// chains to a CA in it.
    ///
    /// # Errors
    /// A file that cannot be read or holds no usable certificate (or key), or a key that
    /// does not match the certificate: named, without any of the key's content.
    pub fn load(
        cert_file: &Path,
        key_file: &Path,
        client_ca_file: Option<&Path>,
    ) -> Result<ListenTls, String> {
        socket::install_crypto_provider();
        let chain = load_certs(cert_file, "TLS certificate")?;
        let key = load_key(key_file, "TLS key")?;
        let builder = match client_ca_file {
            None => ServerConfig::builder().with_no_client_auth(),
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for cert in load_certs(path, "TLS client CA file")? {
                    roots.add(cert).map_err(|e| {
                        format!("TLS client CA file {}: unusable CA: {e}", path.display())
                    })?;
                }
                let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .map_err(|e| format!("TLS client CA file {}: {e}", path.display()))?;
                ServerConfig::builder().with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_single_cert(chain, key).map_err(|e| {
            format!(
                "TLS certificate {} and key {}: {e}",
                cert_file.display(),
                key_file.display()
            )
        })?;
        Ok(ListenTls {
            cert_file: cert_file.to_path_buf(),
            client_ca_file: client_ca_file.map(Path::to_path_buf),
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }
}

/// Why a connection ended before its TLS handshake completed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    #[error("no TLS handshake within {0:?}")]
    Timeout(Duration),
    #[error("plain TCP on a TLS listener (told to use TLS)")]
    NotTls,
    #[error("evicted during the TLS handshake: the broker is at its connection cap")]
    Evicted,
    #[error("{0}")]
    Handshake(String),
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
}

/// The TLS handshake of a connection accepted on a TLS listener, to be completed by
/// `deadline` (`limit` after accept, said in the error), and the connection's halves.
/// `Ok(None)`: the client left before sending anything.
///
/// # Errors
/// A handshake that failed, timed out, or never began (plain TCP: told so first, in
/// `protocol`).
pub(crate) async fn accept(
    tls: &ListenTls,
    stream: TcpStream,
    protocol: Protocol,
    deadline: Instant,
    limit: Duration,
) -> Result<Option<(ReadHalf, WriteHalf)>, TlsError> {
    stream.set_nodelay(true)?;
    match timeout_at(deadline, handshake(&tls.acceptor, stream, protocol)).await {
        Ok(s) => Ok(s?.map(socket::split_tls)),
        Err(_) => Err(TlsError::Timeout(limit)),
    }
}

/// Waits for the client's first bytes: a TLS handshake record is accepted, anything
/// else is told to use TLS. `Ok(None)`: closed before sending anything.
async fn handshake(
    acceptor: &TlsAcceptor,
    mut stream: TcpStream,
    protocol: Protocol,
) -> Result<Option<TlsStream<TcpStream>>, TlsError> {
    let mut first = [0u8; 2];
    loop {
        match stream.peek(&mut first).await? {
            0 => return Ok(None),
            1 if first[0] == TLS_RECORD_START[0] => sleep(PEEK_PAUSE).await,
            _ => break,
        }
    }
    if first != TLS_RECORD_START {
        refuse::plain_on_tls(&mut stream, protocol).await;
        return Err(TlsError::NotTls);
    }
    match acceptor.accept(stream).await {
        Ok(s) => Ok(Some(TlsStream::Server(s))),
        Err(e) => Err(TlsError::Handshake(socket::describe(&e))),
    }
}

//! [`ListenTls`]: the certificate, key and client CA of the broker's own TLS listeners
//! (`--listen-tls-cert`, `--listen-tls-key`, `--listen-tls-client-ca`), loaded and
//! checked at startup. A setting, held by [`BrokerConfig`](crate::BrokerConfig); the
//! handshakes under both protocols are `net::tls`'s.

use idproto::tls::{self as socket, load_certs, load_key};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

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

impl ListenTls {
    /// The acceptor the handshakes run through.
    pub(crate) fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }
}

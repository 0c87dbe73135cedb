//! TLS for `rediss://` nodes ([`TlsConfig`]): the CA that signed the nodes' certificates,
//! and the client certificate presented to nodes that require one. rustls with the `ring`
//! provider; no OpenSSL.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};

/// How a client reaches `rediss://` nodes. The same settings apply to every node of a
/// quorum, and every connection to it (commands and the combining subscription).
///
/// With TLS settings, every node must be a `rediss://` URL: a `redis://` node among
/// them is refused, since it would send the same credentials in clear text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM file with the CA certificate(s) the nodes' certificates must chain to. `None`:
    /// the system's trust store.
    pub ca_file: Option<PathBuf>,
    /// The client certificate presented to nodes started with `tls-auth-clients yes`.
    pub client_cert: Option<ClientCert>,
}

/// A client certificate and its private key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The certificate (chain), leaf first.
    pub cert_file: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

impl TlsConfig {
    /// True when a CA file or a client certificate is given.
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.client_cert.is_some()
    }

    /// The files' contents, checked to hold what they should, for the redis crate.
    ///
    /// # Errors
    /// A file that cannot be read or holds no certificate (or key), named.
    pub(crate) fn load(&self) -> Result<redis::TlsCertificates, String> {
        let root_cert = match &self.ca_file {
            Some(path) => {
                let pem = read(path, "CA file")?;
                certificates(&pem, path, "CA file")?;
                Some(pem)
            }
            None => None,
        };
        let client_tls = match &self.client_cert {
            Some(ClientCert {
                cert_file,
                key_file,
            }) => {
                let client_cert = read(cert_file, "client certificate")?;
                certificates(&client_cert, cert_file, "client certificate")?;
                let client_key = read(key_file, "client key")?;
                // The parse error names no key material, only what is wrong.
                PrivateKeyDer::from_pem_slice(&client_key).map_err(|e| {
                    format!(
                        "client key {}: no usable PEM private key ({e})",
                        key_file.display()
                    )
                })?;
                Some(redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                })
            }
            None => None,
        };
        Ok(redis::TlsCertificates {
            client_tls,
            root_cert,
        })
    }
}

/// The content of `path`, or an error naming it as `what` (never its content).
pub(crate) fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{what} {}: cannot read it: {e}", path.display()))
}

/// The certificates in `pem` (read from `path`, named `what` in errors): at least one,
/// and only well-formed ones.
pub(crate) fn certificates(
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

/// Makes rustls' `ring` provider the process default, unless one is already installed:
/// rustls cannot pick one itself when several are compiled in.
pub(crate) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: a provider is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

//! TLS for `rediss://` nodes ([`TlsConfig`]): the CA that signed the nodes' certificates,
//! and the client certificate presented to nodes that require one. rustls with the `ring`
//! provider; no OpenSSL.

// Shared with the broker's own listeners, through idproto (its feature `tls`).
pub(crate) use idproto::tls::{certificates, install_crypto_provider, read_pem_file as read};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use std::path::PathBuf;

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

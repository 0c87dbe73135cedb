//! Throwaway certificates for TLS tests (rcgen), as PEM files in a temp dir: a CA, a
//! server certificate for `127.0.0.1` and `localhost` signed by it, a client certificate
//! signed by it, and a second CA that signed none of them. Used by the tests of
//! `rediss://` nodes (with [`LocalQuorum::temp_tls`](idtools::cluster::LocalQuorum::temp_tls))
//! and of idbroker's TLS listeners.

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// The certificates, as PEM files in [`Pki::dir`] (deleted on drop).
pub struct Pki {
    /// The temp dir holding the files.
    pub dir: tempfile::TempDir,
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// For `127.0.0.1` and `localhost` (server authentication).
    pub server_cert: PathBuf,
    /// The server certificate's key.
    pub server_key: PathBuf,
    /// Client authentication, signed by [`Pki::ca`].
    pub client_cert: PathBuf,
    /// The client certificate's key.
    pub client_key: PathBuf,
    /// A CA that signed nothing here.
    pub other_ca: PathBuf,
}

impl Pki {
    /// TLS for a quorum's nodes ([`idtools::cluster::test_quorum_tls`]): they present the
    /// server certificate and check client certificates against the CA, requiring one if
    /// `require_client_cert`.
    pub fn tls_nodes(&self, require_client_cert: bool) -> idtools::cluster::TlsNodes {
        idtools::cluster::TlsNodes {
            cert_file: self.server_cert.clone(),
            key_file: self.server_key.clone(),
            ca_file: self.ca.clone(),
            require_client_cert,
        }
    }

    /// Makes the certificates and writes them to a fresh temp dir.
    ///
    /// # Errors
    /// If a key or certificate cannot be made, or a file cannot be written.
    pub fn new() -> anyhow::Result<Pki> {
        let dir = tempfile::tempdir().context("temp dir for certificates")?;
        let root = ca("qlist test CA")?;
        let other = ca("some other CA")?;
        let (server_cert, server_key) = leaf(
            vec!["127.0.0.1".to_string(), "localhost".to_string()],
            "127.0.0.1",
            // A broker's certificate is also its client certificate when it forwards to
            // the leader (`idbroker --peer-tls-ca`).
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            &root,
        )?;
        let (client_cert, client_key) = leaf(
            Vec::new(),
            "qlist",
            &[ExtendedKeyUsagePurpose::ClientAuth],
            &root,
        )?;
        let d = dir.path();
        Ok(Pki {
            ca: write(d, "ca.pem", &root.0.pem())?,
            server_cert: write(d, "server.pem", &server_cert)?,
            server_key: write(d, "server.key", &server_key)?,
            client_cert: write(d, "client.pem", &client_cert)?,
            client_key: write(d, "client.key", &client_key)?,
            other_ca: write(d, "other-ca.pem", &other.0.pem())?,
            dir,
        })
    }
}

fn ca(name: &str) -> anyhow::Result<(rcgen::Certificate, KeyPair)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let cert = params.self_signed(&key)?;
    Ok((cert, key))
}

fn leaf(
    sans: Vec<String>,
    name: &str,
    usages: &[ExtendedKeyUsagePurpose],
    (ca, ca_key): &(rcgen::Certificate, KeyPair),
) -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(sans)?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = usages.to_vec();
    let cert = params.signed_by(&key, ca, ca_key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn write(dir: &Path, name: &str, pem: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, pem).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

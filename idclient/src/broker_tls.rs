//! TLS on idbroker's own listeners (`idbroker --listen-tls-cert`), both ends of it:
//!
//! - [`BrokerTls`]: what a [`BrokerClient`](crate::broker_client::BrokerClient) trusts (the
//!   CA that signed the brokers' certificates), the name it expects, and the client
//!   certificate it presents to brokers that require one.
//! - [`ReadHalf`] and [`WriteHalf`]: a connection's halves, plain TCP or TLS, which the
//!   framed connection of both ends reads and writes through. Plain TCP keeps tokio's
//!   lock-free owned halves; only TLS goes through `tokio::io::split`.
//! - [`load_certs`] and [`load_key`]: PEM files, with errors that name the file and
//!   never show a key (the broker loads its certificate with them too).
//!
//! rustls with the `ring` provider, as for `rediss://` nodes ([`crate::TlsConfig`]).

pub use idproto::tls::{
    describe, load_certs, load_key, split_plain, split_tls, ReadHalf, WriteHalf,
};

use crate::node::tls::install_crypto_provider;
use crate::{ClientCert, IdError};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::{TlsConnector, TlsStream};

/// How a broker client reaches brokers that listen with TLS. Its `Debug` shows the
/// files and the name, never their contents.
#[derive(Clone)]
pub struct BrokerTls {
    ca_file: PathBuf,
    server_name: Option<String>,
    client_cert: Option<ClientCert>,
    connector: TlsConnector,
}

impl std::fmt::Debug for BrokerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerTls")
            .field("ca_file", &self.ca_file)
            .field("server_name", &self.server_name)
            .field("client_cert", &self.client_cert)
            .finish_non_exhaustive()
    }
}

impl BrokerTls {
    /// Trusts the brokers whose certificates chain to the CA(s) in `ca_file` (PEM). The
    /// name checked against a broker's certificate is the host of its address (a DNS
    /// name or an IP address), unless `server_name` overrides it (a certificate issued
    /// to a name, reached by IP address). With `client_cert`, it is presented to brokers
    /// that require one (`--listen-tls-client-ca`).
    ///
    /// # Errors
    /// [`IdError::Config`] naming the file that cannot be read or holds no usable
    /// certificate (or key), or the bad server name.
    pub fn new(
        ca_file: impl Into<PathBuf>,
        server_name: Option<String>,
        client_cert: Option<ClientCert>,
    ) -> Result<BrokerTls, IdError> {
        let ca_file = ca_file.into();
        install_crypto_provider();
        let mut roots = RootCertStore::empty();
        for cert in load_certs(&ca_file, "broker CA file").map_err(IdError::Config)? {
            roots.add(cert).map_err(|e| {
                IdError::Config(format!(
                    "broker CA file {}: unusable CA certificate: {e}",
                    ca_file.display()
                ))
            })?;
        }
        if let Some(name) = &server_name {
            server_name_of(name).map_err(IdError::Config)?;
        }
        let builder = ClientConfig::builder().with_root_certificates(roots);
        let config = match &client_cert {
            Some(c) => {
                let chain =
                    load_certs(&c.cert_file, "client certificate").map_err(IdError::Config)?;
                let key = load_key(&c.key_file, "client key").map_err(IdError::Config)?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    IdError::Config(format!(
                        "client certificate {} and key {}: {e}",
                        c.cert_file.display(),
                        c.key_file.display()
                    ))
                })?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(BrokerTls {
            ca_file,
            server_name,
            client_cert,
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    /// The TLS handshake on `stream`, a connection to the broker at `addr` (`host:port`).
    ///
    /// # Errors
    /// A bad server name, or a failed handshake, said in words ([`describe`]): a
    /// certificate that does not verify, a broker that does not speak TLS.
    pub(crate) async fn connect(
        &self,
        addr: &str,
        stream: TcpStream,
    ) -> Result<TlsStream<TcpStream>, String> {
        let name = match &self.server_name {
            Some(n) => n.as_str(),
            None => host_of(addr),
        };
        let name = server_name_of(name)?;
        match self.connector.connect(name, stream).await {
            Ok(s) => Ok(TlsStream::Client(s)),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(format!(
                "TLS handshake failed: connection closed during it ({e}); does the broker listen with TLS?"
            )),
            Err(e) => Err(describe(&e)),
        }
    }
}

/// The host of `addr`: `host` of `host:port`, `::1` of `[::1]:port`.
fn host_of(addr: &str) -> &str {
    if let Some((host, _)) = addr.strip_prefix('[').and_then(|r| r.split_once(']')) {
        return host;
    }
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

fn server_name_of(name: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(name.to_string()).map_err(|e| {
        format!("TLS server name {name:?} is neither a DNS name nor an IP address: {e}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_checked_is_the_host_of_the_address() {
        assert_eq!(host_of("broker-1.example:7100"), "broker-1.example");
        assert_eq!(host_of("127.0.0.1:7100"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7100"), "::1");
        assert_eq!(host_of("noport"), "noport");
        assert!(server_name_of("127.0.0.1").is_ok());
        assert!(server_name_of("::1").is_ok());
        assert!(server_name_of("bad name!").is_err());
    }
}

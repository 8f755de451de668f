//! TLS for the admin API on TCP (rustls, ring as the crypto provider).
//!
//! ```text
//!   talon serve --listen-tcp A --token-file T --tls-cert C --tls-key K [--tls-client-ca CA]
//!     accept ──slot (per peer / total)──> TLS handshake (bounded in time) ──> bearer token ──> JSON-RPC
//!   client: TlsClient::from_files(ca, [cert, key]) ──> Client::connect_tcp_tls(addr, token, &tls)
//!   engine node ──Peers (--tls-peer-ca, its own cert as client cert)──> replica node's API
//! ```
//!
//! The certificate files are PEM; a private key must not be readable by group
//! or others (like the token file). The server name a client checks is the
//! host part of the address it dials (an IP address needs an IP SAN in the
//! server's certificate).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls;

/// A TLS file or setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS: cannot read {what} {path}: {message}")]
    Read {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("TLS: {what} {path} holds no PEM {kind}")]
    Empty {
        what: &'static str,
        path: PathBuf,
        kind: &'static str,
    },
    #[error("TLS: private key {path} is accessible by group or others (mode {mode:o}); make it 0600 or 0400")]
    KeyMode { path: PathBuf, mode: u32 },
    #[error("TLS: {0}")]
    Config(String),
    #[error("TLS: {0} needs --tls-cert and --tls-key")]
    Needs(&'static str),
}

/// The TLS files of `talon serve`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// The node's certificate chain (PEM), for the TCP listener; also the
    /// client certificate this node presents to its peers.
    pub cert: Option<PathBuf>,
    /// The private key of `cert` (PEM, mode 0600/0400).
    pub key: Option<PathBuf>,
    /// Clients of the TCP listener must present a certificate signed by
    /// this CA (PEM).
    pub client_ca: Option<PathBuf>,
    /// The CA (PEM) the certificates of peer nodes are checked against: with
    /// it, calls to peers (remote replicas) use TLS.
    pub peer_ca: Option<PathBuf>,
}

impl TlsOptions {
    /// The node's certificate and key, when both are set; an error when only
    /// one is (or `--tls-client-ca` is set without them).
    pub fn identity(&self) -> Result<Option<(&Path, &Path)>, TlsError> {
        match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Ok(Some((c.as_path(), k.as_path()))),
            (Some(_), None) => Err(TlsError::Needs("--tls-cert")),
            (None, Some(_)) => Err(TlsError::Needs("--tls-key")),
            (None, None) if self.client_ca.is_some() => Err(TlsError::Needs("--tls-client-ca")),
            (None, None) => Ok(None),
        }
    }

    /// The TCP listener's TLS configuration (none: plain TCP).
    pub fn server(&self) -> Result<Option<Arc<rustls::ServerConfig>>, TlsError> {
        let Some((cert, key)) = self.identity()? else {
            return Ok(None);
        };
        server_config(cert, key, self.client_ca.as_deref()).map(Some)
    }

    /// How this node reaches its peers over TLS (none: plain TCP).
    pub fn peer_client(&self) -> Result<Option<TlsClient>, TlsError> {
        let identity = self.identity()?;
        match &self.peer_ca {
            None => Ok(None),
            Some(ca) => TlsClient::from_files(ca, identity).map(Some),
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |e: rustls_pki_types::pem::Error| TlsError::Read {
        what,
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
            kind: "certificate",
        });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let read = |message: String| TlsError::Read {
        what: "private key",
        path: path.to_path_buf(),
        message,
    };
    let mode = std::fs::metadata(path)
        .map_err(|e| read(e.to_string()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(TlsError::KeyMode {
            path: path.to_path_buf(),
            mode: mode & 0o7777,
        });
    }
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what: "private key",
            path: path.to_path_buf(),
            kind: "private key",
        },
        e => read(e.to_string()),
    })
}

fn roots(what: &'static str, path: &Path) -> Result<Arc<rustls::RootCertStore>, TlsError> {
    let mut store = rustls::RootCertStore::empty();
    for c in certs(what, path)? {
        store.add(c).map_err(|e| TlsError::Read {
            what,
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    }
    Ok(Arc::new(store))
}

/// The listener's configuration: `cert`/`key`, and when `client_ca` is
/// given, client certificates signed by it required.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certs("certificate", cert)?;
    let key = private_key(key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots("client CA", ca)?,
                provider(),
            )
            .build()
            .map_err(|e| TlsError::Config(format!("client CA {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("{} with {}: {e}", cert.display(), "its key")))?;
    // the API speaks HTTP/1.1 (WebSocket upgrades)
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client's TLS settings: the CA the server's certificate is checked
/// against, and optionally a client certificate.
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("client_cert", &self.config.client_auth_cert_resolver.has_certs())
            .finish()
    }
}

impl TlsClient {
    /// Trusts the CA(s) in `ca` (PEM); presents `identity` (certificate
    /// chain, private key) when a server asks for a client certificate.
    pub fn from_files(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Self, TlsError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots("CA", ca)?);
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(certs("client certificate", cert)?, private_key(key)?)
                .map_err(|e| TlsError::Config(format!("client certificate {}: {e}", cert.display())))?,
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
        })
    }

    /// The connector for a server reached as `addr` (`host:port`, an IP
    /// address or a DNS name the server's certificate names).
    pub(crate) fn connector(
        &self,
        addr: &str,
    ) -> Result<(tokio_rustls::TlsConnector, ServerName<'static>), String> {
        let host = match addr.rsplit_once(':') {
            Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
            None => addr,
        };
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("{host:?} is not a server name for TLS: {e}"))?;
        Ok((tokio_rustls::TlsConnector::from(self.config.clone()), name))
    }
}

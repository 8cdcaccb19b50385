//! TLS and mutual TLS for every Kindling endpoint (the agent's Flight and
//! collective port, the rendezvous) and every Kindling client of them.
//!
//! A process names PEM files ([`TlsFiles`]): its certificate chain and key
//! (a server presents them; a client presents them as its client
//! certificate when the server asks), and the CA that signs its peers. The
//! files are read again when they change — cert-manager rotates a Secret's
//! files in place — so a new connection uses the new certificate while the
//! connections (and jobs) already open keep theirs. A change that does not
//! load (a half-written file) keeps the previous certificate and is logged.
//!
//! Servers take their connections from the ops crate's listener
//! (`kindling_ops::listen`), which handshakes with [`Tls::server_config`];
//! clients dial through
//! [`ChannelConfig::dial`](crate::channel::ChannelConfig::dial), which does
//! TLS for an `https://` URL.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::SystemTime;

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Where a process's TLS material lives (PEM files).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain this process presents (as a server; as a client
    /// when the server asks for one).
    pub cert: Option<PathBuf>,
    /// Private key of `cert`.
    pub key: Option<PathBuf>,
    /// CA bundle that signs the servers this process dials (and, with
    /// `client_auth`, the clients it accepts).
    pub ca: Option<PathBuf>,
    /// A server accepts only clients presenting a certificate signed by `ca`
    /// (mutual TLS).
    pub client_auth: bool,
    /// The name a server dialled by IP address must carry in its
    /// certificate (agents are dialled by pod IP but share one certificate
    /// for a DNS name). A server dialled by DNS name is checked against that
    /// name. Default: the URL's host.
    pub server_name: Option<String>,
}

impl TlsFiles {
    /// Nothing named: no TLS.
    pub fn is_empty(&self) -> bool {
        self.cert.is_none() && self.key.is_none() && self.ca.is_none()
    }
}

/// Why TLS material could not be used; each names the file or the setting.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no PEM item of the kind needed.
    #[error("TLS {what} `{}`: {reason}", path.display())]
    File {
        /// certificate, key or CA.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The settings do not fit together.
    #[error("TLS settings: {0}")]
    Settings(String),
    /// rustls refused the material (a key that does not match, a bad CA).
    #[error("TLS {what}: {source}")]
    Rustls {
        /// What was being built.
        what: &'static str,
        /// rustls' error.
        source: rustls::Error,
    },
}

/// Loaded TLS settings, shared by every server and connection of a process
/// and reloaded when the files change. Cloning shares them.
#[derive(Clone)]
pub struct Tls {
    files: Arc<TlsFiles>,
    loaded: Arc<Mutex<Loaded>>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Tls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.loaded, &other.loaded)
    }
}
impl Eq for Tls {}

struct Loaded {
    /// Modification time and length of each named file when last loaded.
    stamp: Vec<Option<(SystemTime, u64)>>,
    server: Option<Arc<ServerConfig>>,
    client: Option<Arc<ClientConfig>>,
}

impl Tls {
    /// Loads `files` now (so a wrong path or key fails at start-up, naming
    /// the file); later calls reload them when they change.
    pub fn new(files: TlsFiles) -> Result<Tls, TlsError> {
        if files.cert.is_some() != files.key.is_some() {
            return Err(TlsError::Settings(
                "a certificate needs its key and a key its certificate (--tls-cert with --tls-key)".into(),
            ));
        }
        if files.client_auth && (files.ca.is_none() || files.cert.is_none()) {
            return Err(TlsError::Settings(
                "client-certificate verification (--tls-client-auth) needs the server's \
                 certificate and key and the CA that signs the clients (--tls-ca)"
                    .into(),
            ));
        }
        if files.is_empty() {
            return Err(TlsError::Settings("no certificate, key or CA named".into()));
        }
        let stamp = stamp(&files);
        let (server, client) = build(&files)?;
        Ok(Tls {
            files: Arc::new(files),
            loaded: Arc::new(Mutex::new(Loaded {
                stamp,
                server,
                client,
            })),
        })
    }

    /// [`Tls::new`] when `files` names anything; `None` (plaintext) when
    /// it names nothing.
    pub fn load(files: TlsFiles) -> Result<Option<Tls>, TlsError> {
        if files.is_empty() {
            return Ok(None);
        }
        Tls::new(files).map(Some)
    }

    /// The files this was loaded from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Whether this process can serve TLS (it has a certificate and key).
    pub fn serves(&self) -> bool {
        self.files.cert.is_some()
    }

    /// The current server configuration (reloaded if the files changed);
    /// `None` without a certificate.
    pub fn server_config(&self) -> Option<Arc<ServerConfig>> {
        self.current().0
    }

    /// The current client configuration (reloaded if the files changed);
    /// `None` without a CA to verify servers with.
    pub fn client_config(&self) -> Option<Arc<ClientConfig>> {
        self.current().1
    }

    #[allow(clippy::type_complexity)]
    fn current(&self) -> (Option<Arc<ServerConfig>>, Option<Arc<ClientConfig>>) {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        let now = stamp(&self.files);
        if now != loaded.stamp {
            match build(&self.files) {
                Ok((server, client)) => {
                    tracing::info!(files = ?self.files, "TLS certificates reloaded");
                    *loaded = Loaded {
                        stamp: now,
                        server,
                        client,
                    };
                }
                // A rotation caught half-written: keep serving the previous
                // certificate; the next connection tries again.
                Err(e) => {
                    tracing::warn!(error = %e, "TLS files changed but do not load; keeping the previous ones")
                }
            }
        }
        (loaded.server.clone(), loaded.client.clone())
    }
}

fn stamp(files: &TlsFiles) -> Vec<Option<(SystemTime, u64)>> {
    [&files.cert, &files.key, &files.ca]
        .into_iter()
        .flatten()
        .map(|p| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        })
        .collect()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_err = |reason: String| TlsError::File {
        what,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(file_err("no PEM certificate in it".into()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File {
        what: "key",
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

fn roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs("CA", path)? {
        roots.add(cert).map_err(|e| TlsError::File {
            what: "CA",
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(Arc::new(roots))
}

#[allow(clippy::type_complexity)]
fn build(files: &TlsFiles) -> Result<(Option<Arc<ServerConfig>>, Option<Arc<ClientConfig>>), TlsError> {
    let rustls_err = |what| move |source| TlsError::Rustls { what, source };
    let identity = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => Some((read_certs("certificate", cert)?, read_key(key)?)),
        _ => None,
    };
    let roots = files.ca.as_deref().map(roots).transpose()?;
    let server = match &identity {
        Some((certs, key)) => {
            let builder = ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(rustls_err("server protocol versions"))?;
            let builder = match (&roots, files.client_auth) {
                (Some(roots), true) => {
                    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                        .build()
                        .map_err(|e| TlsError::Settings(format!("client verifier: {e}")))?;
                    builder.with_client_cert_verifier(verifier)
                }
                _ => builder.with_no_client_auth(),
            };
            let mut config = builder
                .with_single_cert(certs.clone(), key.clone_key())
                .map_err(rustls_err("server certificate and key"))?;
            // gRPC, the ring data plane (`ring`) and HTTP/1.1 on the same port.
            config.alpn_protocols = vec![b"h2".to_vec(), crate::ring::ALPN.to_vec(), b"http/1.1".to_vec()];
            Some(Arc::new(config))
        }
        None => None,
    };
    let client = match &roots {
        Some(roots) => {
            let builder = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(rustls_err("client protocol versions"))?
                .with_root_certificates(roots.clone());
            let mut config = match identity {
                Some((certs, key)) => builder
                    .with_client_auth_cert(certs, key)
                    .map_err(rustls_err("client certificate and key"))?,
                None => builder.with_no_client_auth(),
            };
            config.alpn_protocols = vec![b"h2".to_vec()];
            Some(Arc::new(config))
        }
        None => None,
    };
    Ok((server, client))
}

/// Whether `host` (a URL's host) is this machine: `localhost`, 127.0.0.0/8 or `::1`.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// One accepted connection: plaintext, or TLS when the server has a
/// certificate.
#[derive(Debug)]
pub enum Conn {
    /// A plaintext connection.
    Plain(TcpStream),
    /// A TLS connection, handshake done.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// A TLS connection this process dialled (a ring link, `connect_ring`).
    TlsClient(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        match self {
            Conn::Plain(s) => s.connect_info(),
            Conn::Tls(s) => s.get_ref().0.connect_info(),
            Conn::TlsClient(s) => s.get_ref().0.connect_info(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Conn::TlsClient(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::TlsClient(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            Conn::TlsClient(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
            Conn::TlsClient(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::TlsClient(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::TlsClient(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Dials `host:port` (`host` without IPv6 brackets) and does the TLS
/// handshake with the current client configuration, checking the server's
/// certificate for `server_name`.
pub(crate) async fn connect(
    tls: Tls,
    host: String,
    port: u16,
    server_name: ServerName<'static>,
) -> io::Result<hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<TcpStream>>> {
    let config = dial_config(&tls, None)?;
    let tcp = dial_tcp(&host, port).await?;
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(server_name, tcp)
        .await?;
    Ok(hyper_util::rt::TokioIo::new(stream))
}

/// The client configuration current now, offering `alpn` instead of `h2`
/// when given; an error when no CA is set.
fn dial_config(tls: &Tls, alpn: Option<&[u8]>) -> io::Result<Arc<ClientConfig>> {
    let config = tls.client_config().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "an https:// URL needs a CA to verify the server (--tls-ca)",
        )
    })?;
    Ok(match alpn {
        None => config,
        Some(alpn) => {
            let mut config = (*config).clone();
            config.alpn_protocols = vec![alpn.to_vec()];
            Arc::new(config)
        }
    })
}

/// A TCP connection to `host:port` with `TCP_NODELAY`.
async fn dial_tcp(host: &str, port: u16) -> io::Result<TcpStream> {
    let tcp = TcpStream::connect((host, port)).await?;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

/// Dials a ring connection ([`crate::ring`]): TCP to `host:port`, and with
/// `tls` the handshake offering only the ring's ALPN protocol.
pub(crate) async fn connect_ring(
    tls: Option<(Tls, ServerName<'static>)>,
    host: &str,
    port: u16,
) -> io::Result<Conn> {
    let tcp = dial_tcp(host, port).await?;
    let Some((tls, server_name)) = tls else {
        return Ok(Conn::Plain(tcp));
    };
    let config = dial_config(&tls, Some(crate::ring::ALPN))?;
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(server_name, tcp)
        .await?;
    if stream.get_ref().1.alpn_protocol() != Some(crate::ring::ALPN) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the server does not speak the ring protocol (ALPN kindling-ring/1)",
        ));
    }
    Ok(Conn::TlsClient(Box::new(stream)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in ["localhost", "LOCALHOST", "127.0.0.1", "127.3.2.1", "::1", "[::1]"] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "10.0.0.7",
            "kindling-agent",
            "0.0.0.0",
            "[fe80::1]",
            "localhost.example",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
    }

    #[test]
    fn settings_that_do_not_fit_and_bad_files_are_named() {
        let dir = std::env::temp_dir().join(format!("kindling-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.crt");
        let garbage = dir.join("garbage.crt");
        std::fs::write(&garbage, "not a certificate\n").unwrap();
        let err = |files: TlsFiles| Tls::new(files).unwrap_err().to_string();

        let half = err(TlsFiles {
            cert: Some(garbage.clone()),
            ..TlsFiles::default()
        });
        assert!(half.contains("--tls-key"), "{half}");
        let mtls = err(TlsFiles {
            cert: Some(garbage.clone()),
            key: Some(garbage.clone()),
            client_auth: true,
            ..TlsFiles::default()
        });
        assert!(mtls.contains("--tls-ca"), "{mtls}");
        assert!(err(TlsFiles::default()).contains("no certificate"));
        let gone = err(TlsFiles {
            ca: Some(missing.clone()),
            ..TlsFiles::default()
        });
        assert!(
            gone.contains("CA") && gone.contains(&missing.display().to_string()),
            "{gone}"
        );
        let empty = err(TlsFiles {
            ca: Some(garbage.clone()),
            ..TlsFiles::default()
        });
        assert!(
            empty.contains("no PEM certificate") && empty.contains("garbage.crt"),
            "{empty}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

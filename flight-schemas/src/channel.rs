//! How every Kindling client holds its gRPC channels (to agents, between
//! agents, to the rendezvous) and every Kindling server answers them: connect
//! timeout, HTTP/2 keepalive, and the deadline of a call that should answer
//! at once. A peer that stops answering without closing its connection (a
//! partitioned node, a frozen process) is found by the keepalive within
//! [`ChannelConfig::detection_bound`], and a call waiting on it fails then,
//! or at its deadline, instead of hanging. It also carries the process's
//! [`Tls`] and the plaintext rule: a bearer token never leaves this machine
//! in plaintext unless the operator allowed it.

use std::time::Duration;

use rustls_pki_types::ServerName;
use tonic::transport::{Channel, Endpoint, Server, Uri};

use crate::tls::{self, Tls};

/// Channel settings. The defaults suit a cluster network; tests shorten them.
///
/// ```
/// use std::time::Duration;
/// use kindling_schemas::channel::ChannelConfig;
/// let c = ChannelConfig::default();
/// assert_eq!(c.detection_bound(), Duration::from_secs(20));
/// let fast = c.with_keepalive(Duration::from_millis(500), Duration::from_millis(500));
/// assert_eq!(fast.detection_bound(), Duration::from_secs(1));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelConfig {
    /// How long opening a connection may take.
    pub connect_timeout: Duration,
    /// How often an HTTP/2 PING is sent on a connection (also while no call
    /// is open on it).
    pub keepalive_interval: Duration,
    /// How long a PING may stay unanswered before the connection is closed
    /// and every call on it fails (`UNAVAILABLE`).
    pub keepalive_timeout: Duration,
    /// The deadline of a call that should answer at once (an agent's
    /// actions, a rendezvous status): `DEADLINE_EXCEEDED` after it. Calls that
    /// wait by design (a join, a barrier, a data stream) have no deadline of
    /// their own; the keepalive bounds them.
    pub call_timeout: Duration,
    /// TLS material for `https://` URLs (the CA that verifies servers, the
    /// client certificate for mutual TLS); `None`: only `http://` dials.
    pub tls: Option<Tls>,
    /// Send a bearer token over plaintext `http://` to a host that is not
    /// loopback. Off by default: such a token can be read off the network.
    pub allow_plaintext_token: bool,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            connect_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(30),
            tls: None,
            allow_plaintext_token: false,
        }
    }
}

impl ChannelConfig {
    /// Sets the keepalive interval and timeout.
    pub fn with_keepalive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keepalive_interval = interval;
        self.keepalive_timeout = timeout;
        self
    }

    /// Sets the deadline of calls that should answer at once.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The longest a silent peer goes unnoticed on an open connection: one
    /// keepalive interval until the next PING, plus its timeout.
    pub fn detection_bound(&self) -> Duration {
        self.keepalive_interval + self.keepalive_timeout
    }

    /// Dials `https://` URLs with `tls` (its CA verifies the server, its
    /// certificate answers a server asking for one).
    pub fn with_tls(mut self, tls: Option<Tls>) -> Self {
        self.tls = tls;
        self
    }

    /// Allows (or not) a bearer token over plaintext to other machines.
    pub fn with_plaintext_token(mut self, allow: bool) -> Self {
        self.allow_plaintext_token = allow;
        self
    }

    /// A connection to `url` with these settings (and `TCP_NODELAY`):
    /// TLS for `https://`, plaintext for `http://` — refused when the
    /// caller `sends_token` to a host that is not loopback, unless
    /// [`allow_plaintext_token`](Self::allow_plaintext_token).
    ///
    /// ```
    /// use kindling_schemas::channel::{ChannelConfig, DialError};
    /// let c = ChannelConfig::default();
    /// assert!(c.dial("http://127.0.0.1:7070", true).is_ok());
    /// assert!(matches!(c.dial("http://10.0.0.7:7070", true), Err(DialError::PlaintextToken { .. })));
    /// assert!(c.dial("http://10.0.0.7:7070", false).is_ok());
    /// assert!(matches!(c.dial("https://10.0.0.7:7070", true), Err(DialError::NoCa { .. })));
    /// ```
    pub fn dial(&self, url: &str, sends_token: bool) -> Result<Dial, DialError> {
        let bad = |reason: &str| DialError::Url {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: Uri = url
            .parse()
            .map_err(|e: tonic::codegen::http::uri::InvalidUri| bad(&e.to_string()))?;
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?
            .to_owned();
        let authority = uri.authority().map(|a| a.as_str().to_owned()).unwrap_or_default();
        let (plain_url, tls) = match uri.scheme_str() {
            Some("http") => {
                if sends_token && !self.allow_plaintext_token && !tls::is_loopback_host(&host) {
                    return Err(DialError::PlaintextToken { url: url.to_owned() });
                }
                (url.to_owned(), None)
            }
            Some("https") => {
                let tls = self
                    .tls
                    .clone()
                    .filter(|t| t.files().ca.is_some())
                    .ok_or_else(|| DialError::NoCa { url: url.to_owned() })?;
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                // Agents are dialled by pod IP and share one certificate for
                // a DNS name: an IP is checked against `server_name`; a DNS
                // name (the rendezvous' Service) against itself.
                let name = match tls.files().server_name.clone() {
                    Some(name) if bare.parse::<std::net::IpAddr>().is_ok() => name,
                    _ => bare.to_owned(),
                };
                let server_name = ServerName::try_from(name).map_err(|e| bad(&e.to_string()))?;
                let port = uri.port_u16().unwrap_or(443);
                // tonic sees a plain http connection: the TLS is ours (below).
                (
                    format!("http://{authority}"),
                    Some(TlsDial {
                        tls,
                        host: bare.to_owned(),
                        port,
                        name: server_name,
                    }),
                )
            }
            _ => return Err(bad("the scheme must be http:// or https://")),
        };
        let endpoint = Endpoint::from_shared(plain_url)
            .map_err(|e| bad(&e.to_string()))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(self.keepalive_interval)
            .keep_alive_timeout(self.keepalive_timeout)
            .keep_alive_while_idle(true);
        Ok(Dial { endpoint, tls })
    }

    /// A ring data-plane connection to the agent at `url` ([`crate::ring`]),
    /// under the same rules as [`dial`](Self::dial) (TLS for `https://`,
    /// no token in plaintext off loopback), within the connect timeout.
    pub async fn connect_ring(&self, url: &str, sends_token: bool) -> Result<tls::Conn, RingDialError> {
        let dial = self.dial(url, sends_token)?;
        let (host, port, tls) = match dial.tls {
            Some(t) => (t.host, t.port, Some((t.tls, t.name))),
            None => {
                let uri = dial.endpoint.uri();
                let host = uri.host().unwrap_or_default();
                let host = host.trim_start_matches('[').trim_end_matches(']').to_owned();
                (host, uri.port_u16().unwrap_or(80), None)
            }
        };
        tokio::time::timeout(self.connect_timeout, tls::connect_ring(tls, &host, port))
            .await
            .map_err(|_| RingDialError::Connect {
                url: url.to_owned(),
                reason: format!("no connection within {:?}", self.connect_timeout),
            })?
            .map_err(|e| RingDialError::Connect {
                url: url.to_owned(),
                reason: e.to_string(),
            })
    }

    /// A server builder that PINGs its clients with these settings, so a
    /// client that vanished without closing its connection frees the calls
    /// (and the streams' state) it held.
    pub fn server(&self) -> Server {
        Server::builder()
            .tcp_nodelay(true)
            .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
            .http2_keepalive_interval(Some(self.keepalive_interval))
            .http2_keepalive_timeout(Some(self.keepalive_timeout))
    }
}

/// Calls one connection may have open at once on a Kindling server (HTTP/2
/// `MAX_CONCURRENT_STREAMS`); a client's next call waits for one to end.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;

/// Why a URL cannot be dialled.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// Not an `http(s)://host:port` URL.
    #[error("`{url}` is not a usable URL: {reason}")]
    Url {
        /// The URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An `https://` URL with no CA to verify the server with.
    #[error("`{url}` is https but no CA is set to verify it (--tls-ca, KINDLING_TLS_CA)")]
    NoCa {
        /// The URL.
        url: String,
    },
    /// A bearer token would cross the network in plaintext.
    #[error(
        "refusing to send the bearer token in plaintext to `{url}` (not loopback): \
         use https:// with a CA (--tls-ca), or allow it on a network you trust (--allow-plaintext-token)"
    )]
    PlaintextToken {
        /// The URL.
        url: String,
    },
}

/// Why a ring connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RingDialError {
    /// The URL cannot be dialled (see [`DialError`]).
    #[error(transparent)]
    Dial(#[from] DialError),
    /// The TCP connection or the TLS handshake failed.
    #[error("cannot connect to `{url}`: {reason}")]
    Connect {
        /// The URL.
        url: String,
        /// What failed.
        reason: String,
    },
}

/// A connection about to be made ([`ChannelConfig::dial`]).
#[derive(Debug)]
pub struct Dial {
    endpoint: Endpoint,
    tls: Option<TlsDial>,
}

/// Where and how an `https://` dial does its TLS.
#[derive(Debug, Clone)]
struct TlsDial {
    tls: Tls,
    host: String,
    port: u16,
    name: ServerName<'static>,
}

impl TlsDial {
    /// tonic's connector: TCP to the host, then the handshake with the
    /// certificates current at each connect.
    fn connector(
        self,
    ) -> impl tower::Service<
        Uri,
        Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
        Error = std::io::Error,
        Future = impl Send + 'static,
    > + Send
    + 'static {
        tower::service_fn(move |_: Uri| {
            let t = self.clone();
            tls::connect(t.tls, t.host, t.port, t.name)
        })
    }
}

impl Dial {
    /// Adjusts the endpoint's settings (window sizes, …).
    pub fn tune(mut self, f: impl FnOnce(Endpoint) -> Endpoint) -> Self {
        self.endpoint = f(self.endpoint);
        self
    }

    /// A channel that connects on its first call (and again after a break;
    /// with TLS, with the certificates current then).
    pub fn connect_lazy(self) -> Channel {
        match self.tls {
            None => self.endpoint.connect_lazy(),
            Some(t) => self.endpoint.connect_with_connector_lazy(t.connector()),
        }
    }

    /// A channel connected now.
    pub async fn connect(self) -> Result<Channel, tonic::transport::Error> {
        match self.tls {
            None => self.endpoint.connect().await,
            Some(t) => self.endpoint.connect_with_connector(t.connector()).await,
        }
    }
}

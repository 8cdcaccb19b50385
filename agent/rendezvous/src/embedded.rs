//! The rendezvous in-process on `127.0.0.1:0` (local mode and tests): the
//! same [`serve`] as the binary, real gRPC over loopback.

use std::net::SocketAddr;

use kindling_schemas::auth::Token;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::RendezvousError;
use crate::server::{ServerConfig, serve};
use crate::types::RendezvousConfig;

/// A running in-process rendezvous. Dropping it stops the server; call
/// [`shutdown_and_wait`](Self::shutdown_and_wait) to also wait for it.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use kindling_rendezvous::{EmbeddedRendezvous, RendezvousConfig};
/// use kindling_schemas::rendezvous::RendezvousClient;
/// use kindling_schemas::auth::Token;
/// let token = Token::new("secret");
/// let server = EmbeddedRendezvous::start(RendezvousConfig::default(), Some(token.clone())).await?;
/// let client = RendezvousClient::connect(server.url(), Some(&token)).await?;
/// assert!(client.list_agents().await?.is_empty());
/// server.shutdown_and_wait().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct EmbeddedRendezvous {
    addr: SocketAddr,
    /// Serves TLS (`https://` URL).
    tls: bool,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), RendezvousError>>>,
}

impl EmbeddedRendezvous {
    /// Binds `127.0.0.1:0` and serves. The listener is bound before this
    /// returns, so clients may connect at once (no readiness wait needed).
    pub async fn start(config: RendezvousConfig, token: Option<Token>) -> Result<Self, RendezvousError> {
        Self::start_with(ServerConfig::new(config, token)).await
    }

    /// Like [`start`](Self::start) with every server setting.
    pub async fn start_with(config: ServerConfig) -> Result<Self, RendezvousError> {
        Self::start_on((std::net::Ipv4Addr::LOCALHOST, 0).into(), config).await
    }

    /// Like [`start_with`](Self::start_with), bound to `addr` (port 0: any
    /// free port).
    pub async fn start_on(addr: SocketAddr, config: ServerConfig) -> Result<Self, RendezvousError> {
        config.rendezvous.validate()?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| RendezvousError::transport(format!("binding {addr}"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| RendezvousError::transport("reading the bound address", e))?;
        let shutdown = CancellationToken::new();
        let tls = config
            .tls
            .as_ref()
            .is_some_and(kindling_schemas::tls::Tls::serves);
        let task = tokio::spawn(serve(listener, config, shutdown.clone()));
        tracing::debug!(%addr, "embedded rendezvous started");
        Ok(EmbeddedRendezvous {
            addr,
            tls,
            shutdown,
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>` (`https://` with TLS), for
    /// [`RendezvousClient::connect`](kindling_schemas::rendezvous::RendezvousClient::connect).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Stops serving (blocked calls get UNAVAILABLE) and waits until the
    /// server and its background tasks have ended.
    pub async fn shutdown_and_wait(mut self) -> Result<(), RendezvousError> {
        self.shutdown.cancel();
        match self.task.take() {
            Some(task) => task
                .await
                .map_err(|e| RendezvousError::transport("the rendezvous task panicked", e))?,
            None => Ok(()),
        }
    }
}

impl Drop for EmbeddedRendezvous {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

//! A TCP proxy for fault tests: it forwards connections to a target until it
//! is frozen; frozen, it keeps every connection open and forwards nothing,
//! so the peer behind it is silent without closing anything (a partitioned
//! node, a stopped process).

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A proxy on 127.0.0.1 port 0 in front of `target`; stops when dropped.
#[derive(Debug)]
pub struct FreezableProxy {
    addr: SocketAddr,
    frozen: watch::Sender<bool>,
    stop: CancellationToken,
}

impl FreezableProxy {
    /// Starts forwarding to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), target).await
    }

    /// Starts forwarding to `target` from `bind` (e.g. the same port as the
    /// target on another loopback address, `127.0.0.2`, so that a process
    /// advertising that host is reached through the proxy).
    pub async fn start_on(bind: SocketAddr, target: SocketAddr) -> Self {
        let listener = TcpListener::bind(bind).await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (frozen, _) = watch::channel(false);
        let stop = CancellationToken::new();
        let (held, done) = (frozen.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = done.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((inbound, _)) = accepted else { return };
                let (held, done) = (held.subscribe(), done.clone());
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    tokio::select! {
                        _ = done.cancelled() => {}
                        _ = async {
                            tokio::join!(
                                pump(in_read, out_write, held.clone()),
                                pump(out_read, in_write, held),
                            )
                        } => {}
                    }
                });
            }
        });
        FreezableProxy { addr, frozen, stop }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops forwarding in both directions; connections stay open.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Forwards again (bytes held while frozen go through first).
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }
}

impl Drop for FreezableProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Copies `from` to `to`; while frozen, holds what it read and reads no more.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut frozen: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

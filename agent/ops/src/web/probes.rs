//! Kubernetes probes on the health port, for both binaries: `/healthz` and
//! `/livez` (the process answers) and `/readyz` (the process is ready for
//! traffic). Open to anyone, on a port of their own, so that probes keep
//! working when the main port wants a token and TLS. One request per
//! connection (the kubelet opens one per probe), each connection bounded in
//! time, a few per address and a cap over all.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::listen::PeerSlots;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// After a failed accept (out of file descriptors, say), the listener waits
/// this long before the next, instead of spinning a core.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Probe connections served at once; one more is closed at once. The
/// kubelet opens one per probe and closes it; anyone else gets no more of
/// the process than this many tasks (each ends after one request, or after
/// [`PROBE_CONNECTION_TIMEOUT`]).
pub const MAX_PROBE_CONNECTIONS: usize = 64;

/// Of [`MAX_PROBE_CONNECTIONS`], the most one address holds. The kubelet
/// probes from its node's address, a few probes at a time; a pod flooding
/// the port from its own address holds this many and no more, so the
/// kubelet's probes are still served and the process is not restarted for
/// failing them.
pub const MAX_PROBE_CONNECTIONS_PER_PEER: usize = 4;

/// How long one probe connection lives: its request, the answer (a few
/// bytes) and the close. A connection that sends nothing gives its slot
/// back after this (the kubelet's own probe timeout is 1 s by default).
pub const PROBE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether `/readyz` answers 200. Cheap to clone; all clones share the flag.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Not ready yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the process ready (`true`) or not (`false`).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    /// The current state.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// The probes' routes; any other path is 404, any method but GET and HEAD 405.
pub fn router(ready: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback_service(get(|| async { (StatusCode::NOT_FOUND, "not found\n") }))
        .with_state(ready)
}

async fn readyz(State(ready): State<Readiness>) -> (StatusCode, &'static str) {
    if ready.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// A running probe server.
#[derive(Debug)]
pub struct HealthServer {
    addr: SocketAddr,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl HealthServer {
    /// Serves the probes on `listener` until [`HealthServer::shutdown`] or `cancel`.
    ///
    /// ```no_run
    /// # async fn demo() -> std::io::Result<()> {
    /// use kindling_ops::web::probes::{HealthServer, Readiness};
    /// let ready = Readiness::new();
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    /// let server = HealthServer::start(listener, ready.clone(), Default::default())?;
    /// ready.set(true); // GET /readyz now answers 200
    /// server.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn start(
        listener: TcpListener,
        ready: Readiness,
        cancel: CancellationToken,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let tracker = TaskTracker::new();
        let (accept_tracker, accept_cancel) = (tracker.clone(), cancel.clone());
        let app = router(ready);
        let open = Arc::new(tokio::sync::Semaphore::new(MAX_PROBE_CONNECTIONS));
        let peers = PeerSlots::new(MAX_PROBE_CONNECTIONS_PER_PEER);
        tracker.spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = accept_cancel.cancelled() => return,
                    r = listener.accept() => r,
                };
                match accepted {
                    Ok((stream, peer)) => {
                        let Some(slot) = peers.take(peer.ip()) else {
                            tracing::debug!(
                                %peer,
                                cap = MAX_PROBE_CONNECTIONS_PER_PEER,
                                "probe connection refused: its address holds its cap"
                            );
                            continue;
                        };
                        let Ok(permit) = open.clone().try_acquire_owned() else {
                            tracing::debug!(
                                cap = MAX_PROBE_CONNECTIONS,
                                "probe connection refused: at the cap"
                            );
                            continue;
                        };
                        let served =
                            super::serve_connection(stream, app.clone(), false, accept_cancel.clone());
                        accept_tracker.spawn(async move {
                            // Bounded whether or not the client sends anything.
                            let _ = tokio::time::timeout(PROBE_CONNECTION_TIMEOUT, served).await;
                            drop((permit, slot));
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "health listener accept failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                    }
                }
            }
        });
        Ok(HealthServer {
            addr,
            cancel,
            tracker,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for open probe connections to end.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tower::ServiceExt;

    use super::*;

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[tokio::test]
    async fn readiness_follows_the_flag_and_liveness_is_always_ok() {
        let ready = Readiness::new();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let server = HealthServer::start(listener, ready.clone(), CancellationToken::new()).expect("start");
        let addr = server.addr();
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        ready.set(true);
        let r = get(addr, "/readyz?verbose").await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        assert!(r.ends_with("ready\n"), "{r}");
        assert!(get(addr, "/nope").await.starts_with("HTTP/1.1 404"));
        server.shutdown().await;
    }

    #[tokio::test]
    async fn only_reads_are_allowed() {
        let ask = |method: &str| {
            let request = Request::builder()
                .method(method)
                .uri("/healthz")
                .body(Body::empty());
            router(Readiness::new()).oneshot(request.expect("request"))
        };
        assert_eq!(
            ask("POST").await.expect("answer").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(ask("HEAD").await.expect("answer").status(), StatusCode::OK);
    }
}

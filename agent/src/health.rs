//! Kubernetes probes over plain HTTP/1.1: `/healthz` (the process answers)
//! and `/readyz` (the process is ready for traffic), for both binaries.
//!
//! Deliberately tiny: one request per connection, `GET` only, no body. Probes
//! from the kubelet need nothing more, and a separate port keeps them working
//! when the gRPC port requires a bearer token.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Longest request head read before answering 400.
const MAX_HEAD_BYTES: usize = 8 << 10;
/// A probe that does not send its request within this time is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// use kindling_agent::health::{HealthServer, Readiness};
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
        let accept_tracker = tracker.clone();
        let accept_cancel = cancel.clone();
        tracker.spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = accept_cancel.cancelled() => return,
                    r = listener.accept() => r,
                };
                match stream {
                    Ok((stream, _)) => {
                        let ready = ready.clone();
                        let cancel = accept_cancel.clone();
                        accept_tracker.spawn(async move {
                            tokio::select! {
                                _ = cancel.cancelled() => {}
                                r = answer(stream, &ready) => if let Err(e) = r {
                                    tracing::debug!(error = %e, "health probe connection");
                                },
                            }
                        });
                    }
                    // Out of file descriptors and the like: keep serving.
                    Err(e) => tracing::warn!(error = %e, "health listener accept failed"),
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

/// The status line and body for a request head.
fn respond(method: &str, path: &str, ready: &Readiness) -> (&'static str, &'static str) {
    match (method, path) {
        ("GET" | "HEAD", "/healthz" | "/livez") => ("200 OK", "ok\n"),
        ("GET" | "HEAD", "/readyz") if ready.is_ready() => ("200 OK", "ready\n"),
        ("GET" | "HEAD", "/readyz") => ("503 Service Unavailable", "not ready\n"),
        ("GET" | "HEAD", _) => ("404 Not Found", "not found\n"),
        _ => ("405 Method Not Allowed", "method not allowed\n"),
    }
}

async fn answer(mut stream: TcpStream, ready: &Readiness) -> std::io::Result<()> {
    let (status, body, head_only) = match read_head(&mut stream).await? {
        Some(Ok(head)) => {
            let (status, body) = respond(&head.method, &head.path, ready);
            (status, body, head.method == "HEAD")
        }
        Some(Err(())) => ("400 Bad Request", "bad request\n", false),
        None => return Ok(()),
    };
    write_response(&mut stream, status, "text/plain", body.as_bytes(), head_only).await
}

/// An HTTP/1.1 request head: what the probe, `/metrics` and the status
/// page read of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// `GET`, `HEAD`, ...
    pub method: String,
    /// The path, without the query string.
    pub path: String,
    /// The query string (after `?`), if any.
    pub query: Option<String>,
    /// The `authorization` header, if any.
    pub authorization: Option<String>,
    /// The `cookie` header, if any.
    pub cookie: Option<String>,
}

/// Reads one request head (at most [`MAX_HEAD_BYTES`], within the read
/// timeout): `None` when the peer sent nothing in time, `Some(Err(()))`
/// when what it sent is not a request head.
pub async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Option<Result<Head, ()>>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let complete = tokio::time::timeout(READ_TIMEOUT, async {
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            head.extend_from_slice(&buf[..n]);
            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(true);
            }
            if head.len() > MAX_HEAD_BYTES {
                return Ok(false);
            }
        }
    })
    .await;
    match complete {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => return Ok(Some(Err(()))),
        Ok(Err(e)) => return Err(e),
        Err(_) => return Ok(None),
    }
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    if method.is_empty() || path.is_empty() {
        return Ok(Some(Err(())));
    }
    let (mut authorization, mut cookie) = (None, None);
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name.eq_ignore_ascii_case("authorization") {
            authorization = Some(value.trim().to_owned());
        } else if name.eq_ignore_ascii_case("cookie") {
            cookie = Some(value.trim().to_owned());
        }
    }
    // Probes may add a query string (`/readyz?verbose`); they ignore it.
    let (path, query) = match path.split_once('?') {
        Some((path, query)) => (path, Some(query.to_owned())),
        None => (path, None),
    };
    Ok(Some(Ok(Head {
        method: method.to_owned(),
        path: path.to_owned(),
        query,
        authorization,
        cookie,
    })))
}

/// Writes a whole response and closes the connection.
pub async fn write_response<S: AsyncWrite + Unpin>(
    stream: &mut S,
    status: &str,
    content_type: &str,
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    write_response_with(stream, status, content_type, &[], body, head_only).await
}

/// [`write_response`] with more headers (`name: value` lines, each without
/// its line end).
pub async fn write_response_with<S: AsyncWrite + Unpin>(
    stream: &mut S,
    status: &str,
    content_type: &str,
    headers: &[String],
    body: &[u8],
    head_only: bool,
) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\n");
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    let mut response = format!(
        "{head}content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        response.extend_from_slice(body);
    }
    stream.write_all(&response).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn only_reads_are_allowed() {
        let ready = Readiness::new();
        assert_eq!(respond("POST", "/healthz", &ready).0, "405 Method Not Allowed");
        assert_eq!(respond("HEAD", "/healthz", &ready).0, "200 OK");
    }
}

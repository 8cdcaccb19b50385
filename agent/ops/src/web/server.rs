//! Serving a port's HTTP connections: at most so many at once and per
//! address, each on hyper's HTTP/1.1 server with a read timeout.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use kindling_schemas::tls::Conn;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::auth::HttpAuth;
use super::pages::Pages;
use super::router::router;

/// A client that does not send a whole request head within this time is
/// dropped (also between the requests of a kept-alive connection).
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Open HTTP connections a port serves at once; one more is closed at once
/// (a scraper or a browser needs a few; a peer opening thousands gets none
/// of the process' memory or tasks).
pub const MAX_CONNECTIONS: usize = 128;

/// Of [`MAX_CONNECTIONS`], the most one peer address holds: one address
/// cannot take the port from a scraper or a browser elsewhere.
pub const MAX_CONNECTIONS_PER_PEER: usize = 16;

/// Serves [`router`] on the HTTP connections of a port until `stop`, at
/// most [`MAX_CONNECTIONS`] at once and [`MAX_CONNECTIONS_PER_PEER`] from
/// one address.
pub async fn serve(conns: mpsc::Receiver<Conn>, auth: HttpAuth, stop: CancellationToken, pages: Pages) {
    let caps = (MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER);
    serve_capped(conns, router(auth, pages), caps, stop).await
}

async fn serve_capped(
    mut conns: mpsc::Receiver<Conn>,
    app: Router,
    (cap, per_peer): (usize, usize),
    stop: CancellationToken,
) {
    use tonic::transport::server::Connected as _;
    let tracker = TaskTracker::new();
    let open = std::sync::Arc::new(tokio::sync::Semaphore::new(cap));
    let peers = crate::listen::PeerSlots::new(per_peer);
    loop {
        let conn = tokio::select! {
            _ = stop.cancelled() => break,
            c = conns.recv() => match c {
                Some(c) => c,
                None => break,
            },
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::debug!(cap, "HTTP connection refused: the port serves its cap already");
            drop(conn);
            continue;
        };
        let peer = conn.connect_info().remote_addr();
        let mine = match peer.map(|p| peers.take(p.ip())) {
            Some(None) => {
                tracing::debug!(
                    ?peer,
                    cap = per_peer,
                    "HTTP connection refused: its address holds its cap"
                );
                drop(conn);
                continue;
            }
            Some(Some(slot)) => Some(slot),
            None => None,
        };
        let served = serve_connection(conn, app.clone(), true, stop.clone());
        tracker.spawn(async move {
            served.await;
            drop((permit, mine));
        });
    }
    tracker.close();
    tracker.wait().await;
}

/// Serves `app` on one connection (`keep_alive`: more than one request)
/// until the client closes it, it idles past [`READ_TIMEOUT`], or `stop`.
pub(crate) async fn serve_connection<S>(io: S, app: Router, keep_alive: bool, stop: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(READ_TIMEOUT)
        .keep_alive(keep_alive);
    let conn = http.serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "HTTP connection");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use kindling_schemas::auth::{BearerCheck, Token};
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::web::{Page, html_csp};

    /// Reads one response with a `content-length` body: (status line, body).
    async fn response(r: &mut BufReader<TcpStream>) -> (String, String) {
        let mut status = String::new();
        r.read_line(&mut status).await.expect("status");
        let mut len = 0;
        loop {
            let mut line = String::new();
            r.read_line(&mut line).await.expect("header");
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().expect("length");
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).await.expect("body");
        (
            status.trim_end().to_owned(),
            String::from_utf8(body).expect("utf-8"),
        )
    }

    #[test]
    fn an_html_page_may_run_its_own_inline_scripts_and_nothing_else() {
        let html = b"<html><script>alert(1)</script><p>x</p><script>let x = 2;\n</script></html>";
        let csp = html_csp(html);
        // The hashes as Python's hashlib and base64 give them.
        assert!(
            csp.contains(
                "script-src 'sha256-bhHHL3z2vDgxUt0W3dWQOrprscmda2Y5pLsLg4GF+pI=' \
                 'sha256-NRzL03VKFG+4k2TcOAsI7fbzrntwIxHEfSQk55QKpC8=';"
            ),
            "{csp}"
        );
        assert!(csp.starts_with("default-src 'none';") && csp.contains("frame-ancestors 'none'"));
        assert!(html_csp(b"<p>no script</p>").contains("script-src 'none';"));
    }

    #[tokio::test]
    async fn a_scraper_keeps_its_connection_from_request_to_request() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let renders = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let pages: Pages = {
            let renders = renders.clone();
            Arc::new(move |path: &str| {
                let n = renders.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                (path == "/metrics").then(|| Page {
                    content_type: "text/plain",
                    body: Bytes::from(format!("m {n}\n")),
                })
            })
        };
        let auth = HttpAuth::new(BearerCheck::new(Some(Token::new("op"))), None, false);
        let server = tokio::spawn(serve(rx, auth, stop.clone(), pages));
        let client = TcpStream::connect(addr).await.expect("connect");
        let (conn, _) = listener.accept().await.expect("accept");
        tx.send(Conn::Plain(conn)).await.expect("hand over");
        let mut client = BufReader::new(client);
        for n in 1..=3 {
            let request = "GET /metrics HTTP/1.1\r\nhost: x\r\nauthorization: Bearer op\r\n\r\n";
            client
                .get_mut()
                .write_all(request.as_bytes())
                .await
                .expect("request");
            let (status, body) = response(&mut client).await;
            assert_eq!(status, "HTTP/1.1 200 OK");
            assert_eq!(body, format!("m {n}\n"), "request {n} on the one connection");
        }
        // A refused request does not cost the connection either.
        let request = "GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n";
        client
            .get_mut()
            .write_all(request.as_bytes())
            .await
            .expect("request");
        assert_eq!(response(&mut client).await.0, "HTTP/1.1 401 Unauthorized");
        stop.cancel();
        server.await.expect("the server stops");
    }

    #[tokio::test]
    async fn a_connection_past_the_cap_is_closed_and_the_others_serve_on() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_capped(rx, metrics_app(), (2, 2), stop.clone()));
        let request = "GET /metrics HTTP/1.1\r\nhost: x\r\nauthorization: Bearer op\r\n\r\n";
        let mut open = Vec::new();
        for _ in 0..3 {
            open.push(hand_over("127.0.0.1", addr, &listener, &tx).await);
        }
        // The third is closed without an answer.
        let mut third = open.pop().expect("third");
        let _ = third.get_mut().write_all(request.as_bytes()).await;
        let mut rest = Vec::new();
        let n = third.read_to_end(&mut rest).await.unwrap_or(0);
        assert_eq!(
            n,
            0,
            "answered past the cap: {:?}",
            String::from_utf8_lossy(&rest)
        );
        // The two within it are served, and keep being served.
        for client in &mut open {
            for _ in 0..2 {
                client
                    .get_mut()
                    .write_all(request.as_bytes())
                    .await
                    .expect("request");
                assert_eq!(response(client).await.0, "HTTP/1.1 200 OK");
            }
        }
        stop.cancel();
        server.await.expect("the server stops");
    }

    /// A metrics-only router with the operator token `op`.
    fn metrics_app() -> Router {
        let pages: Pages = Arc::new(|path: &str| {
            (path == "/metrics").then(|| Page {
                content_type: "text/plain",
                body: Bytes::from_static(b"m 1\n"),
            })
        });
        router(
            HttpAuth::new(BearerCheck::new(Some(Token::new("op"))), None, false),
            pages,
        )
    }

    /// A connection from `from` to `addr`, handed over to the server as the
    /// router would.
    async fn hand_over(
        from: &str,
        addr: std::net::SocketAddr,
        listener: &TcpListener,
        tx: &mpsc::Sender<Conn>,
    ) -> BufReader<TcpStream> {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(format!("{from}:0").parse().expect("addr"))
            .expect("bind");
        let client = socket.connect(addr).await.expect("connect");
        let (conn, _) = listener.accept().await.expect("accept");
        tx.send(Conn::Plain(conn)).await.expect("hand over");
        BufReader::new(client)
    }

    /// Whether `client` gets an answer to a request (else it was closed).
    async fn answered(client: &mut BufReader<TcpStream>) -> bool {
        let request = "GET /metrics HTTP/1.1\r\nhost: x\r\nauthorization: Bearer op\r\n\r\n";
        if client.get_mut().write_all(request.as_bytes()).await.is_err() {
            return false;
        }
        let mut status = String::new();
        matches!(client.read_line(&mut status).await, Ok(n) if n > 0)
    }

    #[tokio::test]
    async fn one_address_holds_its_share_of_the_connections_and_another_is_served() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_capped(rx, metrics_app(), (8, 2), stop.clone()));
        let mut flood = Vec::new();
        for _ in 0..3 {
            flood.push(hand_over("127.0.0.2", addr, &listener, &tx).await);
        }
        let mut third = flood.pop().expect("third");
        assert!(
            !answered(&mut third).await,
            "a third connection of one address was served"
        );
        for client in &mut flood {
            assert!(answered(client).await);
        }
        let mut other = hand_over("127.0.0.3", addr, &listener, &tx).await;
        assert!(answered(&mut other).await, "another address was refused");
        // Once one of its connections closes, the address connects again.
        drop(flood.pop());
        let mut again = None;
        for _ in 0..100 {
            let mut c = hand_over("127.0.0.2", addr, &listener, &tx).await;
            if answered(&mut c).await {
                again = Some(c);
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(again.is_some(), "the address never connected again");
        stop.cancel();
        server.await.expect("the server stops");
    }

    #[tokio::test]
    async fn a_client_that_sends_half_a_request_head_is_dropped_after_the_read_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_capped(rx, metrics_app(), (8, 8), stop.clone()));
        let mut slow = hand_over("127.0.0.1", addr, &listener, &tx).await;
        slow.get_mut()
            .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n")
            .await
            .expect("half a head");
        let started = tokio::time::Instant::now();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(READ_TIMEOUT * 4, slow.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "the slow client was never dropped");
        assert!(started.elapsed() >= READ_TIMEOUT / 2, "dropped before its time");
        // Meanwhile and after, the port serves.
        let mut other = hand_over("127.0.0.1", addr, &listener, &tx).await;
        assert!(answered(&mut other).await);
        stop.cancel();
        server.await.expect("the server stops");
    }
}

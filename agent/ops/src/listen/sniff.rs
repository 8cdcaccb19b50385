//! Which server a connection is for: a TLS one by the ALPN protocol it
//! negotiated, a plaintext one by its first bytes.

use std::io;
use std::time::Duration;

use tokio::net::TcpStream;

/// Which server a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The gRPC server (anything that is not another's start).
    Grpc,
    /// The ring data plane ([`kindling_schemas::ring`]).
    Ring,
    /// The HTTP side: pages, `/metrics`, probes.
    Http,
}

/// The starts of a plaintext connection that are not gRPC, and their servers.
const STARTS: [(&[u8], Route); 3] = [
    (&kindling_schemas::ring::MAGIC, Route::Ring),
    (b"GET ", Route::Http),
    (b"HEAD ", Route::Http),
];

/// The most first bytes [`Route::of_first_bytes`] needs to decide.
const LONGEST_START: usize = kindling_schemas::ring::MAGIC.len();

impl Route {
    /// The server a TLS connection that negotiated `alpn` is for.
    pub fn of_alpn(alpn: Option<&[u8]>) -> Route {
        match alpn {
            Some(p) if p == kindling_schemas::ring::ALPN => Route::Ring,
            Some(b"http/1.1") => Route::Http,
            _ => Route::Grpc,
        }
    }

    /// The server a plaintext connection whose first bytes are `seen` is
    /// for; `None` while they are a proper prefix of a known start (more
    /// bytes decide). Any 8 bytes (the ring's magic, the longest start)
    /// decide.
    pub fn of_first_bytes(seen: &[u8]) -> Option<Route> {
        if let Some((_, route)) = STARTS.iter().find(|(s, _)| seen.starts_with(s)) {
            return Some(*route);
        }
        match STARTS.iter().any(|(s, _)| s.starts_with(seen)) {
            true => None,
            false => Some(Route::Grpc),
        }
    }
}

/// The longest pause between two looks at a connection whose first bytes
/// are still a prefix of a known start.
const MAX_PEEK_PAUSE: Duration = Duration::from_millis(100);

/// Which server a plaintext connection is for, from its first bytes: peeks
/// until they match a known start, or cannot.
pub(super) async fn sniff(tcp: &TcpStream) -> io::Result<Route> {
    let mut buf = [0u8; LONGEST_START];
    let mut pause = Duration::from_millis(1);
    loop {
        let n = tcp.peek(&mut buf).await?;
        if n == 0 {
            return Ok(Route::Grpc);
        }
        if let Some(route) = Route::of_first_bytes(&buf[..n]) {
            return Ok(route);
        }
        // A prefix of a known start so far (rare: each is sent in one
        // write). A peek sees the same bytes until more come, so look again
        // less often the longer it stays a prefix: a peer that stops there
        // costs ten peeks a second, not a thousand, until the handshake
        // timeout closes it.
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PEEK_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A connection that stops in the middle of a known start is routed
    /// once the rest comes, however long it paused.
    #[tokio::test(start_paused = true)]
    async fn a_start_cut_in_two_is_routed_when_the_rest_comes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mut client = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        client.write_all(b"GE").await.expect("write");
        let sniffing = tokio::spawn(async move { sniff(&server).await });
        // Thirty seconds of the paused clock: the pauses grew to their cap.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!sniffing.is_finished(), "a prefix decides nothing");
        client.write_all(b"T / HTTP/1.1\r\n").await.expect("write");
        assert_eq!(sniffing.await.expect("task").expect("sniff"), Route::Http);
    }
}

//! Which server a connection is for: a TLS one by the ALPN protocol it
//! negotiated, a plaintext one by its first bytes.

use std::io;
use std::time::Duration;

use tokio::net::TcpStream;

/// Which server a connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Route {
    Grpc,
    Ring,
    Http,
}

impl Route {
    /// The server a TLS connection that negotiated `alpn` is for.
    pub(super) fn of_alpn(alpn: Option<&[u8]>) -> Route {
        match alpn {
            Some(p) if p == kindling_schemas::ring::ALPN => Route::Ring,
            Some(b"http/1.1") => Route::Http,
            _ => Route::Grpc,
        }
    }
}

/// Which server a plaintext connection is for, from its first bytes: peeks
/// until they match a known start, or cannot.
pub(super) async fn sniff(tcp: &TcpStream) -> io::Result<Route> {
    let starts: [(&[u8], Route); 3] = [
        (&kindling_schemas::ring::MAGIC, Route::Ring),
        (b"GET ", Route::Http),
        (b"HEAD ", Route::Http),
    ];
    let mut buf = [0u8; 8];
    loop {
        let n = tcp.peek(&mut buf).await?;
        if n == 0 {
            return Ok(Route::Grpc);
        }
        let seen = &buf[..n];
        if let Some((_, route)) = starts.iter().find(|(s, _)| seen.starts_with(s)) {
            return Ok(*route);
        }
        if !starts.iter().any(|(s, _)| s.starts_with(seen)) {
            return Ok(Route::Grpc);
        }
        // A prefix of a known start so far (rare: each is sent in one write).
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

//! Plain HTTP/1.1 requests to a Kindling port's HTTP side (`/metrics`, the
//! status page) or any loopback server, one connection per request.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A response: status code, head (status line and headers) and body.
#[derive(Debug, Clone)]
pub struct Response {
    pub code: u16,
    pub head: String,
    pub body: String,
}

/// `GET path` on `addr` with `headers` (`name: value` each).
pub async fn get(addr: &str, path: &str, headers: &[String]) -> Response {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n{extra}connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("request");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("response");
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Response {
        code,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

/// The `authorization` header for a bearer token.
pub fn bearer(token: &str) -> String {
    format!("authorization: Bearer {token}")
}

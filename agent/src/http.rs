//! The HTTP/1.1 side of an agent's and the rendezvous' own port: `/metrics`
//! everywhere, the status page and its data on the rendezvous. HTTP is told
//! apart from gRPC by its first bytes (or TLS ALPN `http/1.1`), so the same
//! TLS guards it, and every path needs a token: the operator token, or the
//! *viewer* token, which reads these pages and nothing else (give it to
//! Prometheus and to people watching). Job credentials are refused: the
//! pages span every job. Probes stay open on the health port.
//!
//! A browser cannot send a bearer header when it opens a page: opening any
//! path once as `?token=<token>` answers with a redirect to the same path
//! and an `HttpOnly`, `SameSite=Strict` cookie holding the token (`Secure`
//! over TLS), which the page's own requests then carry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use kindling_schemas::auth::{BearerCheck, Caller, Token};
use kindling_schemas::credential::{hex, unhex};
use kindling_schemas::tls::Conn;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::health::{Head, read_head, write_response_with};

/// The cookie a browser keeps the token in (hex-encoded).
pub const COOKIE: &str = "kindling_token";

/// Who may read a port's pages.
#[derive(Clone, Debug)]
pub struct HttpAuth {
    check: BearerCheck,
    viewer: Option<Token>,
    secure: bool,
}

impl HttpAuth {
    /// The operator (as `check` knows it) and the holder of `viewer`;
    /// `secure`: the port speaks TLS (the cookie is then `Secure`).
    pub fn new(check: BearerCheck, viewer: Option<Token>, secure: bool) -> Self {
        HttpAuth {
            check,
            viewer,
            secure,
        }
    }

    /// Admits `token`, or says why not (status line, message).
    fn admit(&self, token: Option<&str>) -> Result<(), (&'static str, String)> {
        if let (Some(viewer), Some(presented)) = (&self.viewer, token)
            && viewer.matches(presented)
        {
            return Ok(());
        }
        match self.check.caller_of(token) {
            Ok(Caller::Operator) => Ok(()),
            Ok(Caller::Job(_)) => Err((
                "403 Forbidden",
                "a job credential cannot read this port's pages (they span every job): use the operator \
                 or the viewer token\n"
                    .into(),
            )),
            Err(status) => Err((
                "401 Unauthorized",
                format!(
                    "{}: send `authorization: Bearer <token>` (the operator or the viewer token), or open \
                     the page once as `?token=<token>` in a browser\n",
                    status.message()
                ),
            )),
        }
    }
}

/// What a path answers.
#[derive(Debug)]
pub struct Page {
    /// The content type.
    pub content_type: &'static str,
    /// The body.
    pub body: Bytes,
}

/// The pages of a port: `None` for a path it does not serve.
pub type Pages = Arc<dyn Fn(&str) -> Option<Page> + Send + Sync>;

/// How long a rendered page is served again: `/metrics` and the status
/// page's data are at most this old.
pub const RENDER_TTL: Duration = Duration::from_millis(200);

/// `pages`, each path's body rendered at most once per `ttl`: a dashboard
/// or scraper polling a page many times a second costs the process one
/// rendering per `ttl`, not one per read (rendering walks every job).
pub fn cached(pages: Pages, ttl: Duration) -> Pages {
    let rendered: Mutex<HashMap<String, (Instant, &'static str, Bytes)>> = Mutex::default();
    Arc::new(move |path: &str| {
        let mut rendered = rendered.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, content_type, body)) = rendered.get(path)
            && at.elapsed() < ttl
        {
            return Some(Page {
                content_type,
                body: body.clone(),
            });
        }
        let page = pages(path)?;
        rendered.insert(
            path.to_owned(),
            (Instant::now(), page.content_type, page.body.clone()),
        );
        Some(page)
    })
}

/// Serves `pages` on the HTTP/1.1 connections of a port until `stop`.
pub async fn serve(mut conns: mpsc::Receiver<Conn>, auth: HttpAuth, stop: CancellationToken, pages: Pages) {
    loop {
        let mut conn = tokio::select! {
            _ = stop.cancelled() => return,
            c = conns.recv() => match c {
                Some(c) => c,
                None => return,
            },
        };
        let (auth, pages) = (auth.clone(), pages.clone());
        tokio::spawn(async move {
            let (answer, head_only) = match read_head(&mut conn).await {
                Ok(Some(Ok(head))) => (respond(&head, &auth, &*pages), head.method == "HEAD"),
                Ok(Some(Err(()))) => (Answer::text("400 Bad Request", "bad request\n".into()), false),
                _ => return,
            };
            let _ = write_response_with(
                &mut conn,
                answer.status,
                answer.content_type,
                &answer.headers,
                &answer.body,
                head_only,
            )
            .await;
        });
    }
}

/// A whole response.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: &'static str,
    pub content_type: &'static str,
    pub headers: Vec<String>,
    pub body: Bytes,
}

impl Answer {
    fn text(status: &'static str, body: String) -> Self {
        Answer {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: Bytes::from(body),
        }
    }
}

/// The answer to one request head.
pub(crate) fn respond(
    head: &Head,
    auth: &HttpAuth,
    pages: &(dyn Fn(&str) -> Option<Page> + Send + Sync),
) -> Answer {
    if !matches!(head.method.as_str(), "GET" | "HEAD") {
        return Answer::text("405 Method Not Allowed", "method not allowed\n".into());
    }
    // A browser's first visit: the token in the query becomes a cookie, and
    // the address bar (and history) loses it.
    if let Some(token) = head.query.as_deref().and_then(|q| query_param(q, "token")) {
        return match auth.admit(Some(&token)) {
            Ok(()) => Answer {
                status: "303 See Other",
                content_type: "text/plain; charset=utf-8",
                headers: vec![
                    format!("location: {}", head.path),
                    format!(
                        "set-cookie: {COOKIE}={}; Path=/; HttpOnly; SameSite=Strict{}",
                        hex(token.as_bytes()),
                        if auth.secure { "; Secure" } else { "" }
                    ),
                ],
                body: Bytes::new(),
            },
            Err((status, message)) => Answer::text(status, message),
        };
    }
    let bearer = head
        .authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(str::to_owned);
    let token = bearer.or_else(|| head.cookie.as_deref().and_then(cookie_token));
    if let Err((status, message)) = auth.admit(token.as_deref()) {
        return Answer::text(status, message);
    }
    match pages(&head.path) {
        Some(page) => Answer {
            status: "200 OK",
            content_type: page.content_type,
            headers: vec!["cache-control: no-store".into()],
            body: page.body,
        },
        None => Answer::text("404 Not Found", format!("not found: {}\n", head.path)),
    }
}

/// The token in a `cookie` header, if it holds ours.
fn cookie_token(cookie: &str) -> Option<String> {
    let value = cookie
        .split(';')
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)?
        .1;
    let bytes = unhex(value)?;
    String::from_utf8(bytes).ok()
}

/// A query parameter's value, percent-decoded.
fn query_param(query: &str, name: &str) -> Option<String> {
    let raw = query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == name)?
        .1;
    let mut out = Vec::with_capacity(raw.len());
    let bytes = raw.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                out.push(u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?, 16).ok()?);
                i += 3;
            }
            b'%' => return None,
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(path: &str, query: Option<&str>, authorization: Option<&str>, cookie: Option<&str>) -> Head {
        Head {
            method: "GET".into(),
            path: path.into(),
            query: query.map(str::to_owned),
            authorization: authorization.map(str::to_owned),
            cookie: cookie.map(str::to_owned),
        }
    }

    fn pages(path: &str) -> Option<Page> {
        (path == "/metrics").then(|| Page {
            content_type: "text/plain",
            body: Bytes::from_static(b"m 1\n"),
        })
    }

    fn auth() -> HttpAuth {
        HttpAuth::new(
            BearerCheck::new(Some(Token::new("op"))),
            Some(Token::new("view er")),
            false,
        )
    }

    #[test]
    fn the_operator_and_the_viewer_read_and_nobody_else() {
        let a = auth();
        // Without a viewer token configured, nothing else is a viewer.
        let plain = HttpAuth::new(BearerCheck::new(Some(Token::new("op"))), None, false);
        for (auth, path, bearer, status) in [
            (&a, "/metrics", Some("Bearer op"), "200 OK"),
            (&a, "/metrics", Some("Bearer view er"), "200 OK"),
            (&a, "/metrics", None, "401 Unauthorized"),
            (&a, "/metrics", Some("Bearer x"), "401 Unauthorized"),
            (&a, "/nope", Some("Bearer op"), "404 Not Found"),
            (&plain, "/metrics", Some("Bearer view er"), "401 Unauthorized"),
        ] {
            let got = respond(&head(path, None, bearer, None), auth, &pages).status;
            assert_eq!(got, status, "{path} with {bearer:?}");
        }
        let mut post = head("/metrics", None, Some("Bearer op"), None);
        post.method = "POST".into();
        assert_eq!(respond(&post, &a, &pages).status, "405 Method Not Allowed");
    }

    #[test]
    fn a_token_in_the_query_becomes_a_cookie_that_then_reads() {
        let a = HttpAuth::new(
            BearerCheck::new(Some(Token::new("op"))),
            Some(Token::new("view er")),
            true,
        );
        let r = respond(
            &head("/metrics", Some("x=1&token=view%20er"), None, None),
            &a,
            &pages,
        );
        assert_eq!(r.status, "303 See Other");
        assert!(
            r.headers.contains(&"location: /metrics".to_owned()),
            "{:?}",
            r.headers
        );
        let cookie = r
            .headers
            .iter()
            .find_map(|h| h.strip_prefix("set-cookie: "))
            .expect("a cookie");
        assert!(
            cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.ends_with("; Secure")
        );
        let pair = cookie.split(';').next().expect("pair");
        let r = respond(
            &head("/metrics", None, None, Some(&format!("a=b; {pair}"))),
            &a,
            &pages,
        );
        assert_eq!(r.status, "200 OK");
        assert_eq!(&r.body[..], b"m 1\n");
        // A wrong token in the query sets nothing.
        let r = respond(&head("/metrics", Some("token=nope"), None, None), &a, &pages);
        assert_eq!(r.status, "401 Unauthorized");
        assert!(r.headers.is_empty());
        // A cookie that is not ours, or not hex, admits nobody.
        for cookie in [format!("{COOKIE}=zz"), "other=6f70".to_owned()] {
            let r = respond(&head("/metrics", None, None, Some(&cookie)), &a, &pages);
            assert_eq!(r.status, "401 Unauthorized", "{cookie}");
        }
    }

    #[test]
    fn query_values_are_percent_decoded_and_bad_escapes_refused() {
        assert_eq!(query_param("token=a%2Fb+c", "token").as_deref(), Some("a/b c"));
        assert_eq!(query_param("token=a%2", "token"), None);
        assert_eq!(query_param("token=%zz", "token"), None);
        assert_eq!(query_param("other=1", "token"), None);
    }

    #[test]
    fn a_cached_page_is_rendered_once_per_ttl_and_per_path() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let renders = Arc::new(AtomicU64::new(0));
        let counted: Pages = {
            let renders = renders.clone();
            Arc::new(move |path: &str| {
                let n = renders.fetch_add(1, Ordering::SeqCst) + 1;
                (path != "/missing").then(|| Page {
                    content_type: "text/plain",
                    body: Bytes::from(format!("{path} {n}")),
                })
            })
        };
        let hour = cached(counted.clone(), Duration::from_secs(3600));
        let body = |p: &Pages, path: &str| p(path).map(|page| page.body);
        assert_eq!(body(&hour, "/metrics").as_deref(), Some(&b"/metrics 1"[..]));
        assert_eq!(body(&hour, "/metrics").as_deref(), Some(&b"/metrics 1"[..]));
        assert_eq!(body(&hour, "/api/status").as_deref(), Some(&b"/api/status 2"[..]));
        assert_eq!(body(&hour, "/missing"), None);
        assert_eq!(
            body(&hour, "/missing"),
            None,
            "a path it does not serve is asked again"
        );
        assert_eq!(renders.load(Ordering::SeqCst), 4);
        let none = cached(counted, Duration::ZERO);
        assert_eq!(body(&none, "/metrics").as_deref(), Some(&b"/metrics 5"[..]));
        assert_eq!(body(&none, "/metrics").as_deref(), Some(&b"/metrics 6"[..]));
    }
}

//! Who reads a port's pages, as one axum middleware layer: the operator
//! token, or the *viewer* token, which reads these pages and nothing else
//! (give it to Prometheus and to people watching). Job credentials are
//! refused: the pages span every job. Probes stay open on the health port.
//!
//! A browser cannot send a bearer header when it opens a page: opening any
//! path once as `?token=<viewer token>` answers with a redirect to the same path
//! and an `HttpOnly`, `SameSite=Strict` cookie (`Secure` over TLS) holding
//! a *session*: 32 random bytes this process remembers for
//! [`COOKIE_MAX_AGE_SECS`], never the token itself, so a cookie that leaks
//! (a shared profile, a proxy's log) reads pages for hours at most and
//! cannot be replayed as a bearer token against the gRPC port. At most
//! [`MAX_SESSIONS`] live at once (the oldest is forgotten first); a restart
//! forgets them all. The query and the cookie header are parsed by
//! `form_urlencoded` and `cookie`.
//!
//! Only the viewer token is taken in the query: an address ends up in the
//! browser's history (and in proxies' logs), and the operator token, which
//! opens every RPC, must not. It is refused there (403) and taken in the
//! `authorization` header only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kindling_schemas::auth::{BearerCheck, Caller, Token};
use kindling_schemas::credential::{hex, looks_like_credential};
use sha2::{Digest, Sha256};

/// The cookie a browser keeps its session in (hex-encoded).
pub const COOKIE: &str = "kindling_session";

/// How long a session lives (and the browser keeps its cookie): a working
/// day, then the page asks for the token again.
pub const COOKIE_MAX_AGE_SECS: u64 = 8 * 3600;

/// Most sessions remembered at once; a new one past it forgets the oldest.
pub const MAX_SESSIONS: usize = 1024;

/// Live sessions, by the SHA-256 of their cookie value (a lookup never
/// compares the secret itself), with when each lapses.
#[derive(Debug, Default)]
struct Sessions {
    lapses: HashMap<[u8; 32], Instant>,
}

impl Sessions {
    fn key(value: &str) -> [u8; 32] {
        Sha256::digest(value.as_bytes()).into()
    }

    /// A new session's cookie value.
    fn open(&mut self, now: Instant, ttl: Duration) -> String {
        self.lapses.retain(|_, lapses| *lapses > now);
        if self.lapses.len() >= MAX_SESSIONS
            && let Some(oldest) = self.lapses.iter().min_by_key(|(_, t)| **t).map(|(k, _)| *k)
        {
            self.lapses.remove(&oldest);
        }
        let value = hex(&rand::random::<[u8; 32]>());
        self.lapses.insert(Self::key(&value), now + ttl);
        value
    }

    fn admits(&self, value: &str, now: Instant) -> bool {
        self.lapses
            .get(&Self::key(value))
            .is_some_and(|lapses| *lapses > now)
    }
}

/// Who may read a port's pages.
#[derive(Clone, Debug)]
pub struct HttpAuth {
    check: BearerCheck,
    viewer: Option<Token>,
    secure: bool,
    sessions: Arc<Mutex<Sessions>>,
}

impl HttpAuth {
    /// The operator (as `check` knows it) and the holder of `viewer`;
    /// `secure`: the port speaks TLS (the cookie is then `Secure`).
    pub fn new(check: BearerCheck, viewer: Option<Token>, secure: bool) -> Self {
        HttpAuth {
            check,
            viewer,
            secure,
            sessions: Arc::default(),
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits `token`, or says why not.
    fn admit(&self, token: Option<&str>) -> Result<(), (StatusCode, String)> {
        if let (Some(viewer), Some(presented)) = (&self.viewer, token)
            && viewer.matches(presented)
        {
            return Ok(());
        }
        match self.check.caller_of(token) {
            Ok(Caller::Operator) => Ok(()),
            Ok(Caller::Job(_)) => Err(job_credential_refused()),
            // A port that cannot verify credentials (the rendezvous holds no
            // credential key) still tells a job credential what it is.
            Err(_) if token.is_some_and(looks_like_credential) => Err(job_credential_refused()),
            Err(status) => Err((
                StatusCode::UNAUTHORIZED,
                format!(
                    "{}: send `authorization: Bearer <token>` (the operator or the viewer token), or open \
                     the page once as `?token=<viewer token>` in a browser\n",
                    status.message()
                ),
            )),
        }
    }

    /// Admits `token` presented in a page's address: the viewer token only.
    fn admit_in_query(&self, token: &str) -> Result<(), (StatusCode, String)> {
        if let Some(viewer) = &self.viewer
            && viewer.matches(token)
        {
            return Ok(());
        }
        match self.check.caller_of(Some(token)) {
            Ok(Caller::Operator) => Err((
                StatusCode::FORBIDDEN,
                "the operator token is not taken in a page's address (the browser's history keeps \
                 it): open the page as `?token=<viewer token>`, or send the operator token as \
                 `authorization: Bearer <token>`\n"
                    .into(),
            )),
            _ => self.admit(Some(token)),
        }
    }
}

fn job_credential_refused() -> (StatusCode, String) {
    (
        StatusCode::FORBIDDEN,
        "a job credential cannot read this port's pages (they span every job): use the operator \
         or the viewer token\n"
            .into(),
    )
}

/// The middleware: the request goes on to the page only with an admitted
/// token (bearer header, else our cookie); a `?token=` visit is answered
/// with the cookie and a redirect to the same path without the query.
pub async fn require_reader(State(auth): State<HttpAuth>, request: Request, next: Next) -> Response {
    // A browser's first visit: the token in the query becomes a cookie, and
    // the address bar (and history) loses it.
    if let Some(token) = request.uri().query().and_then(|q| query_param(q, "token")) {
        return match auth.admit_in_query(&token) {
            Ok(()) => {
                let session = auth
                    .sessions()
                    .open(Instant::now(), Duration::from_secs(COOKIE_MAX_AGE_SECS));
                let cookie = format!(
                    "{COOKIE}={session}; Path=/; Max-Age={COOKIE_MAX_AGE_SECS}; HttpOnly; SameSite=Strict{}",
                    if auth.secure { "; Secure" } else { "" }
                );
                // One leading slash: `//host/…` (or `/\host/…`, which a
                // browser reads the same) would send it to another site.
                let location = format!("/{}", request.uri().path().trim_start_matches(['/', '\\']));
                (
                    StatusCode::SEE_OTHER,
                    [(header::LOCATION, location), (header::SET_COOKIE, cookie)],
                )
                    .into_response()
            }
            Err(refusal) => refusal.into_response(),
        };
    }
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|a| a.to_str().ok())
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(str::to_owned);
    if bearer.is_none()
        && let Some(session) = cookie_session(request.headers())
        && auth.sessions().admits(&session, Instant::now())
    {
        return next.run(request).await;
    }
    match auth.admit(bearer.as_deref()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

/// Our cookie's value, if the request carries it.
fn cookie_session(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(cookie::Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == COOKIE)
        .map(|c| c.value().to_owned())
}

/// A query parameter's value, percent-decoded; `None` when absent or when
/// its escapes are malformed (a token is never guessed from a broken one).
fn query_param(query: &str, name: &str) -> Option<String> {
    let raw = query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == name)?
        .1;
    let well_formed = raw
        .split('%')
        .skip(1)
        .all(|rest| rest.len() >= 2 && rest.as_bytes()[..2].iter().all(u8::is_ascii_hexdigit));
    if !well_formed {
        return None;
    }
    form_urlencoded::parse(format!("v={raw}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
}

#[cfg(test)]
mod tests {
    use axum::body::{Body, to_bytes};
    use axum::http::Request;
    use bytes::Bytes;
    use tower::ServiceExt;

    use super::*;
    use crate::web::{Page, Pages, router};

    fn pages() -> Pages {
        std::sync::Arc::new(|path: &str| {
            (path == "/metrics").then(|| Page {
                content_type: "text/plain",
                body: Bytes::from_static(b"m 1\n"),
            })
        })
    }

    fn auth() -> HttpAuth {
        HttpAuth::new(
            BearerCheck::new(Some(Token::new("op"))),
            Some(Token::new("view er")),
            false,
        )
    }

    /// The router's answer: status, headers and body.
    async fn ask(
        auth: &HttpAuth,
        method: &str,
        uri: &str,
        authorization: Option<&str>,
        cookie: Option<&str>,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(a) = authorization {
            request = request.header(header::AUTHORIZATION, a);
        }
        if let Some(c) = cookie {
            request = request.header(header::COOKIE, c);
        }
        let response = router(auth.clone(), pages())
            .oneshot(request.body(Body::empty()).expect("request"))
            .await
            .expect("infallible");
        let (parts, body) = response.into_parts();
        (
            parts.status,
            parts.headers,
            to_bytes(body, 1 << 20).await.expect("body"),
        )
    }

    #[tokio::test]
    async fn the_operator_and_the_viewer_read_and_nobody_else() {
        let a = auth();
        // Without a viewer token configured, nothing else is a viewer.
        let plain = HttpAuth::new(BearerCheck::new(Some(Token::new("op"))), None, false);
        for (auth, path, bearer, status) in [
            (&a, "/metrics", Some("Bearer op"), StatusCode::OK),
            (&a, "/metrics", Some("Bearer view er"), StatusCode::OK),
            (&a, "/metrics", None, StatusCode::UNAUTHORIZED),
            (&a, "/metrics", Some("Bearer x"), StatusCode::UNAUTHORIZED),
            (&a, "/nope", Some("Bearer op"), StatusCode::NOT_FOUND),
            (
                &plain,
                "/metrics",
                Some("Bearer view er"),
                StatusCode::UNAUTHORIZED,
            ),
        ] {
            let got = ask(auth, "GET", path, bearer, None).await.0;
            assert_eq!(got, status, "{path} with {bearer:?}");
        }
        let post = ask(&a, "POST", "/metrics", Some("Bearer op"), None).await.0;
        assert_eq!(post, StatusCode::METHOD_NOT_ALLOWED);
        // HEAD reads like GET, without the body.
        let (status, _, body) = ask(&a, "HEAD", "/metrics", Some("Bearer op"), None).await;
        assert_eq!((status, body.len()), (StatusCode::OK, 0));
        let (_, headers, body) = ask(&a, "GET", "/metrics", Some("Bearer op"), None).await;
        assert_eq!(&body[..], b"m 1\n");
        assert_eq!(headers[header::CACHE_CONTROL], "no-store");
        // Every answer, a refusal too, forbids sniffing, framing and loading.
        for (_, headers, _) in [
            ask(&a, "GET", "/metrics", Some("Bearer op"), None).await,
            ask(&a, "GET", "/metrics", None, None).await,
            ask(&a, "GET", "/nope", Some("Bearer op"), None).await,
        ] {
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY");
            assert_eq!(headers[header::REFERRER_POLICY], "no-referrer");
            let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().expect("csp");
            assert!(
                csp.starts_with("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
                "{csp}"
            );
        }
    }

    #[tokio::test]
    async fn a_token_in_the_query_becomes_a_cookie_that_then_reads() {
        let a = HttpAuth::new(
            BearerCheck::new(Some(Token::new("op"))),
            Some(Token::new("view er")),
            true,
        );
        let (status, headers, _) = ask(&a, "GET", "/metrics?x=1&token=view%20er", None, None).await;
        assert_eq!(status, StatusCode::SEE_OTHER);
        assert_eq!(headers[header::LOCATION], "/metrics", "{headers:?}");
        let cookie = headers[header::SET_COOKIE].to_str().expect("a cookie");
        assert!(
            cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.ends_with("; Secure")
        );
        assert!(
            cookie.contains(&format!("Max-Age={COOKIE_MAX_AGE_SECS}")),
            "{cookie}"
        );
        let pair = cookie.split(';').next().expect("pair");
        let (status, _, body) = ask(&a, "GET", "/metrics", None, Some(&format!("a=b; {pair}"))).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&body[..], b"m 1\n");
        // The cookie holds a session, not the token: nothing of the token is
        // in it, and its value is no bearer token.
        let value = pair.split_once('=').expect("name=value").1;
        assert!(
            !cookie.contains("view") && !cookie.contains(&hex(b"view er")),
            "{cookie}"
        );
        assert_eq!(value.len(), 64, "{value}");
        let as_bearer = ask(&a, "GET", "/metrics", Some(&format!("Bearer {value}")), None)
            .await
            .0;
        assert_eq!(as_bearer, StatusCode::UNAUTHORIZED);
        // Another process (a restart) knows no session.
        let restarted = HttpAuth::new(BearerCheck::new(Some(Token::new("op"))), None, true);
        let status = ask(&restarted, "GET", "/metrics", None, Some(pair)).await.0;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        // A wrong token in the query sets nothing.
        let (status, headers, _) = ask(&a, "GET", "/metrics?token=nope", None, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(headers.get(header::SET_COOKIE).is_none() && headers.get(header::LOCATION).is_none());
        // A cookie that is no live session, or not ours, admits nobody; nor
        // does the old cookie that held the token itself.
        for cookie in [
            format!("{COOKIE}=zz"),
            format!("{COOKIE}={}", hex(b"view er")),
            format!("kindling_token={}", hex(b"view er")),
            "other=6f70".to_owned(),
        ] {
            let status = ask(&a, "GET", "/metrics", None, Some(&cookie)).await.0;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{cookie}");
        }
        // The redirect stays on this site, whatever the path.
        let (_, headers, _) = ask(&a, "GET", "//evil.example/x?token=view%20er", None, None).await;
        assert_eq!(headers[header::LOCATION], "/evil.example/x");
        // A browser reads `\` as `/`: `/\host` is another site too.
        let (_, headers, _) = ask(&a, "GET", "/\\evil.example/x?token=view%20er", None, None).await;
        assert_eq!(headers[header::LOCATION], "/evil.example/x");
    }

    #[tokio::test]
    async fn the_operator_token_is_not_taken_in_the_address() {
        // It would stay in the browser's history: refused, no session, and
        // the refusal says what to do instead; in the header it still reads.
        for a in [
            auth(),
            HttpAuth::new(BearerCheck::new(Some(Token::new("op"))), None, false),
        ] {
            let (status, headers, body) = ask(&a, "GET", "/metrics?token=op", None, None).await;
            assert_eq!(status, StatusCode::FORBIDDEN);
            assert!(headers.get(header::SET_COOKIE).is_none() && headers.get(header::LOCATION).is_none());
            assert!(String::from_utf8_lossy(&body).contains("viewer token"));
            let status = ask(&a, "GET", "/metrics", Some("Bearer op"), None).await.0;
            assert_eq!(status, StatusCode::OK);
        }
    }

    #[test]
    fn sessions_lapse_and_the_oldest_is_forgotten_past_the_cap() {
        let mut sessions = Sessions::default();
        let t0 = Instant::now();
        let hour = Duration::from_secs(3600);
        let first = sessions.open(t0, hour);
        assert!(sessions.admits(&first, t0 + hour / 2));
        assert!(!sessions.admits(&first, t0 + hour), "a lapsed session admits");
        let later: Vec<String> = (1..=MAX_SESSIONS as u32)
            .map(|i| sessions.open(t0 + Duration::from_millis(u64::from(i)), hour))
            .collect();
        assert_eq!(sessions.lapses.len(), MAX_SESSIONS);
        assert!(!sessions.admits(&first, t0), "the oldest was not forgotten");
        assert!(later.iter().all(|s| sessions.admits(s, t0)));
    }

    #[tokio::test]
    async fn a_job_credential_is_forbidden_even_where_it_cannot_be_verified() {
        // The rendezvous holds no credential key: a credential is still told
        // it is one (403), where a wrong token is unauthenticated (401).
        let a = auth();
        let credential = kindling_schemas::credential::CredentialKey::generate().issue(
            "j",
            kindling_schemas::credential::Role::Producer,
            Duration::from_secs(60),
        );
        let got = ask(&a, "GET", "/metrics", Some(&format!("Bearer {credential}")), None).await;
        assert_eq!(got.0, StatusCode::FORBIDDEN);
        assert!(String::from_utf8_lossy(&got.2).contains("job credential"));
        let got = ask(&a, "GET", "/metrics", Some("Bearer kc2.nope"), None).await.0;
        assert_eq!(got, StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn query_values_are_percent_decoded_and_bad_escapes_refused() {
        assert_eq!(query_param("token=a%2Fb+c", "token").as_deref(), Some("a/b c"));
        assert_eq!(query_param("token=a%2", "token"), None);
        assert_eq!(query_param("token=%zz", "token"), None);
        assert_eq!(query_param("other=1", "token"), None);
    }
}

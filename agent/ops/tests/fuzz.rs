//! Property and fuzz tests of what sees a peer's bytes before (or around)
//! authentication. The pages' routing and authentication: any method,
//! path, query, cookie and authorization header; the property: a page
//! answers one of 200/303/401/403/404/405, redirects only to this site, and
//! shows no token anywhere but on the page its holder asked for. The
//! receive meter's reading of gRPC length prefixes, however a stream of
//! any messages (or any bytes) is cut into frames: it charges each
//! stream's largest message and refuses the first past the bound, a claim
//! of 4 GiB costing nothing. The listener's routing of a connection by its
//! first bytes (plaintext) or ALPN protocol (TLS).
//!
//! CI runs 256 cases of each property (well under a second on 2 cores);
//! `PROPTEST_CASES=5000 cargo test -p kindling-ops --test fuzz` runs more.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::http::{HeaderValue, Method, Request, StatusCode, header};
use bytes::Bytes;
use kindling_fixtures::fuzz::cases;
use kindling_ops::listen::Route;
use kindling_ops::receiving::{Metered, ReceiveBudget};
use kindling_ops::web::{COOKIE, HttpAuth, Page, Pages, router};
use kindling_schemas::auth::{BearerCheck, Token};
use kindling_schemas::credential::{CredentialKey, CredentialKeys, Role};
use proptest::prelude::*;
use tower::ServiceExt;

/// Tokens distinct enough that finding their text in an answer means the
/// answer shows them (`op` itself is in "operator").
const OPERATOR: &str = "op-Tq7vK2";
const VIEWER: &str = "view er-9xZ";
/// The viewer token as a query spells it.
const VIEWER_QUERY: &str = "view%20er-9xZ";
/// What the pages serve.
const PAGE: &[u8] = b"m 1\n";

fn pages() -> Pages {
    Arc::new(|path: &str| {
        matches!(path, "/" | "/metrics" | "/api/status").then(|| Page {
            content_type: "text/plain",
            body: Bytes::from_static(PAGE),
        })
    })
}

fn credential_key() -> &'static CredentialKey {
    static KEY: OnceLock<CredentialKey> = OnceLock::new();
    KEY.get_or_init(CredentialKey::generate)
}

/// A port's auth: the operator and the viewer tokens, and (`verify`)
/// the job credentials' key.
fn http_auth(verify: bool, secure: bool) -> HttpAuth {
    let check = BearerCheck::new(Some(Token::new(OPERATOR)))
        .with_credentials(verify.then(|| CredentialKeys::from(credential_key().clone())));
    HttpAuth::new(check, Some(Token::new(VIEWER)), secure)
}

fn method() -> impl Strategy<Value = Method> {
    prop_oneof![
        6 => Just(Method::GET),
        1 => Just(Method::HEAD),
        1 => prop::sample::select(vec![
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::OPTIONS,
            Method::PATCH,
            Method::TRACE,
            Method::CONNECT,
        ]),
        1 => "[A-Za-z!#$%&'*+.^_`|~-]{1,10}".prop_filter_map("a method", |m| Method::from_bytes(m.as_bytes()).ok()),
    ]
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[A-Za-z0-9._~-]{0,10}",
        3 => prop::sample::select(vec!["metrics", "api", "status", "", ".", ".."]).prop_map(str::to_owned),
        2 => "%[0-9A-Fa-f]{2}",
        1 => prop::sample::select(vec!["%2F", "%2f", "%5C", "%2F%2Fevil.example", "%00", "%FF%FE", "%C0%AF"])
            .prop_map(str::to_owned),
        1 => "%[0-9A-Fa-f]?",
        1 => "%[G-Zg-z%]{1,2}",
        1 => "[!$&'()*+,;=:@\"{}|]{1,3}",
        1 => "[a-z]{1000,3000}",
        1 => "[\u{80}-\u{10FFFF}]{1,3}",
    ]
}

/// A path: a page's, or one or more leading slashes, then segments.
fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => prop::sample::select(vec!["/", "/metrics", "/api/status"]).prop_map(str::to_owned),
        3 => (1usize..4, prop::collection::vec(segment(), 0..5))
            .prop_map(|(slashes, segments)| format!("{}{}", "/".repeat(slashes), segments.join("/"))),
    ]
}

/// A `token=` value: the tokens (plain, escaped), a job credential,
/// malformed escapes, anything.
fn token_value() -> impl Strategy<Value = String> {
    let escaped = |t: &str| t.bytes().map(|b| format!("%{b:02X}")).collect::<String>();
    prop_oneof![
        3 => Just(OPERATOR.to_owned()),
        1 => Just(escaped(OPERATOR)),
        2 => Just(VIEWER_QUERY.to_owned()),
        1 => Just(VIEWER.replace(' ', "+")),
        1 => Just(credential_key().issue("j", Role::Producer, Duration::from_secs(600))),
        1 => Just(format!("{OPERATOR}%")),
        1 => Just(format!("{OPERATOR}%2")),
        2 => "[A-Za-z0-9%+._~=-]{0,20}",
    ]
}

fn query() -> impl Strategy<Value = Option<String>> {
    let param = prop_oneof![
        4 => token_value().prop_map(|v| format!("token={v}")),
        2 => ("[a-z]{0,5}", "[a-z0-9%]{0,6}").prop_map(|(k, v)| format!("{k}={v}")),
        1 => prop::sample::select(vec!["token", "token=", "%74oken=x", "TOKEN=x", "", "="]).prop_map(str::to_owned),
        1 => "[!$&'()*+,;=:@/?%A-Za-z0-9]{0,16}",
    ];
    prop::option::weighted(0.7, prop::collection::vec(param, 1..4).prop_map(|p| p.join("&")))
}

/// The cookie header: the session a `?token=` visit opened (when there is
/// one), with other cookies or alone, or cookies that are no session.
#[derive(Clone, Debug)]
enum CookieHeader {
    Live,
    LiveAmong(String),
    Other(String),
}

fn cookie() -> impl Strategy<Value = Option<CookieHeader>> {
    prop::option::of(prop_oneof![
        2 => Just(CookieHeader::Live),
        1 => "[a-z]{1,4}=[a-z0-9]{0,4}".prop_map(CookieHeader::LiveAmong),
        1 => "[0-9a-f]{64}".prop_map(|v| CookieHeader::Other(format!("{COOKIE}={v}"))),
        1 => Just(CookieHeader::Other(format!("{COOKIE}={OPERATOR}"))),
        1 => Just(CookieHeader::Other(format!("kindling_token={OPERATOR}"))),
        1 => "[ -~]{0,40}".prop_map(CookieHeader::Other),
    ])
}

fn authorization() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop::option::of(prop_oneof![
        2 => Just(format!("Bearer {OPERATOR}").into_bytes()),
        1 => Just(format!("Bearer {VIEWER}").into_bytes()),
        1 => Just(format!("Bearer {}", credential_key().issue("j", Role::Reader, Duration::from_secs(600))).into_bytes()),
        1 => Just(b"Bearer kc1.00.00".to_vec()),
        1 => Just(format!("bearer {OPERATOR}").into_bytes()),
        1 => Just(format!("Basic {OPERATOR}").into_bytes()),
        1 => "Bearer [ -~]{0,20}".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..40),
    ])
}

/// One answer of the router: status, headers, body.
struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Bytes,
}

fn ask(
    auth: &HttpAuth,
    method: Method,
    uri: &str,
    authorization: Option<&[u8]>,
    cookie: Option<&str>,
) -> Option<Answer> {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(value) = authorization.and_then(|a| HeaderValue::from_bytes(a).ok()) {
        request = request.header(header::AUTHORIZATION, value);
    }
    if let Some(value) = cookie.and_then(|c| HeaderValue::from_str(c).ok()) {
        request = request.header(header::COOKIE, value);
    }
    // A request line http does not parse never reaches the router.
    let request = request.body(Body::empty()).ok()?;
    let answer = futures::executor::block_on(async {
        let response = router(auth.clone(), pages())
            .oneshot(request)
            .await
            .expect("infallible");
        let (parts, body) = response.into_parts();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body: to_bytes(body, 1 << 20).await.expect("body"),
        }
    });
    Some(answer)
}

/// The cookie a `?token=` visit with the viewer token sets (`name=value`).
fn open_session(auth: &HttpAuth) -> String {
    let answer = ask(auth, Method::GET, &format!("/?token={VIEWER_QUERY}"), None, None).expect("a request");
    assert_eq!(answer.status, StatusCode::SEE_OTHER);
    let cookie = answer.headers[header::SET_COOKIE].to_str().expect("cookie");
    cookie.split(';').next().expect("name=value").to_owned()
}

/// Whether `location`, read as a browser reads it (a `\` is a `/` in an
/// http(s) URL), stays on this site.
fn stays_on_site_in_a_browser(location: &str) -> bool {
    let mut chars = location.chars();
    chars.next() == Some('/') && !matches!(chars.next(), Some('/' | '\\'))
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn pages_answer_within_their_statuses_redirect_home_and_show_no_token(
        method in method(),
        path in path(),
        query in query(),
        cookie in cookie(),
        authorization in authorization(),
        verify in any::<bool>(),
        secure in any::<bool>(),
    ) {
        let auth = http_auth(verify, secure);
        let live = open_session(&auth);
        let cookie = cookie.map(|c| match c {
            CookieHeader::Live => live.clone(),
            CookieHeader::LiveAmong(other) => format!("{other}; {live}"),
            CookieHeader::Other(c) => c,
        });
        let uri = match &query {
            Some(q) => format!("{path}?{q}"),
            None => path.clone(),
        };
        let Some(answer) = ask(&auth, method.clone(), &uri, authorization.as_deref(), cookie.as_deref()) else {
            return Ok(());
        };
        let status = answer.status.as_u16();
        prop_assert!([200, 303, 401, 403, 404, 405].contains(&status), "{uri}: {status}");
        // Every answer forbids sniffing and framing.
        prop_assert_eq!(answer.headers.get(header::X_CONTENT_TYPE_OPTIONS).map(|v| v.as_bytes()), Some(&b"nosniff"[..]));
        prop_assert_eq!(answer.headers.get(header::X_FRAME_OPTIONS).map(|v| v.as_bytes()), Some(&b"DENY"[..]));
        let has_token_param = query.as_deref().is_some_and(|q| q.contains("token="));
        if status == 303 {
            // A `?token=` visit: a session cookie, and back to the same
            // path on this site.
            prop_assert!(has_token_param, "{uri}");
            // (A path's UTF-8 is sent as is: `to_str` would refuse it.)
            let location = answer
                .headers
                .get(header::LOCATION)
                .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned())
                .unwrap_or_default();
            prop_assert!(
                location == "/" || (location.starts_with('/') && !location[1..].starts_with('/')),
                "{uri} redirects to {location:?}"
            );
            prop_assert_eq!(location.trim_start_matches('/'), path.trim_start_matches('/'));
            let set_cookie = answer.headers.get(header::SET_COOKIE).and_then(|c| c.to_str().ok()).unwrap_or_default();
            let session = set_cookie.split(';').next().and_then(|p| p.strip_prefix(&format!("{COOKIE}=")));
            prop_assert!(
                session.is_some_and(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())),
                "{set_cookie}"
            );
            prop_assert_eq!(set_cookie.ends_with("; Secure"), secure);
        }
        // No answer shows a token, the page its holder asked for aside.
        if status != 200 {
            for (name, value) in &answer.headers {
                let value = String::from_utf8_lossy(value.as_bytes());
                for token in [OPERATOR, VIEWER, VIEWER_QUERY] {
                    prop_assert!(!value.contains(token), "{uri}: {name}: {value}");
                }
            }
            let body = String::from_utf8_lossy(&answer.body);
            for token in [OPERATOR, VIEWER, VIEWER_QUERY] {
                prop_assert!(!body.contains(token), "{uri}: {status} {body}");
            }
        }
        // A page, or word of which exist (404, 405), only for the operator
        // or the viewer: by bearer token, else by a live session.
        let sent = authorization.as_deref().and_then(|a| HeaderValue::from_bytes(a).ok());
        let bearer = sent
            .as_ref()
            .and_then(|a| a.to_str().ok())
            .and_then(|a| a.strip_prefix("Bearer "));
        let admitted = match bearer {
            Some(token) => token == OPERATOR || token == VIEWER,
            None => cookie.as_deref().is_some_and(|c| c.contains(&live)),
        };
        if [200, 404, 405].contains(&status) {
            prop_assert!(admitted, "{uri} answered {status} to {authorization:?} {cookie:?}");
        }
        if !has_token_param {
            let page = matches!(path.as_str(), "/" | "/metrics" | "/api/status");
            let expected: &[u16] = match (admitted, method.clone()) {
                (false, _) => &[401, 403],
                (true, m) if m != Method::GET && m != Method::HEAD => &[405],
                (true, _) if page => &[200],
                (true, _) => &[404],
            };
            prop_assert!(expected.contains(&status), "{method} {uri} answered {status}, expected {expected:?}");
            if status == 200 {
                let body: &[u8] = if method == Method::HEAD { b"" } else { PAGE };
                prop_assert_eq!(&answer.body[..], body);
            }
        }
    }

    /// Found by this property: `GET /\evil.example/x?token=<token>`
    /// answered 303 with `Location: /\evil.example/x`; a browser parses a
    /// `\` in an http(s) URL as `/` (WHATWG URL), so it goes to
    /// `//evil.example/x`, another site. (The redirect needs a valid token,
    /// so only its holder's own link can carry it.)
    #[test]
    fn redirects_stay_on_this_site_as_a_browser_reads_them(
        path in path(),
        lead in prop::sample::select(vec!["", "\\", "/\\", "\\/", "\\\\"]),
    ) {
        let auth = http_auth(false, true);
        let uri = format!("/{lead}{}?token={VIEWER_QUERY}", path.trim_start_matches('/'));
        let Some(answer) = ask(&auth, Method::GET, &uri, None, None) else { return Ok(()) };
        prop_assert_eq!(answer.status, StatusCode::SEE_OTHER);
        let location = String::from_utf8_lossy(answer.headers[header::LOCATION].as_bytes()).into_owned();
        prop_assert!(stays_on_site_in_a_browser(&location), "{uri} redirects to {location:?}");
    }
}

// ---- the receive meter and the listener's sniffer ---------------------------

/// The gRPC message stream a caller sends: messages of any flag and
/// length, their prefixes true or claiming any length, or any bytes.
fn grpc_stream() -> impl Strategy<Value = Vec<u8>> {
    let message =
        (any::<u8>(), 0usize..300, prop::option::of(any::<u32>())).prop_map(|(flag, len, claim)| {
            let mut m = vec![flag];
            m.extend_from_slice(&claim.unwrap_or(len as u32).to_be_bytes());
            m.extend(std::iter::repeat_n(0x5a, len));
            m
        });
    prop_oneof![
        3 => prop::collection::vec(message, 0..6).prop_map(|m| m.concat()),
        1 => prop::collection::vec(any::<u8>(), 0..400),
    ]
}

/// What the meter must make of `bytes` with `share` for its caller: the
/// message lengths as their prefixes say (the largest so far is what the
/// stream holds), and where the first prefix past the share ends.
fn meter_model(bytes: &[u8], share: u64) -> (u64, Option<(usize, u64)>) {
    let (mut at, mut largest) = (0usize, 0u64);
    while let Some(prefix) = bytes.get(at..at + PREFIX) {
        let len = u64::from(u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]));
        if len > share {
            return (largest, Some((at + PREFIX, len)));
        }
        largest = largest.max(len);
        at = at.saturating_add(PREFIX).saturating_add(len as usize);
    }
    (largest, None)
}

const PREFIX: usize = 5;

/// A request body that yields `chunks` as data frames.
struct Chunks(std::collections::VecDeque<Bytes>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|c| Ok(http_body::Frame::data(c))))
    }
}

/// What the service behind the meter saw: the bytes passed on, the
/// refusal that ended the body (if one did), and what the caller's
/// streams held once the body ended.
type Received = (Vec<u8>, Option<tonic::Status>, u64);

/// `bytes`, cut where `cuts` say, through [`Metered`] to a service that
/// reads the whole body.
fn receive(budget: &ReceiveBudget, bytes: &[u8], cuts: &[usize]) -> Received {
    let mut chunks = std::collections::VecDeque::new();
    let mut rest = bytes;
    for &cut in cuts {
        let (chunk, tail) = rest.split_at(cut % (rest.len() + 1));
        chunks.push_back(Bytes::copy_from_slice(chunk));
        rest = tail;
    }
    chunks.push_back(Bytes::copy_from_slice(rest));
    let held = budget.clone();
    let inner = tower::service_fn(move |request: axum::http::Request<tonic::body::Body>| {
        let held = held.clone();
        async move {
            let mut body = request.into_body();
            let (mut passed, mut refused) = (Vec::new(), None);
            while let Some(frame) =
                futures::future::poll_fn(|cx| http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx))
                    .await
            {
                match frame {
                    Ok(frame) => passed.extend_from_slice(frame.data_ref().map_or(&[][..], |d| d.as_ref())),
                    Err(status) => {
                        refused = Some(status);
                        break;
                    }
                }
            }
            Ok::<Received, std::convert::Infallible>((passed, refused, held.held_by("job-a")))
        }
    });
    let metered = Metered::new(
        inner,
        budget.clone(),
        |_: &axum::http::Request<tonic::body::Body>| Some("job-a".to_owned()),
    );
    let request = axum::http::Request::new(tonic::body::Body::new(Chunks(chunks)));
    futures::executor::block_on(metered.oneshot(request)).expect("infallible")
}

proptest! {
    #![proptest_config(cases(256))]

    /// The meter follows the length prefixes however the stream is cut:
    /// it charges the largest message, passes every byte when that fits
    /// the caller's share, and otherwise refuses at the first prefix past
    /// it (`RESOURCE_EXHAUSTED` naming its length and the bound) without
    /// passing the frame that carries it, giving back what the stream held;
    /// what was charged goes when the stream ends. No prefix makes it allocate: a 4 GiB claim is a number.
    #[test]
    fn the_receive_meter_charges_each_streams_largest_message_however_it_is_cut(
        bytes in grpc_stream(),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
        share in prop_oneof![0u64..400, Just(u64::from(u32::MAX))],
    ) {
        let budget = ReceiveBudget::new(u64::MAX, share);
        let (passed, refused, held) = receive(&budget, &bytes, &cuts);
        let (largest, past) = meter_model(&bytes, share);
        match (past, refused) {
            (None, None) => {
                prop_assert_eq!(&passed, &bytes);
                prop_assert_eq!(held, largest);
            }
            (Some((end, len)), Some(status)) => {
                prop_assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{}", status.message());
                prop_assert!(
                    status.message().contains(&format!("a message of {len} bytes"))
                        && status.message().contains(&format!("past its bound of {share}")),
                    "{}", status.message()
                );
                // The frames before the one the prefix ends in, not that one.
                prop_assert!(passed.len() < end && bytes.starts_with(&passed), "{} of {}", passed.len(), end);
                // The refusal ends the stream: what it held goes back at once.
                prop_assert_eq!(held, 0, "the refused stream's charge is given back");
            }
            (past, refused) => prop_assert!(false, "expected a refusal at {past:?}, got {refused:?}"),
        }
        prop_assert_eq!(budget.held(), 0, "the charge goes when the stream ends");
    }

    /// The sniffer's decision over a plaintext connection's first bytes:
    /// the ring for its magic, HTTP for `GET ` or `HEAD `, undecided only
    /// while the bytes are a proper prefix of one of those (so its 8-byte
    /// peek always decides), gRPC for anything else; a decision never
    /// changes with more bytes.
    #[test]
    fn first_bytes_route_as_their_start_says(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..16),
            (prop::sample::select(vec![&kindling_schemas::ring::MAGIC[..], b"GET ", b"HEAD ", b"PRI * HTTP/2.0\r\n"]),
             0usize..9, prop::collection::vec(any::<u8>(), 0..8))
                .prop_map(|(start, keep, tail)| [&start[..keep.min(start.len())], &tail[..]].concat()),
        ],
        alpn in prop::option::of(prop_oneof![
            prop::collection::vec(any::<u8>(), 0..20),
            prop::sample::select(vec![kindling_schemas::ring::ALPN.to_vec(), b"http/1.1".to_vec(), b"h2".to_vec()]),
        ]),
    ) {
        let starts: [(&[u8], Route); 3] = [
            (&kindling_schemas::ring::MAGIC, Route::Ring),
            (b"GET ", Route::Http),
            (b"HEAD ", Route::Http),
        ];
        let expected = match starts.iter().find(|(s, _)| bytes.starts_with(s)) {
            Some((_, route)) => Some(*route),
            None if starts.iter().any(|(s, _)| s.starts_with(&bytes)) => None,
            None => Some(Route::Grpc),
        };
        prop_assert_eq!(Route::of_first_bytes(&bytes), expected);
        if bytes.len() >= kindling_schemas::ring::MAGIC.len() {
            prop_assert!(expected.is_some(), "a full peek of {bytes:?} decides nothing");
        }
        if let Some(early) = (0..=bytes.len()).find_map(|n| Route::of_first_bytes(&bytes[..n])) {
            prop_assert_eq!(Some(early), expected, "{:?} decided early", bytes);
        }
        let by_alpn = Route::of_alpn(alpn.as_deref());
        let want = match alpn.as_deref() {
            Some(p) if p == kindling_schemas::ring::ALPN => Route::Ring,
            Some(b"http/1.1") => Route::Http,
            _ => Route::Grpc,
        };
        prop_assert_eq!(by_alpn, want);
    }
}

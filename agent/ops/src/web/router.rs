//! The main port's routes: every path behind the auth layer, then the
//! pages; every response hardened (no sniffing, no framing, a content
//! security policy).

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::Pages;
use super::auth::{self, HttpAuth};

/// The routes of the main port: every path through [`auth::require_reader`],
/// then `pages`.
pub fn router(auth: HttpAuth, pages: Pages) -> Router {
    Router::new()
        .fallback_service(get(page).with_state(pages))
        .layer(axum::middleware::from_fn_with_state(auth, auth::require_reader))
        .layer(axum::middleware::map_response(hardened))
}

/// What a response that is not an HTML page may load: nothing.
const NOTHING_CSP: &str = "default-src 'none'; frame-ancestors 'none'";

/// One page: what `pages` renders for the path, or 404.
async fn page(State(pages): State<Pages>, uri: Uri) -> Response {
    match pages(uri.path()) {
        Some(page) => {
            let csp = if page.content_type.starts_with("text/html") {
                html_csp(&page.body)
            } else {
                NOTHING_CSP.to_owned()
            };
            (
                [
                    (header::CONTENT_TYPE, page.content_type.to_owned()),
                    (header::CACHE_CONTROL, "no-store".to_owned()),
                    (header::CONTENT_SECURITY_POLICY, csp),
                ],
                page.body,
            )
                .into_response()
        }
        None => (StatusCode::NOT_FOUND, format!("not found: {}\n", uri.path())).into_response(),
    }
}

/// Every response: no MIME sniffing, no framing, no referrer (a first
/// visit's URL holds the token), and no content loaded where no page set
/// its own policy.
async fn hardened(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, header::HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        header::HeaderValue::from_static("no-referrer"),
    );
    headers
        .entry(header::CONTENT_SECURITY_POLICY)
        .or_insert(header::HeaderValue::from_static(NOTHING_CSP));
    response
}

/// The policy of an HTML page of our own: its inline `<script>` blocks by
/// their SHA-256 (nothing else runs), inline styles (the page sets style
/// attributes), `data:` images (its icon), requests to its own origin only.
pub fn html_csp(html: &[u8]) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    let text = String::from_utf8_lossy(html);
    let mut scripts = Vec::new();
    for block in text.split("<script>").skip(1) {
        if let Some((code, _)) = block.split_once("</script>") {
            let digest = sha2::Sha256::digest(code.as_bytes());
            scripts.push(format!(
                "'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(digest)
            ));
        }
    }
    format!(
        "default-src 'none'; script-src {}; style-src 'unsafe-inline'; img-src data:; connect-src 'self'; \
         frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        if scripts.is_empty() {
            "'none'".to_owned()
        } else {
            scripts.join(" ")
        }
    )
}

//! What a port's pages are: a function from path to body, and the cache
//! that renders each at most once per [`RENDER_TTL`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

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

#[cfg(test)]
mod tests {
    use super::*;

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

//! The front of a replica: the gRPC service and the status pages answer
//! from the state only while this replica leads; until then (and after it
//! stepped down) every rendezvous call is answered UNAVAILABLE naming the
//! leader ([`LEADER_METADATA`]) or why none is known (etcd's error), and
//! the pages are not found. The listener, the health service and
//! reflection stay up across terms.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll};

use kindling_ops::web::pages::Pages;
use kindling_schemas::rendezvous::LEADER_METADATA;
use tokio::sync::watch;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tower::ServiceExt as _;

use crate::etcd::Hint;

/// The service the gate lets calls through to while this replica leads.
#[derive(Debug)]
pub struct Gate<S> {
    leading: Arc<RwLock<Option<S>>>,
    hint: watch::Receiver<Hint>,
}

impl<S> Clone for Gate<S> {
    fn clone(&self) -> Self {
        Gate {
            leading: self.leading.clone(),
            hint: self.hint.clone(),
        }
    }
}

impl<S> Gate<S> {
    /// A closed gate; its refusals read `hint`.
    pub fn new(hint: watch::Receiver<Hint>) -> Self {
        Gate {
            leading: Arc::default(),
            hint,
        }
    }

    /// Calls go to `service` from now on (this replica leads).
    pub fn open(&self, service: S) {
        *self.leading.write().unwrap_or_else(PoisonError::into_inner) = Some(service);
    }

    /// Calls are refused from now on (this replica stepped down).
    pub fn close(&self) {
        *self.leading.write().unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn refusal(&self) -> Status {
        let hint = self.hint.borrow().clone();
        let message = match (&hint.leader, &hint.problem) {
            (Some(leader), _) => format!("this rendezvous replica is not the leader; the leader is {leader}"),
            (None, Some(problem)) => format!("no rendezvous replica leads: {problem}"),
            (None, None) => {
                "this rendezvous replica is not the leader, and no leader is known yet".to_owned()
            }
        };
        let mut status = Status::unavailable(message);
        if let Some(value) = hint.leader.and_then(|l| l.parse().ok()) {
            status.metadata_mut().insert(LEADER_METADATA, value);
        }
        status
    }
}

impl<S, B> tower::Service<http::Request<Body>> for Gate<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let leading = self
            .leading
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match leading {
            Some(service) => Box::pin(async move {
                let response = service.oneshot(request).await?;
                Ok(response.map(Body::new))
            }),
            None => {
                let refusal = self.refusal().into_http();
                Box::pin(async move { Ok(refusal) })
            }
        }
    }
}

impl<S: NamedService> NamedService for Gate<S> {
    const NAME: &'static str = S::NAME;
}

/// The status pages of the term this replica leads; while it follows, a
/// page naming the leader and its own `/metrics`.
#[derive(Clone)]
pub struct PageGate {
    pages: Arc<RwLock<Option<Pages>>>,
    hint: watch::Receiver<Hint>,
}

impl std::fmt::Debug for PageGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageGate").finish_non_exhaustive()
    }
}

impl PageGate {
    /// A gate serving the follower's pages until [`set`](Self::set); they
    /// name the leader from `hint`.
    pub fn new(hint: watch::Receiver<Hint>) -> Self {
        PageGate {
            pages: Arc::default(),
            hint,
        }
    }

    /// Serves `pages` from now on (`None`: the follower's).
    pub fn set(&self, pages: Option<Pages>) {
        *self.pages.write().unwrap_or_else(PoisonError::into_inner) = pages;
    }

    /// The pages the web server serves: the current term's; while this
    /// replica follows, its `/metrics` alone (the process, and
    /// `kindling_rendezvous_leader` 0), so a scrape of every replica finds each.
    pub fn pages(&self) -> Pages {
        let slot = self.pages.clone();
        let hint = self.hint.clone();
        let following = kindling_ops::exposition::registry("rendezvous", crate::metrics::Follower);
        Arc::new(move |path: &str| {
            let pages = slot.read().unwrap_or_else(PoisonError::into_inner).clone();
            match (pages, path) {
                (Some(p), _) => p(path),
                (None, "/metrics") => Some(kindling_ops::web::Page {
                    content_type: kindling_ops::exposition::CONTENT_TYPE,
                    body: kindling_ops::exposition::encode(&following).into(),
                }),
                (None, "/" | "/index.html") => Some(kindling_ops::web::Page {
                    content_type: "text/html; charset=utf-8",
                    body: follower_page(&hint.borrow()).into(),
                }),
                (None, _) => None,
            }
        })
    }
}

/// What a follower's status page says: who leads (its page is there), or
/// why no one is known to.
fn follower_page(hint: &Hint) -> String {
    let escape = |t: &str| {
        t.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let said = match (&hint.leader, &hint.problem) {
        (Some(leader), _) => {
            let leader = escape(leader);
            format!("The leader is <a href=\"{leader}/\">{leader}</a>: its status page shows the jobs.")
        }
        (None, Some(problem)) => format!("No replica leads: {}", escape(problem)),
        (None, None) => "No leader is known yet.".to_owned(),
    };
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Kindling rendezvous (follower)</title></head>\
         <body><h1>Kindling rendezvous: a follower</h1><p>This replica does not lead. {said}</p></body></html>"
    )
}

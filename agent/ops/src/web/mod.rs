//! The HTTP side of an agent's and the rendezvous' ports, on axum's router
//! and hyper's HTTP/1.1 server (the crates tonic itself serves on):
//! `/metrics` everywhere and the status page on the main port, where
//! the listener ([`crate::listen`]) hands over the connections that speak
//! HTTP (so the same TLS guards them, and a scraper keeps its connection from
//! scrape to scrape); the Kubernetes probes on the health port ([`probes`]).
//! Who may read the pages is one middleware layer ([`auth`]).

pub mod auth;
pub mod pages;
pub mod probes;
mod router;
mod server;

pub use auth::{COOKIE, HttpAuth};
pub use pages::{Page, Pages, RENDER_TTL, cached};
pub use router::{html_csp, router};
pub(crate) use server::serve_connection;
pub use server::{MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER, READ_TIMEOUT, serve};

//! What every Kindling server process (the agent, the rendezvous) shares
//! around its gRPC service: how it takes its flags for tokens, TLS and logs,
//! how it writes its Prometheus page, and how it serves pages, `/metrics`
//! and the Kubernetes probes over HTTP.
//!
//! - [`listen`]: the server side of a port: connections accepted under caps
//!   (in all and per address), handshaken, and routed to gRPC, the ring or
//!   HTTP.
//! - [`cli`]: the token, TLS and logging flags and the logger.
//! - [`exposition`]: the Prometheus page (OpenMetrics through
//!   `prometheus-client`), build info and the process' own metrics; each
//!   binary brings its families.
//! - [`grpc`]: gRPC server reflection, served beside health and each
//!   server's own service, and the trace layer.
//! - [`receiving`]: the bound on what a caller's streams pin while their
//!   messages are received.
//! - [`web`]: the HTTP side on axum and hyper: pages and `/metrics` behind one
//!   auth layer on the main port, `/healthz` and `/readyz` on the health port.
//!
//! The modules form layers, listed lowest first in the README's layout table.

pub mod cli;
pub mod exposition;
pub mod grpc;
pub mod listen;
pub mod receiving;
pub mod web;

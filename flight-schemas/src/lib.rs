//! Kindling's wire contract: everything two Kindling processes (or a client in
//! another language) must agree on, plus the typed rendezvous client that
//! speaks it — so a client needs this crate, not the agent (nor burn).
//!
//! - [`descriptor`]: Flight path descriptors and tickets (`[job_id, "train"]`, …).
//! - [`metadata`]: per-batch `app_metadata` (producer + sequence) and `PutResult` acks.
//! - [`action`]: Flight action names and their JSON bodies.
//! - [`spec`]: the [`JobSpec`](spec::JobSpec), validated on construction.
//! - [`ipc`]: decoding a peer's Arrow IPC (a malformed message is an error, not a panic).
//! - [`schema`]: Arrow schema conventions and [`validate`](schema::validate).
//! - [`auth`]: bearer-token interceptors shared by every gRPC server and client.
//! - [`credential`]: signed, expiring job credentials by role (producer, peer, reader).
//! - [`channel`], [`tls`]: how connections are made and served (keepalive,
//!   deadlines, TLS and mutual TLS with certificates reloaded on change).
//! - [`ring`]: the ring data plane between agents (hello, frames, heartbeats).
//! - [`pb`]: the generated rendezvous gRPC service.
//! - [`rendezvous`]: the rendezvous's value types, their one conversion to
//!   `pb`, and the typed async [`RendezvousClient`](rendezvous::RendezvousClient)
//!   (the server is the `kindling-rendezvous` crate).

pub mod action;
pub mod auth;
pub mod channel;
pub mod credential;
pub mod descriptor;
pub mod ipc;
pub mod metadata;
pub mod rendezvous;
pub mod ring;
pub mod schema;
pub mod scoring;
pub mod serving;
pub mod spec;
pub mod status;
pub mod tls;

/// Generated protobuf messages and tonic services.
pub mod pb {
    /// The barrier rendezvous service (`kindling.rendezvous.v1`).
    pub mod rendezvous {
        #![allow(missing_debug_implementations, clippy::all, rust_2018_idioms)]
        tonic::include_proto!("kindling.rendezvous.v1");
    }
}

pub use action::{Action, ActionKind};
pub use descriptor::{DataPath, Split};
pub use spec::{JobSpec, ModelSpec, OptimizerSpec, Task};

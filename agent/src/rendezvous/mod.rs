//! The barrier rendezvous service: gang start, barrier / all-gather, leases
//! and whole-group retry for the agents of a training job (see
//! `docs/rendezvous.md`; wire contract `flight-schemas/proto/rendezvous.proto`).
//!
//! This is the server side. The client side — the typed [`RendezvousClient`]
//! and the value types both sides share ([`JobConfig`], [`JobState`],
//! [`JobStatus`], …) — lives in `kindling_schemas::rendezvous`, so a client
//! can use it without this crate; it is re-exported here under the same names.
//!
//! - [`types`]: the server's own settings ([`RendezvousConfig`]) and [`ReapReport`].
//! - [`state`]: the pure state machine of agents, jobs and attempts (no gRPC).
//! - [`store`]: the state file that lets a restarted rendezvous lose nothing.
//! - [`server`]: the tonic service, the `RendezvousError` → `Status` mapping and [`serve`].
//! - [`page`]: the status page and its data (`/`, `/api/status`), from the
//!   state and the agents' heartbeat reports.
//! - [`embedded`]: the same server in-process on `127.0.0.1:0` ([`EmbeddedRendezvous`]).
//! - [`error`]: [`RendezvousError`] (server side); [`ClientError`] is re-exported.
//! - [`client`]: re-export of `kindling_schemas::rendezvous::client`.

pub mod embedded;
pub mod error;
pub mod page;
pub mod server;
pub mod state;
pub mod store;
pub mod types;

pub use kindling_schemas::rendezvous::client;
pub use kindling_schemas::rendezvous::{
    AgentInfo, AgentLease, AttemptFailure, AttemptRef, Gang, HeartbeatReply, JobConfig, JobState, JobStatus,
    JobWatch, Membership, RENDEZVOUS_REPORTER, RendezvousClient,
};

pub use embedded::EmbeddedRendezvous;
pub use error::{ClientError, RendezvousError};
pub use server::{RendezvousService, ServerConfig, serve};
pub use state::RendezvousState;
pub use types::{ReapReport, RendezvousConfig};

//! The barrier rendezvous service: gang start, barrier / all-gather, leases
//! and whole-group retry for the agents of a training job (see
//! `docs/rendezvous.md`; wire contract `flight-schemas/proto/rendezvous.proto`).
//!
//! - [`state`]: the pure state machine of agents, jobs and attempts (no gRPC).
//! - [`server`]: the tonic service, the `RendezvousError` → `Status` mapping and [`serve`].
//! - [`client`]: the typed async client ([`RendezvousClient`], [`AgentLease`], [`Gang`]).
//! - [`embedded`]: the same server in-process on `127.0.0.1:0` ([`EmbeddedRendezvous`]).
//! - [`error`]: [`RendezvousError`] (server side) and [`ClientError`].

pub mod client;
pub mod embedded;
pub mod error;
pub mod server;
pub mod state;

pub use client::{AgentLease, Gang, JobWatch, RendezvousClient};
pub use embedded::EmbeddedRendezvous;
pub use error::{ClientError, RendezvousError};
pub use server::{RendezvousService, ServerConfig, serve};
pub use state::{
    AgentInfo, AttemptFailure, AttemptRef, HeartbeatReply, JobConfig, JobState, JobStatus, Membership,
    RendezvousConfig, RendezvousState,
};

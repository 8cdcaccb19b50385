//! The barrier rendezvous service: gang start, barrier / all-gather, leases
//! and whole-group retry for the agents of a training job (see
//! `docs/rendezvous.md`; wire contract `flight-schemas/proto/rendezvous.proto`).
//!
//! This crate is the server side and links no burn. The client side — the
//! typed `RendezvousClient` and the value types both sides share
//! (`JobConfig`, `JobState`, `JobStatus`, `ClientError`, …) — has one home,
//! `kindling_schemas::rendezvous`, beside the protocol, so a client needs
//! neither this crate nor the agent.
//!
//! - [`types`]: the server's own settings ([`RendezvousConfig`]) and [`ReapReport`].
//! - [`state`]: the pure state machine of agents, jobs and attempts (no gRPC).
//! - [`store`]: where the durable state is kept ([`store::SnapshotStore`]); the state file that lets a restarted rendezvous lose nothing.
//! - [`etcd`]: the state in etcd and one leader among several replicas (`--store etcd://…`).
//! - [`gate`]: a replica's front: the service and pages answer only while it leads.
//! - [`server`]: the tonic service, the `RendezvousError` → `Status` mapping and [`serve`] ([`serve_ready`] marks a readiness probe once the state is restored).
//! - [`metrics`]: the Prometheus families (`/metrics`).
//! - [`page`]: the status page and its data (`/`, `/api/status`), from the
//!   state and the agents' heartbeat reports.
//! - [`embedded`]: the same server in-process on `127.0.0.1:0` ([`EmbeddedRendezvous`]).
//! - [`error`]: [`RendezvousError`], what the state machine refuses a request with.
//!
//! The modules form layers, listed lowest first in the README's layout table.

pub mod embedded;
pub mod error;
pub mod etcd;
pub mod gate;
pub mod metrics;
pub mod page;
pub mod server;
pub mod state;
pub mod store;
pub mod types;

pub use embedded::EmbeddedRendezvous;
pub use error::{RecordError, RendezvousError, StorageError};
pub use server::{RendezvousService, ServerConfig, serve, serve_ready};
pub use state::RendezvousState;
pub use types::{ReapReport, RendezvousConfig};

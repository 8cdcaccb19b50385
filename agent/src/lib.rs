//! The Kindling agent: Flight ingest, the shard cache, the burn trainer, the
//! ring all-reduce and prediction. Its HTTP side, Prometheus page and shared
//! flags are `kindling_ops`'s; the rendezvous it joins is the
//! `kindling-rendezvous` crate (client: `kindling_schemas::rendezvous`).
//!
//! Rooms by role, lowest first (the README's layout table lists them; a
//! room uses only the rooms before it):
//!
//! - [`error`]: [`AgentError`], the errors of each layer it wraps, and its
//!   one mapping to `tonic::Status`.
//! - [`cache`]: the shard cache with its memory budget and disk spill.
//! - [`collective`]: ring all-reduce and broadcast between agents (the ring data plane).
//! - [`optim`]: the optimizers on flat weight buffers (and kept on the device),
//!   their parameter groups and state.
//! - [`models`]: the [`KindlingModel`] trait and its [`ModelRegistry`], the
//!   built-in networks, the device, weights ↔ flat buffers and Arrow, Arrow → tensors.
//! - [`training`]: the data-parallel loop, its schedule, gradient exchange,
//!   log and checkpoints.
//! - [`serving`]: inference and the `DoExchange` prediction stream, models
//!   served without having been trained here.
//! - [`jobs`]: one job's data, state and lifecycle; exactly-once ingest; the
//!   jobs on an agent.
//! - [`process`]: the agent process — metrics, the Flight service, the
//!   server, the command line ([`run`]).
//!
//! **What a custom agent uses**, all at the crate root: [`run`] (the agent
//! binary's `main` with one's own [`ModelRegistry`]), [`KindlingModel`], the
//! [`Batch`] it reads ([`Sequence`], [`Targets`]), the [`Inputs`] it is built
//! for and its [`ConfigError`], [`ModelRegistry`], [`AgentError`], and
//! [`burn`] at the version the agent trains with; [`start`] / [`AgentConfig`] / [`AgentHandle`] to run an
//! agent in a process of one's own. See `docs/models.md`.
//!
//! The modules form layers, listed lowest first in the README's layout
//! table: a module uses only modules listed before it
//! (`tests/tests/house_rules.rs` checks every `crate::` path against it).

pub mod cache;
pub mod collective;
pub mod error;
pub mod jobs;
pub mod models;
pub mod optim;
pub mod process;
pub mod serving;
pub mod training;

/// burn at the version the agent trains with, for models of one's own.
pub use burn;
pub use error::{AgentError, ModelError};
pub use models::kindling_model::{
    Batch, ConfigError, Inputs, KindlingModel, ModelRegistry, Sequence, Targets,
};
pub use process::launch::run;
pub use process::server::{AgentConfig, AgentHandle, start};

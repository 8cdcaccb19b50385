//! The Kindling agent and the barrier rendezvous service.
//!
//! - [`server`]: start/stop an agent (Flight + collective on one port).
//! - [`health`]: `/healthz` and `/readyz` probes for both binaries.
//! - [`cli`]: command-line pieces both binaries share (the token flags).
//! - [`flight`]: the Flight adapter (decodes requests, encodes responses).
//! - [`ingest`]: exactly-once ingest (producers, streams, end of data).
//! - [`predict`]: inference and the `DoExchange` prediction stream.
//! - [`registry`] / [`job`]: the jobs on an agent and their lifecycle.
//! - [`error`]: [`AgentError`] and its one mapping to `tonic::Status`.
//! - [`cache`]: shard cache with memory budget and disk spill.
//! - [`trainer`]: the data-parallel burn training loop.
//! - [`device`]: CPU (`flex`) or GPU (burn-wgpu, `gpu` feature) per job.
//! - [`collective`]: ring all-reduce and broadcast between agents.
//! - [`model`], [`tensorize`], [`params`]: burn models, Arrow → tensors, weights ↔ buffers/Arrow.
//! - [`optim`]: the optimizers on flat weight buffers, and their state.
//! - [`checkpoint`]: checkpoints per job and attempt.
//! - [`rendezvous`]: the barrier rendezvous service (server, client, embedded mode).

pub mod cache;
pub mod checkpoint;
pub mod cli;
pub mod collective;
pub mod device;
pub mod error;
pub mod flight;
pub mod health;
pub mod ingest;
pub mod job;
pub mod model;
pub mod optim;
pub mod params;
pub mod predict;
pub mod registry;
pub mod rendezvous;
pub mod server;
pub mod tensorize;
pub mod trainer;

pub use error::AgentError;
pub use server::{AgentConfig, AgentHandle, start};

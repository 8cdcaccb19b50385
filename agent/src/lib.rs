//! The Kindling agent: Flight ingest, the shard cache, the burn trainer, the
//! ring all-reduce and prediction. Its HTTP side, Prometheus page and shared
//! flags are `kindling_ops`'s; the rendezvous it joins is the
//! `kindling-rendezvous` crate (client: `kindling_schemas::rendezvous`).
//!
//! - [`launch`]: the agent process ([`run`]: command line, signals, probes),
//!   for the `kindling-agent` binary and agents built from user crates.
//! - [`server`]: start/stop an agent (Flight + collective on one port).
//! - [`flight`]: the Flight adapter (decodes requests, encodes responses).
//! - [`predict`]: inference and the `DoExchange` prediction stream.
//! - [`served`]: models served without having been trained here (`serve_model`).
//! - [`jobs`]: the jobs on an agent, and starting their tasks.
//! - [`metrics`]: the agent's metrics.
//! - [`ingest`]: exactly-once ingest (producers, streams, end of data).
//! - [`job`]: one job's data, state and lifecycle (gang, train, re-join).
//! - [`trainer`]: the data-parallel burn training loop.
//! - [`gradients`]: a step's gradient all-reduce (buckets, `bf16`), clipping and optimizer step.
//! - [`tensorize`]: Arrow batches → tensors.
//! - [`checkpoint`]: checkpoints per job and attempt.
//! - [`optim`]: the optimizers on flat weight buffers, their parameter groups and state.
//! - [`schedule`]: the learning rate by global step, and the watch of a monitored metric (plateau, early stopping).
//! - [`params`]: weights and gradients ↔ flat buffers and Arrow.
//! - [`model`]: the [`KindlingModel`](model::KindlingModel) trait every trained
//!   model implements, the [`Batch`](model::Batch) it reads, and the
//!   [`ModelRegistry`](model::ModelRegistry) of names → models.
//! - [`builtin`]: the built-in networks (linear, MLP, CNN) as trait implementors.
//! - [`collective`]: ring all-reduce and broadcast between agents (the ring data plane).
//! - [`device`]: CPU (`flex`) or GPU (burn-wgpu, `gpu` feature) per job.
//! - [`cache`]: shard cache with memory budget and disk spill.
//! - [`error`]: [`AgentError`] and its one mapping to `tonic::Status`.
//!
//! The modules form layers, listed lowest first in the README's layout
//! table: a module uses only modules listed before it
//! (`tests/tests/house_rules.rs` checks every `crate::` path against it).

pub mod builtin;
pub mod cache;
pub mod checkpoint;
pub mod collective;
pub mod device;
pub mod error;
pub mod flight;
pub mod gradients;
pub mod ingest;
pub mod job;
pub mod joblog;
pub mod jobs;
pub mod launch;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod params;
pub mod predict;
pub mod schedule;
pub mod served;
pub mod server;
pub mod tensorize;
pub mod trainer;

/// burn at the version the agent trains with, for models of one's own.
pub use burn;
pub use error::AgentError;
pub use launch::run;
pub use model::{KindlingModel, ModelRegistry};
pub use server::{AgentConfig, AgentHandle, start};

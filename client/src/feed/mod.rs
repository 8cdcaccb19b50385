//! Feeding agents: everything that moves rows from this process (or from
//! Spark's executors) into training agents, exactly once.
//!
//! - [`agent`]: [`AgentClient`], the typed Flight client of one agent (its
//!   actions, `DoPut`, the model table, `DoExchange` prediction).
//! - [`writer`]: [`ShardWriter`] and [`CommittingWriter`], one producer's
//!   batches with bounded bytes in flight and checked commits.
//! - `relay`: the driver relay — rows streamed through this process, dealt
//!   evenly to the shards, a persisted DataFrame read in slices.
//! - [`push`]: executor push — every Spark task pushes its own partition.
//! - [`Feed`] (`kind.rs`): which of the two a job uses; [`FeedError`]
//!   (`error.rs`): what can go wrong.

pub mod agent;
mod error;
mod kind;
pub mod push;
pub(crate) mod relay;
pub mod writer;

pub use agent::{AgentClient, MAX_MESSAGE_BYTES};
pub use error::FeedError;
pub use kind::Feed;
pub use push::{ExecutorPush, PushedPartition};
pub use writer::{CommittingWriter, ShardReceipt, ShardWriter};

//! Kindling client: Spark Connect DataFrames streamed as Arrow into burn training agents.
//!
//! - [`spark`]: the Spark Connect session, lazy DataFrames and Arrow result streams.
//! - [`feed`]: streaming batches into agents over Flight `DoPut`, exactly once.
//! - [`job`]: [`TrainingJob`](job::TrainingJob): fit and predict across agents.
//! - [`local`]: local mode: the rendezvous and agents inside this process.

pub mod feed;
pub mod job;
pub mod local;
pub mod spark;

pub use spark::{Column, DataFrame, Error as SparkError, SparkSession, functions};

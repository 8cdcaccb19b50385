//! Kindling client: Spark Connect DataFrames streamed as Arrow into burn training agents.
//!
//! - [`spark`]: the Spark Connect session, lazy DataFrames and Arrow result streams.
//! - [`feed`]: moving rows into agents exactly once — the typed agent client,
//!   `DoPut` writers, the driver relay and executor push.
//! - [`job`]: [`TrainingJob`](job::TrainingJob): fit and predict across agents.
//! - [`local`]: local mode: the rendezvous and agents inside this process.

pub mod feed;
pub mod job;
pub mod local;
pub mod spark;

pub use spark::{Column, DataFrame, Error as SparkError, SparkSession, functions};

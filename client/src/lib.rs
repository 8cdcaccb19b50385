//! Kindling client: Spark Connect DataFrames streamed as Arrow into burn training agents.
//!
//! - [`spark`]: the Spark Connect session, lazy DataFrames and Arrow result streams.
//! - [`feed`]: moving rows into agents exactly once — the typed agent client,
//!   `DoPut` writers, the driver relay and executor push.
//! - [`job`]: [`TrainingJob`](job::TrainingJob): fit and predict across agents.
//! - [`local`]: local mode: the rendezvous and agents inside this process
//!   (feature `local`, on by default).
//!
//! ## Features
//!
//! - `local` (default): local mode and in-process prediction. It links the
//!   agent crate and so burn; an application that only drives a cluster can
//!   leave it out (`default-features = false`) and links no burn.
//! - `test-hooks`: fault hooks for Kindling's own tests.

pub mod feed;
pub mod job;
#[cfg(feature = "local")]
pub mod local;
pub mod spark;

pub use spark::{Column, DataFrame, Error as SparkError, SparkSession, functions};

//! Kindling client: Spark Connect DataFrames streamed as Arrow into burn training agents.
//!
//! - [`spark`]: the Spark Connect session, lazy DataFrames and Arrow result streams.
//! - [`feed`]: moving rows into agents exactly once — the typed agent client,
//!   `DoPut` writers, the driver relay and executor push.
//! - [`job`]: [`job::TrainingJob`]: fit and predict across agents.
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
/// The Spark Connect client (the `kindling-spark` crate, usable on its own).
pub use kindling_spark as spark;

pub use spark::{Column, DataFrame, Error as SparkError, SparkSession, functions};

pub use job::{JobError, TrainedModel, TrainingEvent, TrainingJob};
/// An epoch's metrics, as [`TrainedModel::history`] and the events carry them.
pub use kindling_schemas::action::EpochMetrics;
/// Metrics of an evaluation ([`TrainedModel::evaluate`]) and the sums
/// they are computed from.
pub use kindling_schemas::scoring::{Report, Tally, TallyKind};
/// The job spec and its training options, so a program needs no other
/// Kindling crate to describe a job.
pub use kindling_schemas::spec::{
    CheckpointPolicy, EarlyStopping, EvalSplit, GradientClip, GradientCompression, InputType, JobSpec, Loss,
    Metric, ModelSpec, OptimizerSpec, Precision, Schedule, Task,
};

/// Arrow at the version Kindling speaks: record batches in and out of
/// [`TrainingJob::fit_arrow`](job::TrainingJob::fit_arrow) and predictions.
pub use arrow;
/// The streams Kindling hands out are `futures` streams.
pub use futures;

#[cfg(feature = "local")]
pub mod model;

/// `docs/models.md`, whose complete examples (the trait, the program's
/// imports, the Brier-score metric) compile as doc tests: the guide cannot
/// drift from the API it teaches. Fragments are marked `ignore`.
#[cfg(all(doctest, feature = "local"))]
#[doc = include_str!("../../docs/models.md")]
mod models_md {}

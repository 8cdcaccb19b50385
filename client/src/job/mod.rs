//! `TrainingJob`: train a burn model on a Spark DataFrame across agents — the
//! Rust counterpart of `MirroredStrategyRunner(num_slots, local_mode, use_gpu)`
//! and `TorchDistributor`, without their intermediate files.
//!
//! - [`TrainingJob`] / [`TrainingJobBuilder`]: the validated job.
//! - `fit`: check and split the DataFrame, then run the job; `search`: many
//!   trials on rows fed once. Below both: `source` (where a run's rows come
//!   from, a search's held dataset) and `run` (one run on the agents: gang,
//!   feed, follow, recover, finish).
//! - [`JobHandle`]: a job that outlives its client (`submit`, in
//!   `detached`), waited for and fetched from any process.
//! - [`TrainedModel`]: metrics, weights, save/load, predict (also back into Spark).
//! - [`TrainingEvent`]: progress, as a stream for the application and as bars/log lines.

mod builder;
mod detached;
mod error;
#[cfg(feature = "local")]
mod evaluate;
mod event;
#[cfg(feature = "local")]
mod export;
mod fit;
mod pretrained;
mod progress;
mod run;
mod search;
mod source;
mod split;
mod target;
mod tracking;
mod trained;
mod training_job;
mod transform;

use std::time::Duration;

pub use builder::TrainingJobBuilder;
pub use detached::JobHandle;
pub use error::{JobError, SplitProblem};
pub use event::TrainingEvent;
#[cfg(feature = "local")]
pub use export::{ExportFormat, INFO_FILE, ONNX_FILE, ONNX_OPSET, SAFETENSORS_FILE};
pub use progress::{ProgressMode, agent_log_line};
pub use search::{
    Decision, Dimension, SPACE_ALIASES, Scheduler, Search, SearchResult, SearchSpace, SpaceValues,
    TrialOutcome, TrialResult,
};
pub use target::ServingCluster;
pub use tracking::MlflowTracking;
pub use trained::TrainedModel;
pub use training_job::TrainingJob;
pub use transform::{Served, Transform};

pub use crate::feed::push::DEFAULT_EXECUTOR_PYTHON;
pub use crate::feed::{ExecutorPush, Feed, PushedPartition};

/// How long `fit` waits for a lost agent's replacement by default.
pub const DEFAULT_REPLACEMENT_WAIT: Duration = Duration::from_secs(120);

/// The client lease a job is created with by default
/// ([`TrainingJobBuilder::client_lease`]).
pub const DEFAULT_CLIENT_LEASE: Duration = Duration::from_secs(30);

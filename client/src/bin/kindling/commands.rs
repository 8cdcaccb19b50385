//! The subcommands of the `kindling` binary, a file each, and the flags
//! they share (`cluster.rs`). (Agents and the rendezvous run as their own
//! binaries, `kindling-agent` and `kindling-rendezvous`.)

mod cluster;
mod evaluate;
mod export;
mod jobs;
mod options;
mod predict;
mod status;
mod train;
mod tune;

pub use cluster::{ClusterArgs, Input};
pub use evaluate::{EvaluateArgs, evaluate};
pub use export::{ExportArgs, export};
pub use jobs::{FetchArgs, JobsArgs, WaitArgs, fetch, jobs, wait};
pub use predict::{PredictArgs, predict};
pub use status::{StatusArgs, status};
pub use train::{TrainArgs, job, report_model, train};
pub use tune::{TuneArgs, tune};

//! [`TrainingEvent`]: one thing that happened in a training job, as the
//! application, the progress display and MLflow tracking receive it.

use kindling_schemas::action::{EpochMetrics, JobEvent};

use crate::feed::PushedPartition;

/// One thing that happened in a training job.
#[derive(Debug, Clone, PartialEq)]
pub enum TrainingEvent {
    /// The job was created and its agents chosen.
    Started {
        /// The job.
        job_id: String,
        /// Flight URLs of the agents, by shard.
        agents: Vec<String>,
    },
    /// Rows streamed into a shard so far.
    Streamed {
        /// Train or eval.
        split: &'static str,
        /// Shard index.
        shard: usize,
        /// Rows sent.
        rows: u64,
        /// Rows per second since the split started.
        rows_per_sec: f64,
    },
    /// All rows of a split landed, exactly once.
    Fed {
        /// Train or eval.
        split: &'static str,
        /// Rows per shard.
        rows_per_shard: Vec<u64>,
        /// `driver-relay` or `executor-push`.
        feed: &'static str,
        /// Data bytes that flowed through this client for the split: Arrow
        /// received from Spark and sent to agents (relay), or the summaries and
        /// the uploaded module (push).
        client_bytes: u64,
        /// Seconds the split took to land, end of data included.
        seconds: f64,
        /// Spark queries that produced the rows: more than 1 when a persisted
        /// DataFrame was relayed in slices (`relay_slice_bytes`); 1 for executor
        /// push and for Arrow sources.
        queries: usize,
        /// Executor push: the partitions pushed (empty for the driver relay).
        partitions: Vec<PushedPartition>,
    },
    /// A training step progressed (reported from rank 0).
    Step {
        /// Epoch, from 1.
        epoch: u32,
        /// Step within the epoch.
        step: u64,
        /// Steps in the epoch; 0 while unknown (the first epoch trains as
        /// the data arrives, so its length is known only at its end).
        steps: u64,
        /// Latest loss.
        loss: Option<f64>,
        /// Samples per second across ranks.
        samples_per_sec: f64,
    },
    /// An epoch ended.
    Epoch(EpochMetrics),
    /// No replacement came for lost agents within `replacement_wait`: the
    /// remaining agents took over their shards and the gang shrank
    /// (`TrainingJobBuilder::min_slots`).
    Shrunk {
        /// The lost agents' ids.
        lost: Vec<String>,
        /// The gang's members from now on.
        world_size: u32,
    },
    /// An agent joined the cluster while the job trained: the gang grew at
    /// an epoch's end and `moved_shards` moved to it
    /// (`TrainingJobBuilder::max_slots`).
    Grown {
        /// The agent that joined.
        joined: String,
        /// The gang's members from now on.
        world_size: u32,
        /// The shards it took over, each from the agent that held it.
        moved_shards: Vec<usize>,
    },
    /// An attempt failed and the gang is re-forming.
    Recovering {
        /// The new attempt.
        attempt: u32,
        /// Shards re-sent to replacement agents.
        resent_shards: Vec<usize>,
        /// The agents lost.
        lost: Vec<String>,
    },
    /// An agent logged a warning or an error for the job (a failed attempt,
    /// a lost peer, a full spill disk): seen here wherever the agent runs.
    AgentLog {
        /// The job.
        job_id: String,
        /// What the agent logged, with its agent, rank and attempt.
        event: JobEvent,
    },
    /// Early stopping ended training: the monitored metric had not
    /// improved for `patience` epochs.
    EarlyStopped {
        /// The last epoch trained.
        epoch: u32,
        /// The best epoch; with `restore_best` the model holds its weights.
        best_epoch: Option<u32>,
    },
    /// Training finished.
    Finished {
        /// The job.
        job_id: String,
    },
}

//! What `job_status` and `list_jobs` answer: a job's state on one agent, its
//! epochs, sampled step losses, failed attempts and recent events
//! (re-exported by [`crate::action`]).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A job's lifecycle on one agent: its own progress through its share of the
/// job (ingest, training, recovery), as `job_status` reports it.
///
/// Not the rendezvous's [`JobState`](crate::rendezvous::JobState), which is
/// the job's gang across every member and attempt (ganging, running, and how
/// it ended). They share the terminal states: an agent ends its job the way
/// the rendezvous says the job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentJobState {
    /// Joining the gang at the rendezvous.
    Ganging,
    /// Gang formed; receiving rows.
    Ingesting,
    /// Training.
    Training,
    /// An attempt failed; re-joining the next one.
    Recovering,
    /// Finished; the model can be fetched.
    Succeeded,
    /// Failed for good; see `error`.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl AgentJobState {
    /// The job will not change any more.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            AgentJobState::Succeeded | AgentJobState::Failed | AgentJobState::Cancelled
        )
    }
}

/// Metrics of one finished epoch.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochMetrics {
    /// Epoch number, from 1.
    pub epoch: u32,
    /// Mean training loss over the epoch (all ranks).
    pub train_loss: f64,
    /// Rows trained in the epoch on this rank.
    pub rows: u64,
    /// Loss on the eval split, when there is one.
    #[serde(default)]
    pub eval_loss: Option<f64>,
    /// Accuracy on the eval split, for classification.
    #[serde(default)]
    pub eval_accuracy: Option<f64>,
    /// Samples per second on this rank.
    #[serde(default)]
    pub samples_per_sec: f64,
    /// Wall time of the epoch on this rank (training and evaluation), in
    /// seconds; absent in statuses from before it was recorded.
    #[serde(default)]
    pub wall_secs: Option<f64>,
    /// The learning rate of the epoch's last step (a schedule moves it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learning_rate: Option<f64>,
    /// Every other eval metric of the epoch by name (`eval_f1_macro`,
    /// `eval_auc_roc`, `eval_r2`, a model's own `eval_<name>`…), over all
    /// ranks' eval rows (see [`crate::scoring`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
}

impl EpochMetrics {
    /// The value of `metric` this epoch, when it was computed.
    pub fn get(&self, metric: crate::spec::Metric) -> Option<f64> {
        use crate::spec::Metric;
        match metric {
            Metric::TrainLoss => Some(self.train_loss),
            Metric::EvalLoss => self.eval_loss,
            Metric::EvalAccuracy => self.eval_accuracy,
            other => self.metrics.get(other.name()).copied(),
        }
    }
}

/// The training loss at one step, as sampled for a job's loss curve
/// ([`AgentJobStatus::step_losses`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepLoss {
    /// Epoch, from 1.
    pub epoch: u32,
    /// Step within the epoch, from 1.
    pub step: u64,
    /// Mean loss of the step across ranks.
    pub loss: f64,
}

/// An attempt of a job that failed, as one agent saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedAttempt {
    /// The attempt (from 1).
    pub attempt: u32,
    /// Why it failed.
    pub cause: String,
}

/// How serious a [`JobEvent`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum EventLevel {
    /// Something went wrong and was recovered from (or may be).
    Warn,
    /// Something failed.
    Error,
}

impl std::fmt::Display for EventLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EventLevel::Warn => "WARN",
            EventLevel::Error => "ERROR",
        })
    }
}

/// A warning or error an agent logged for a job, kept with the job so that
/// it reaches the user wherever the agent runs (`job_status`, the
/// rendezvous' status page, the client's output).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEvent {
    /// Numbers the job's events on this agent, from 1: a reader asks for
    /// nothing, it shows the events past the last number it showed.
    pub seq: u64,
    /// When, in Unix milliseconds.
    pub at_ms: u64,
    /// Warning or error.
    pub level: EventLevel,
    /// The agent that logged it.
    pub agent_id: String,
    /// Its rank in the attempt, once the gang formed.
    pub rank: Option<u32>,
    /// The attempt.
    pub attempt: u32,
    /// What happened.
    pub message: String,
}

/// A job as one agent sees it (`job_status`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentJobStatus {
    /// The job.
    pub job_id: String,
    /// This agent.
    pub agent_id: String,
    /// Lifecycle state.
    pub state: AgentJobState,
    /// Rendezvous attempt (from 1).
    pub attempt: u32,
    /// This agent's rank in the attempt, once the gang formed.
    pub rank: Option<u32>,
    /// Ranks in the attempt.
    pub world_size: u32,
    /// Current epoch (from 1; 0 before training).
    pub epoch: u32,
    /// Epochs in the spec.
    pub epochs: u32,
    /// Steps done in the current epoch.
    pub step: u64,
    /// Steps in the current epoch (agreed by all ranks); 0 while the first
    /// epoch trains rows that are still arriving (known when it ends).
    pub steps_per_epoch: u64,
    /// Latest training loss.
    pub loss: Option<f64>,
    /// Rows committed for training.
    pub rows_train: u64,
    /// Rows committed for evaluation.
    pub rows_eval: u64,
    /// Rows trained by all ranks together, per completed epoch (equal to the
    /// dataset's rows when every row was trained exactly once).
    pub rows_trained_per_epoch: Vec<u64>,
    /// Current training speed on this rank.
    pub samples_per_sec: f64,
    /// Cached Arrow bytes held in memory.
    pub cache_bytes_memory: u64,
    /// Cached Arrow bytes spilled to disk.
    pub cache_bytes_disk: u64,
    /// Metrics of completed epochs.
    pub history: Vec<EpochMetrics>,
    /// Epoch of the checkpoint the current attempt resumed from, if any.
    pub resumed_from_epoch: Option<u32>,
    /// Steps into the next epoch of that checkpoint, when it was taken
    /// inside an epoch (the attempt trains the rest of that epoch).
    #[serde(default)]
    pub resumed_from_step: Option<u64>,
    /// The error that failed or cancelled the job.
    pub error: Option<String>,
    /// Where the job trains on this agent: `cpu (flex)` or
    /// `gpu (wgpu: <adapter> (<api>, <kind>, <driver>))`.
    #[serde(default)]
    pub device: String,
    /// Attempts that failed on this agent, with their causes (oldest first).
    #[serde(default)]
    pub failed_attempts: Vec<FailedAttempt>,
    /// The training loss per step, sampled: at most
    /// [`STEP_LOSS_SAMPLES`] points spread over the whole run.
    #[serde(default)]
    pub step_losses: Vec<StepLoss>,
    /// The job's latest warnings and errors on this agent (at most
    /// [`JOB_EVENTS_KEPT`], oldest first).
    #[serde(default)]
    pub events: Vec<JobEvent>,
    /// The best epoch of the monitored metric so far, with early stopping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_epoch: Option<u32>,
    /// The epoch after which early stopping ended training, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_early: Option<u32>,
}

/// Most [`AgentJobStatus::step_losses`] a status carries.
pub const STEP_LOSS_SAMPLES: usize = 256;

/// Most [`AgentJobStatus::events`] a status carries.
pub const JOB_EVENTS_KEPT: usize = 32;

impl AgentJobStatus {
    /// Rows the agent holds for `split`.
    pub fn rows(&self, split: crate::descriptor::Split) -> u64 {
        match split {
            crate::descriptor::Split::Train => self.rows_train,
            crate::descriptor::Split::Eval => self.rows_eval,
        }
    }
}

/// Answer to `list_jobs`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobList {
    /// Every job.
    pub jobs: Vec<AgentJobStatus>,
}

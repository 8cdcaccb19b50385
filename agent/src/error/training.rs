//! What training a job fails with, apart from its model and ring:
//! [`TrainingError`] (a spec that cannot train on its data, a diverged loss,
//! optimizer state that does not fit), carried whole in the agent's error
//! (`AgentError::Training`).

use tonic::Code;

/// Why a job's training failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainingError {
    /// A `no_weight_decay` pattern that selects none of the model's parameters.
    #[error(
        "invalid input: job spec `no_weight_decay[{index}]`: `{pattern}` matches no parameter of the model; its parameters are {params}"
    )]
    NoDecayMatchesNothing {
        /// Position in the list.
        index: usize,
        /// The pattern.
        pattern: String,
        /// The model's parameter paths, comma-separated.
        params: String,
    },
    /// The train split holds no rows on any rank: nothing to train.
    #[error(
        "invalid input: the train split of job `{job_id}` is empty: {counted}; nothing was trained and no model is saved"
    )]
    EmptyTrainSplit {
        /// The job.
        job_id: String,
        /// What was counted, per rank.
        counted: String,
    },
    /// A metric the job monitors needs an eval split the job did not send.
    #[error(
        "invalid input: job spec `{field}` watches {metric}, but the eval split of job `{job_id}` is empty: send eval rows or watch train_loss"
    )]
    NoEvalSplit {
        /// The job.
        job_id: String,
        /// The spec field (`early_stopping.monitor`, `schedule.monitor`).
        field: &'static str,
        /// The metric.
        metric: &'static str,
    },
    /// The train split ended before any stream reached this agent.
    #[error("end of data before any stream reached this agent: send at least the schema")]
    NoData,
    /// The loss became non-finite.
    #[error(
        "training failed: loss became {loss} at epoch {epoch}, step {step}: lower the learning rate or normalise the features"
    )]
    Diverged {
        /// The loss.
        loss: f64,
        /// The epoch.
        epoch: u32,
        /// The step in the epoch.
        step: u64,
    },
    /// Optimizer state that does not belong to this optimizer or model.
    #[error("model record: optimizer state: {0}")]
    OptimizerState(String),
}

impl TrainingError {
    /// Its gRPC code: the job's spec or data, or the agent's own failure.
    pub fn code(&self) -> Code {
        match self {
            TrainingError::NoData => Code::FailedPrecondition,
            TrainingError::Diverged { .. } | TrainingError::OptimizerState(_) => Code::Internal,
            _ => Code::InvalidArgument,
        }
    }

    /// Whether the job's own input or spec caused it, so no new attempt can
    /// succeed.
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            TrainingError::Diverged { .. } | TrainingError::OptimizerState(_)
        )
    }
}

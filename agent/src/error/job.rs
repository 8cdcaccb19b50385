//! What a call about a job (or a served model) the agent does not hold, or
//! holds in the wrong state, is refused with: [`JobStateError`], carried
//! whole in the agent's error (`AgentError::Job`).

use kindling_schemas::action::AgentJobState;
use tonic::Code;

/// Why the job a call names cannot take it now.
#[derive(Debug, thiserror::Error)]
pub enum JobStateError {
    /// The job is not known to this agent.
    #[error("unknown job `{0}` on this agent: start it with the `start_job` action first")]
    UnknownJob(String),
    /// Prediction named neither a job nor a served model.
    #[error(
        "agent `{agent_id}` has no job and serves no model `{model_id}`: serve it there first \
         (the `serve_model` action; `TrainedModel::transform` serves on every live agent)"
    )]
    UnknownModel {
        /// This agent.
        agent_id: String,
        /// What was asked for.
        model_id: String,
    },
    /// The job has no checkpoint on this agent.
    #[error("job `{0}` has no checkpoint on this agent yet")]
    NoCheckpoint(String),
    /// `start_job` with `rows_from` on an agent that does not hold the
    /// dataset (yet: a search starts it on a replacement agent first).
    #[error(
        "job `{job_id}` trains on the rows of dataset `{dataset}`, which agent `{agent_id}` does not hold: \
         start the dataset's job on this agent first"
    )]
    NoDataset {
        /// The job.
        job_id: String,
        /// The dataset it names.
        dataset: String,
        /// This agent.
        agent_id: String,
    },
    /// The dataset a job names cannot serve it, or the job takes no rows.
    #[error("job `{job_id}` and dataset `{dataset}`: {reason}")]
    Dataset {
        /// The job.
        job_id: String,
        /// The dataset.
        dataset: String,
        /// Why.
        reason: String,
    },
    /// The job exists but is in the wrong state for the call.
    #[error("job `{job_id}` is {state}: {reason}")]
    WrongState {
        /// The job.
        job_id: String,
        /// Its state.
        state: String,
        /// Why the call is refused.
        reason: String,
    },
    /// A checkpoint was asked for before any stream told the input layout.
    #[error("the checkpoint's input layout is unknown: no data arrived")]
    UnknownLayout,
    /// `issue_credential` on an agent started without a credential key.
    #[error(
        "agent `{agent_id}` has no credential key (--credential-key-file, KINDLING_CREDENTIAL_KEY_FILE): it issues no job credentials"
    )]
    NoCredentialKey {
        /// The agent.
        agent_id: String,
    },
    /// The current attempt failed (a peer died, the rendezvous failed it).
    #[error("attempt {attempt} of job `{job_id}` failed: {cause}")]
    AttemptFailed {
        /// The job.
        job_id: String,
        /// The failed attempt.
        attempt: u32,
        /// Why.
        cause: String,
    },
    /// The job was cancelled.
    #[error("job cancelled: {0}")]
    Cancelled(String),
}

impl JobStateError {
    /// The job `job_id` is `state`, which refuses the call for `reason`.
    pub fn wrong_state(job_id: &str, state: AgentJobState, reason: impl Into<String>) -> Self {
        JobStateError::WrongState {
            job_id: job_id.to_owned(),
            state: format!("{state:?}").to_lowercase(),
            reason: reason.into(),
        }
    }

    /// Its gRPC code. A dataset not here yet is UNAVAILABLE (a search
    /// starts it on a replacement agent first), though not retried as such.
    pub fn code(&self) -> Code {
        match self {
            JobStateError::UnknownJob(_)
            | JobStateError::UnknownModel { .. }
            | JobStateError::NoCheckpoint(_) => Code::NotFound,
            JobStateError::NoDataset { .. } => Code::Unavailable,
            JobStateError::Dataset { .. }
            | JobStateError::WrongState { .. }
            | JobStateError::UnknownLayout
            | JobStateError::NoCredentialKey { .. } => Code::FailedPrecondition,
            JobStateError::AttemptFailed { .. } => Code::Aborted,
            JobStateError::Cancelled(_) => Code::Cancelled,
        }
    }

    /// Whether a new attempt can help: only when this one failed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, JobStateError::AttemptFailed { .. })
    }
}

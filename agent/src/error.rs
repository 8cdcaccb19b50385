//! The agent's error type and its one mapping to `tonic::Status`.

use kindling_schemas::descriptor::PathError;
use kindling_schemas::schema::SchemaError;
use tonic::Status;

/// Everything that can go wrong in an agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The caller sent something that does not follow the contract.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A stream's schema or values do not fit the job spec.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// A Flight path that does not follow the contract.
    #[error(transparent)]
    Path(#[from] PathError),
    /// The job is not known to this agent.
    #[error("unknown job `{0}` on this agent: start it with the `start_job` action first")]
    UnknownJob(String),
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
    /// A peer could not be reached or timed out.
    #[error("peer {peer} unavailable: {reason}")]
    PeerUnavailable {
        /// Address.
        peer: String,
        /// What happened.
        reason: String,
    },
    /// Training diverged or the model failed.
    #[error("training failed: {0}")]
    Training(String),
    /// The job was cancelled.
    #[error("job cancelled: {0}")]
    Cancelled(String),
    /// Local I/O (spill files, checkpoints).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Arrow encoding or decoding.
    #[error("arrow: {0}")]
    Arrow(#[source] arrow::error::ArrowError),
    /// The rendezvous refused or failed a call.
    #[error("rendezvous: {0}")]
    Rendezvous(String),
    /// A model or optimizer record could not be encoded or decoded.
    #[error("model record: {0}")]
    Record(String),
    /// The job asks for a GPU this agent cannot give (not built with the
    /// `gpu` feature, or no adapter on the node).
    #[error("{0}")]
    GpuUnavailable(String),
}

impl AgentError {
    /// Wraps an Arrow error.
    pub fn arrow(e: arrow::error::ArrowError) -> Self {
        AgentError::Arrow(e)
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        AgentError::Io {
            context: context.into(),
            source,
        }
    }

    /// Whether retrying the same call (or a new attempt) can help.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            AgentError::AttemptFailed { .. } | AgentError::PeerUnavailable { .. } | AgentError::Rendezvous(_)
        )
    }
}

impl From<AgentError> for Status {
    fn from(e: AgentError) -> Status {
        let msg = e.to_string();
        match e {
            AgentError::InvalidInput(_) | AgentError::Schema(_) | AgentError::Path(_) => {
                Status::invalid_argument(msg)
            }
            AgentError::UnknownJob(_) => Status::not_found(msg),
            AgentError::WrongState { .. } | AgentError::GpuUnavailable(_) => Status::failed_precondition(msg),
            AgentError::AttemptFailed { .. } => Status::aborted(msg),
            AgentError::PeerUnavailable { .. } | AgentError::Rendezvous(_) => Status::unavailable(msg),
            AgentError::Cancelled(_) => Status::cancelled(msg),
            AgentError::Training(_)
            | AgentError::Io { .. }
            | AgentError::Arrow(_)
            | AgentError::Record(_) => Status::internal(msg),
        }
    }
}

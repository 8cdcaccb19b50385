//! The agent's error type and its one mapping to `tonic::Status`: one
//! variant per room that raises errors, each carrying that room's own error
//! whole — the call ([`RequestError`]), the streams of batches
//! ([`IngestError`]), the agent's caps ([`LimitError`]), the job's state
//! ([`JobStateError`]), training ([`TrainingError`]), the model
//! ([`ModelError`]), the GPU ([`NoGpu`]), the ring ([`RingError`]), the
//! rendezvous ([`RendezvousError`]), spill files ([`SpillError`]),
//! checkpoints ([`CheckpointError`]), a detached job's kept rows
//! ([`KeptError`]) and the agent itself
//! ([`InternalError`]). Each room's error says its gRPC code and whether a
//! retry can help; the map here only asks it.

use arrow_flight::error::FlightError;
use kindling_schemas::action::{ActionError, AgentJobState};
use kindling_schemas::auth::InvalidToken;
use kindling_schemas::descriptor::PathError;
use kindling_schemas::metadata::MetadataError;
use kindling_schemas::model_serving::WeightsError;
use kindling_schemas::rendezvous::ClientError;
use kindling_schemas::schema::SchemaError;
use tonic::{Code, Status};

mod checkpoint;
mod gpu;
mod ingest;
mod internal;
mod job;
mod kept;
mod limits;
mod model;
mod rendezvous;
mod request;
mod ring;
mod spill;
mod training;

pub use checkpoint::CheckpointError;
pub use gpu::NoGpu;
pub use ingest::IngestError;
pub use internal::InternalError;
pub use job::JobStateError;
pub use kept::KeptError;
pub use limits::LimitError;
pub use model::ModelError;
pub use rendezvous::RendezvousError;
pub use request::RequestError;
pub use ring::{RingError, RingRefusal};
pub use spill::SpillError;
pub use training::TrainingError;

/// Everything that can go wrong in an agent, by the room that raised it.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The call does not follow the Flight contract.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A stream of record batches was refused.
    #[error(transparent)]
    Ingest(#[from] IngestError),
    /// A call ran into one of the agent's caps or time bounds.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The job the call names is unknown here or in the wrong state.
    #[error(transparent)]
    Job(#[from] JobStateError),
    /// Training the job failed.
    #[error(transparent)]
    Training(#[from] TrainingError),
    /// A model could not be built, read its inputs, or take its weights.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The job asks for a GPU this agent cannot give (not built with the
    /// `gpu` feature, no adapter on the node, no half precision there).
    #[error(transparent)]
    GpuUnavailable(#[from] NoGpu),
    /// A ring operation failed, or a peer's connection was refused (its own
    /// error, whole: kind, peer, cause).
    #[error(transparent)]
    Ring(#[from] RingError),
    /// A rendezvous call failed, or the job disagrees with the rendezvous.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// A batch could not be spilled or read back from its spill file.
    #[error(transparent)]
    Spill(#[from] SpillError),
    /// A checkpoint could not be written, read or received.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A detached job's rows could not be kept on the agent's disk, or
    /// read back after a restart.
    #[error(transparent)]
    Kept(#[from] KeptError),
    /// The agent itself failed.
    #[error(transparent)]
    Internal(#[from] InternalError),
}

/// The cause of a ring operation ended by its attempt's cancellation (the
/// attempt ended from outside: a failed peer, a cancelled job).
pub const RING_ABORTED: &str = "collective operation aborted";

impl AgentError {
    /// The caller's stream failed with `status`.
    pub fn caller_stream(status: &Status) -> Self {
        RequestError::CallerStream {
            code: status.code(),
            message: status.message().to_owned(),
        }
        .into()
    }

    /// Wraps an Arrow error.
    pub fn arrow(e: arrow::error::ArrowError) -> Self {
        InternalError::Arrow(e).into()
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        InternalError::Io {
            context: context.into(),
            source,
        }
        .into()
    }

    /// A task on a blocking thread (`task`) panicked or was cancelled.
    pub fn panicked(task: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Self {
        move |source| InternalError::Panicked { task, source }.into()
    }

    /// The job `job_id` is `state`, which refuses the call for `reason`.
    pub fn wrong_state(job_id: &str, state: AgentJobState, reason: impl Into<String>) -> Self {
        JobStateError::wrong_state(job_id, state, reason).into()
    }

    /// A failed rendezvous call to `url`.
    pub fn rendezvous(url: &str, source: ClientError) -> Self {
        RendezvousError::call(url, source).into()
    }

    /// Its gRPC code, as the room that raised it says.
    pub fn code(&self) -> Code {
        match self {
            AgentError::Request(e) => e.code(),
            AgentError::Ingest(e) => e.code(),
            AgentError::Limit(e) => e.code(),
            AgentError::Job(e) => e.code(),
            AgentError::Training(e) => e.code(),
            AgentError::Model(e) => e.code(),
            AgentError::GpuUnavailable(_) => Code::FailedPrecondition,
            AgentError::Ring(e) => e.code(),
            AgentError::Rendezvous(e) => e.code(),
            AgentError::Spill(e) => e.code(),
            AgentError::Kept(e) => e.code(),
            AgentError::Checkpoint(_) | AgentError::Internal(_) => Code::Internal,
        }
    }

    /// Whether the job's own input or spec caused it, so no new attempt can
    /// succeed: the job fails for good instead of retrying.
    pub fn is_final(&self) -> bool {
        match self {
            AgentError::Training(e) => e.is_final(),
            AgentError::Model(e) => e.is_final(),
            _ => false,
        }
    }

    /// Whether it is a ring operation ended by its attempt's cancellation.
    pub fn is_ring_abort(&self) -> bool {
        self.attempt_failed_for()
            .is_some_and(|cause| cause == RING_ABORTED)
    }

    /// Whether it only says the work was cancelled (from outside), not why.
    pub fn is_cancellation(&self) -> bool {
        matches!(self, AgentError::Job(JobStateError::Cancelled(_)))
            || self
                .attempt_failed_for()
                .is_some_and(|cause| cause == "cancelled")
    }

    /// The cause of a failed attempt, as the job or its ring saw it.
    fn attempt_failed_for(&self) -> Option<&str> {
        match self {
            AgentError::Job(JobStateError::AttemptFailed { cause, .. })
            | AgentError::Ring(RingError::AttemptFailed { cause, .. }) => Some(cause),
            _ => None,
        }
    }

    /// Whether retrying the same call (or a new attempt) can help.
    pub fn is_retryable(&self) -> bool {
        match self {
            AgentError::Job(e) => e.is_retryable(),
            AgentError::Ring(e) => e.is_retryable(),
            AgentError::Rendezvous(e) => e.is_retryable(),
            _ => false,
        }
    }
}

/// The errors of the wire contract convert straight into the agent's, so
/// `?` takes them where they arise.
macro_rules! from_through {
    ($($source:ty => $room:ty),* $(,)?) => {$(
        impl From<$source> for AgentError {
            fn from(e: $source) -> Self {
                <$room>::from(e).into()
            }
        }
    )*};
}

from_through! {
    PathError => RequestError,
    WeightsError => RequestError,
    ActionError => RequestError,
    InvalidToken => RequestError,
    MetadataError => IngestError,
    SchemaError => IngestError,
    RingRefusal => RingError,
}

/// A failed Flight stream: our own error travelled inside it, the caller's
/// stream failed with a status, or the data does not decode.
impl From<FlightError> for AgentError {
    fn from(e: FlightError) -> Self {
        match e {
            FlightError::Tonic(s) => AgentError::caller_stream(&s),
            FlightError::ExternalError(inner) => match inner.downcast::<AgentError>() {
                Ok(agent) => *agent,
                Err(other) => IngestError::MalformedFlight(FlightError::ExternalError(other)).into(),
            },
            other => IngestError::MalformedFlight(other).into(),
        }
    }
}

/// Carries an agent error through a Flight stream (see `From<FlightError>`).
impl From<AgentError> for FlightError {
    fn from(e: AgentError) -> Self {
        FlightError::ExternalError(Box::new(e))
    }
}

/// The one map to the wire: the room's code and the error's message.
impl From<AgentError> for Status {
    fn from(e: AgentError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

/// Each room's error leaves through the same map, so a handler answering
/// `Status` takes it with `?` too.
macro_rules! status_through_agent_error {
    ($($room:ty),* $(,)?) => {$(
        impl From<$room> for Status {
            fn from(e: $room) -> Status {
                AgentError::from(e).into()
            }
        }
    )*};
}

status_through_agent_error!(
    RequestError,
    IngestError,
    LimitError,
    JobStateError,
    TrainingError,
    ModelError,
    NoGpu,
    RingError,
    RingRefusal,
    RendezvousError,
    SpillError,
    CheckpointError,
    InternalError,
);

#[cfg(test)]
mod tests;

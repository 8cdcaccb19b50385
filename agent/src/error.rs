//! The agent's error type and its one mapping to `tonic::Status`; the
//! errors of the ring ([`RingError`]), of checkpoints ([`CheckpointError`])
//! and of spill files ([`SpillError`]), which it carries whole.

use arrow_flight::error::FlightError;
use kindling_schemas::action::{ActionError, AgentJobState};
use kindling_schemas::auth::InvalidToken;
use kindling_schemas::descriptor::{PathError, Split};
use kindling_schemas::metadata::MetadataError;
use kindling_schemas::model_serving::WeightsError;
use kindling_schemas::rendezvous::ClientError;
use kindling_schemas::schema::{FeatureColumn, SchemaError};
use tonic::Status;

mod checkpoint;
mod gpu;
mod model;
mod ring;
mod spill;

pub use checkpoint::CheckpointError;
pub use gpu::NoGpu;
pub use model::ModelError;
pub use ring::RingError;
pub use spill::SpillError;

/// Everything that can go wrong in an agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    // The caller's request does not follow the contract (InvalidArgument).
    /// A `DoPut` or `DoExchange` whose stream ended before its first message.
    #[error("empty {call}: the first message must carry the descriptor")]
    EmptyStream {
        /// The Flight call.
        call: &'static str,
    },
    /// The first message of a `DoPut` or `DoExchange` has no descriptor.
    #[error("the first {call} message has no flight descriptor")]
    NoDescriptor {
        /// The Flight call.
        call: &'static str,
    },
    /// A Flight path that does not follow the contract.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A valid path the call does not take.
    #[error("{call} takes {expected}, not {got:?}")]
    WrongPath {
        /// The Flight call.
        call: &'static str,
        /// The paths it takes.
        expected: &'static str,
        /// The path's segments.
        got: Vec<String>,
    },
    /// A model was asked for at a path that names no model.
    #[error("{0:?} is not a model: use [job_id, model] or [job_id, checkpoint]")]
    NotAModel(Vec<String>),
    /// A `serve_model` body whose model cannot be built (id, weights, inputs).
    #[error("invalid input: serve_model: {0}")]
    BadServedModel(#[from] WeightsError),
    /// A `serve_model` body whose `model_id` is not its content's.
    #[error(
        "invalid input: serve_model: model_id `{given}` is not its content's id `{content}` \
         (kindling_schemas::model_serving::model_id; or send an empty model_id)"
    )]
    ServedModelId {
        /// The id the body names.
        given: String,
        /// The id of its spec, inputs and weights.
        content: String,
    },
    /// `GetSchema` for a path that has no fixed schema.
    #[error("no schema for {0:?}")]
    NoSchema(Vec<String>),
    /// An action with an unknown name or a malformed body.
    #[error("invalid input: {0}")]
    Action(#[from] ActionError),
    /// A record batch whose `app_metadata` is missing or malformed.
    #[error("invalid input: {0}")]
    BatchMetadata(#[from] MetadataError),
    /// The producer's `DoPut` stream broke with this status.
    #[error("invalid input: DoPut stream broke: {}", .0.message())]
    PutStreamBroke(#[source] Box<Status>),
    /// Flight data that does not decode (or a Flight stream failing locally).
    #[error("malformed Flight stream: {0}")]
    MalformedFlight(#[source] FlightError),
    /// A record batch arrived before the stream's schema.
    #[error("invalid input: record batch before schema")]
    BatchBeforeSchema,
    /// A stream's schema or values do not fit the job spec.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// A stream's features differ from those of the job's earlier streams.
    #[error("invalid input: stream layout {stream:?} differs from the job's earlier streams {job:?}")]
    LayoutMismatch {
        /// This stream's features.
        stream: Vec<FeatureColumn>,
        /// The features the job agreed on.
        job: Vec<FeatureColumn>,
    },
    /// A producer skipped or reordered a sequence number.
    #[error(
        "invalid input: producer `{producer}` sent seq {got} but {expected} is the next expected (gap or reorder)"
    )]
    SequenceGap {
        /// The producer.
        producer: String,
        /// The sequence number it sent.
        got: u64,
        /// The one expected.
        expected: u64,
    },
    /// The producer stopped reading acknowledgements mid-stream.
    #[error("invalid input: the producer went away before the end of its stream")]
    ProducerGone,
    /// `create_job` named no rendezvous and the agent is registered with none.
    #[error("invalid input: create_job: this agent is registered with no rendezvous; pass `rendezvous`")]
    NoRendezvous,
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
    /// `start_job` with a spec whose `num_slots` contradicts the job the
    /// rendezvous holds (a smaller world, or a larger one for a job that
    /// never shrank).
    #[error(
        "invalid input: start_job: the spec of job `{job_id}` has num_slots {spec}, but the job at the rendezvous has {job}{hint}"
    )]
    WorldMismatch {
        /// The job.
        job_id: String,
        /// The spec's `num_slots`.
        spec: u32,
        /// The rendezvous' `num_slots`.
        job: u32,
        /// What would be accepted.
        hint: &'static str,
    },
    /// The bearer token cannot be sent as a header.
    #[error("invalid input: {0}")]
    Token(#[from] InvalidToken),

    // Not found.
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
    /// `start_job` named a job the rendezvous does not know.
    #[error(
        "job `{job_id}` does not exist at the rendezvous {rendezvous}: create it there first \
         (CreateJob), then start it on its agents"
    )]
    NotAtRendezvous {
        /// The job.
        job_id: String,
        /// The rendezvous asked.
        rendezvous: String,
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

    // The job is in the wrong state (FailedPrecondition).
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
    /// The train split ended before any stream reached this agent.
    #[error("end of data before any stream reached this agent: send at least the schema")]
    NoData,
    /// `end_of_data` expected another number of rows than were committed.
    #[error(
        "end_of_data for {} of job `{job_id}`: {committed} rows committed here, the producer expected {expected}",
        .split.as_str()
    )]
    RowCountMismatch {
        /// The job.
        job_id: String,
        /// The split.
        split: Split,
        /// Rows committed on this agent.
        committed: u64,
        /// Rows the producer sent.
        expected: u64,
    },
    /// A model could not be built, read its inputs, or take its weights.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The job asks for a GPU this agent cannot give (not built with the
    /// `gpu` feature, no adapter on the node, no half precision there).
    #[error(transparent)]
    GpuUnavailable(#[from] NoGpu),
    /// `issue_credential` on an agent started without a credential key.
    #[error(
        "agent `{agent_id}` has no credential key (--credential-key-file, KINDLING_CREDENTIAL_KEY_FILE): it issues no job credentials"
    )]
    NoCredentialKey {
        /// The agent.
        agent_id: String,
    },

    // Retryable: the attempt or a peer failed.
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
    /// A ring operation failed (its own error, whole: kind, peer, cause).
    #[error(transparent)]
    Ring(#[from] RingError),
    /// The rendezvous refused or failed a call.
    #[error("rendezvous {url}: {source}")]
    Rendezvous {
        /// The rendezvous address.
        url: String,
        /// What the call failed with.
        #[source]
        source: Box<ClientError>,
    },
    /// The rendezvous did not answer in time.
    #[error("rendezvous {url}: timed out")]
    RendezvousTimeout {
        /// The rendezvous address.
        url: String,
    },

    /// The job was cancelled.
    #[error("job cancelled: {0}")]
    Cancelled(String),
    /// A Flight call the agent does not offer; says what to use instead.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The caller's own stream failed (a message over this agent's cap, a
    /// broken connection): its gRPC code and message, answered as they are.
    #[error("{message}")]
    CallerStream {
        /// The stream's status code.
        code: tonic::Code,
        /// Its message.
        message: String,
    },

    // The agent failed (Internal).
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
    /// A task on a blocking thread panicked or was cancelled.
    #[error("{task} panicked: {source}")]
    Panicked {
        /// What ran there.
        task: &'static str,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
    /// A batch could not be spilled or read back from its spill file.
    #[error(transparent)]
    Spill(#[from] SpillError),
    /// A job's uncommitted streams hold the staging cap: the batch is refused.
    #[error(
        "job `{job_id}`: streams that have not committed hold {staged} bytes, the cap is {cap} \
         (--max-staged-bytes): end (commit) streams before sending more, or raise the cap"
    )]
    StagingFull {
        /// The job.
        job_id: String,
        /// Bytes its uncommitted streams hold.
        staged: u64,
        /// The cap.
        cap: u64,
    },
    /// One credential holds as many open streams on this agent as it may.
    #[error(
        "a {role} credential for job `{job_id}` already has {cap} streams open on this agent, its cap: end one first"
    )]
    TooManyStreams {
        /// The credential's job.
        job_id: String,
        /// Its role.
        role: kindling_schemas::credential::Role,
        /// The cap.
        cap: usize,
    },
    /// A `DoPut` or `DoExchange` stream sent nothing, or read nothing, for
    /// too long (a `DoPut`'s staged rows are dropped).
    #[error(
        "the {call} stream sent or read nothing for {idle:?} (--stream-idle-secs): it was ended{dropped}"
    )]
    StreamIdle {
        /// `DoPut` or `DoExchange`.
        call: &'static str,
        /// The bound.
        idle: std::time::Duration,
        /// What else was lost, if anything (", its staged rows dropped").
        dropped: &'static str,
    },
    /// A `DoPut` or `DoExchange` stream was open too long.
    #[error(
        "the {call} stream was open longer than {max_age:?} (--stream-max-age-secs): it was ended{dropped}"
    )]
    StreamTooOld {
        /// `DoPut` or `DoExchange`.
        call: &'static str,
        /// The bound.
        max_age: std::time::Duration,
        /// What else was lost, if anything.
        dropped: &'static str,
    },
    /// The agent holds as many unfinished jobs as it may (`--max-jobs`).
    #[error(
        "agent `{agent_id}` already holds {active} unfinished job(s), its cap (--max-jobs, KINDLING_MAX_JOBS) is {cap}: wait for one to end, cancel one, or raise the cap"
    )]
    TooManyJobs {
        /// This agent.
        agent_id: String,
        /// Unfinished jobs it holds.
        active: usize,
        /// The cap.
        cap: usize,
    },
    /// The agent serves as many models as it may.
    #[error(
        "agent `{agent_id}` already serves {cap} models, its cap: drop one first (the `drop_model` action)"
    )]
    TooManyModels {
        /// This agent.
        agent_id: String,
        /// The cap.
        cap: usize,
    },
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
    /// Optimizer state that does not belong to this optimizer or model.
    #[error("model record: optimizer state: {0}")]
    OptimizerState(String),
    /// A checkpoint could not be written, read or received.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A JSON response could not be encoded.
    #[error("encoding the response: {0}")]
    ResponseJson(#[source] serde_json::Error),
}

/// The cause of a ring operation ended by its attempt's cancellation (the
/// attempt ended from outside: a failed peer, a cancelled job).
pub const RING_ABORTED: &str = "collective operation aborted";

impl AgentError {
    /// The caller's stream failed with `status`.
    pub fn caller_stream(status: &Status) -> Self {
        AgentError::CallerStream {
            code: status.code(),
            message: status.message().to_owned(),
        }
    }

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

    /// The job `job_id` is `state`, which refuses the call for `reason`.
    pub fn wrong_state(job_id: &str, state: AgentJobState, reason: impl Into<String>) -> Self {
        AgentError::WrongState {
            job_id: job_id.to_owned(),
            state: format!("{state:?}").to_lowercase(),
            reason: reason.into(),
        }
    }

    /// A failed rendezvous call to `url`.
    pub fn rendezvous(url: &str, source: ClientError) -> Self {
        AgentError::Rendezvous {
            url: url.to_owned(),
            source: Box::new(source),
        }
    }

    /// Whether the job's own input or spec caused it, so no new attempt can
    /// succeed: the job fails for good instead of retrying.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            AgentError::NoDecayMatchesNothing { .. }
                | AgentError::EmptyTrainSplit { .. }
                | AgentError::NoEvalSplit { .. }
                | AgentError::NoData
        ) || matches!(self, AgentError::Model(e) if e.is_final())
    }

    /// Whether it is a ring operation ended by its attempt's cancellation.
    pub fn is_ring_abort(&self) -> bool {
        matches!(self, AgentError::Ring(RingError::AttemptFailed { cause, .. }) if cause == RING_ABORTED)
            || matches!(self, AgentError::AttemptFailed { cause, .. } if cause == RING_ABORTED)
    }

    /// Whether it only says the work was cancelled (from outside), not why.
    pub fn is_cancellation(&self) -> bool {
        match self {
            AgentError::Cancelled(_) => true,
            AgentError::AttemptFailed { cause, .. }
            | AgentError::Ring(RingError::AttemptFailed { cause, .. }) => cause == "cancelled",
            _ => false,
        }
    }

    /// Whether retrying the same call (or a new attempt) can help.
    pub fn is_retryable(&self) -> bool {
        match self {
            AgentError::AttemptFailed { .. }
            | AgentError::Ring(RingError::AttemptFailed { .. } | RingError::PeerUnavailable { .. })
            | AgentError::RendezvousTimeout { .. } => true,
            AgentError::Rendezvous { source, .. } => source.is_retryable(),
            _ => false,
        }
    }
}

/// A failed Flight stream: our own error travelled inside it, the caller's
/// stream failed with a status, or the data does not decode.
impl From<FlightError> for AgentError {
    fn from(e: FlightError) -> Self {
        match e {
            FlightError::Tonic(s) => AgentError::caller_stream(&s),
            FlightError::ExternalError(inner) => match inner.downcast::<AgentError>() {
                Ok(agent) => *agent,
                Err(other) => AgentError::MalformedFlight(FlightError::ExternalError(other)),
            },
            other => AgentError::MalformedFlight(other),
        }
    }
}

/// Carries an agent error through a Flight stream (see `From<FlightError>`).
impl From<AgentError> for FlightError {
    fn from(e: AgentError) -> Self {
        FlightError::ExternalError(Box::new(e))
    }
}

impl From<AgentError> for Status {
    fn from(e: AgentError) -> Status {
        let msg = e.to_string();
        // The rendezvous refused the caller's own request (a job id that
        // exists with other parameters, an unknown job): its code, not the
        // UNAVAILABLE a client would retry.
        if let AgentError::Rendezvous { source, .. } = &e
            && let ClientError::Rpc { source: status, .. } = &**source
            && matches!(
                status.code(),
                tonic::Code::InvalidArgument
                    | tonic::Code::NotFound
                    | tonic::Code::AlreadyExists
                    | tonic::Code::FailedPrecondition
            )
        {
            return Status::new(status.code(), msg);
        }
        match e {
            AgentError::EmptyStream { .. }
            | AgentError::NoDescriptor { .. }
            | AgentError::Path(_)
            | AgentError::WrongPath { .. }
            | AgentError::NotAModel(_)
            | AgentError::BadServedModel(_)
            | AgentError::ServedModelId { .. }
            | AgentError::NoSchema(_)
            | AgentError::Action(_)
            | AgentError::BatchMetadata(_)
            | AgentError::MalformedFlight(_)
            | AgentError::BatchBeforeSchema
            | AgentError::Schema(_)
            | AgentError::LayoutMismatch { .. }
            | AgentError::SequenceGap { .. }
            | AgentError::ProducerGone
            | AgentError::NoDecayMatchesNothing { .. }
            | AgentError::EmptyTrainSplit { .. }
            | AgentError::NoEvalSplit { .. }
            | AgentError::NoRendezvous
            | AgentError::Model(
                ModelError::Unregistered { .. }
                | ModelError::Config { .. }
                | ModelError::InputKind { .. }
                | ModelError::Table(_)
                | ModelError::MissingColumn(_),
            )
            | AgentError::Ring(RingError::RankOutsideWorld { .. } | RingError::BroadcastWithoutPayload)
            | AgentError::WorldMismatch { .. }
            | AgentError::Token(_) => Status::invalid_argument(msg),
            AgentError::UnknownJob(_)
            | AgentError::UnknownModel { .. }
            | AgentError::NotAtRendezvous { .. }
            | AgentError::NoCheckpoint(_) => Status::not_found(msg),
            AgentError::NoDataset { .. } => Status::unavailable(msg),
            AgentError::Dataset { .. } => Status::failed_precondition(msg),
            AgentError::WrongState { .. }
            | AgentError::UnknownLayout
            | AgentError::NoData
            | AgentError::RowCountMismatch { .. }
            | AgentError::GpuUnavailable(_)
            | AgentError::NoCredentialKey { .. } => Status::failed_precondition(msg),
            AgentError::AttemptFailed { .. } | AgentError::Ring(RingError::AttemptFailed { .. }) => {
                Status::aborted(msg)
            }
            // A rendezvous address or token that cannot work is the caller's input.
            AgentError::Rendezvous { ref source, .. }
                if matches!(
                    **source,
                    ClientError::InvalidEndpoint { .. } | ClientError::InvalidToken(_)
                ) =>
            {
                Status::invalid_argument(msg)
            }
            AgentError::Ring(RingError::PeerUnavailable { .. })
            | AgentError::Rendezvous { .. }
            | AgentError::RendezvousTimeout { .. } => Status::unavailable(msg),
            AgentError::Cancelled(_) => Status::cancelled(msg),
            // A message over the size cap keeps its code; any other break is the caller's input.
            AgentError::PutStreamBroke(s) if s.code() == tonic::Code::ResourceExhausted => {
                Status::resource_exhausted(msg)
            }
            AgentError::PutStreamBroke(_) => Status::invalid_argument(msg),
            AgentError::Spill(SpillError::Full { .. })
            | AgentError::TooManyJobs { .. }
            | AgentError::StagingFull { .. }
            | AgentError::TooManyStreams { .. }
            | AgentError::TooManyModels { .. }
            | AgentError::Model(ModelError::TooLarge { .. }) => Status::resource_exhausted(msg),
            AgentError::StreamIdle { .. } | AgentError::StreamTooOld { .. } => Status::deadline_exceeded(msg),
            AgentError::Unsupported(_) => Status::unimplemented(msg),
            AgentError::CallerStream { code, message } => Status::new(code, message),
            AgentError::Diverged { .. }
            | AgentError::Panicked { .. }
            | AgentError::Model(ModelError::TensorData(_) | ModelError::Record(_))
            | AgentError::Spill(_)
            | AgentError::Io { .. }
            | AgentError::Arrow(_)
            | AgentError::OptimizerState(_)
            | AgentError::Checkpoint(_)
            | AgentError::ResponseJson(_) => Status::internal(msg),
        }
    }
}

#[cfg(test)]
mod tests;

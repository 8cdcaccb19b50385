//! What a stream of record batches sent to the agent (a `DoPut`'s rows, a
//! `DoExchange`'s inputs) is refused with: [`IngestError`], carried whole in
//! the agent's error (`AgentError::Ingest`).

use arrow_flight::error::FlightError;
use kindling_schemas::descriptor::Split;
use kindling_schemas::metadata::MetadataError;
use kindling_schemas::schema::{FeatureColumn, SchemaError};
use tonic::{Code, Status};

/// Why a stream's batches were refused.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
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
    /// Rows pushed into a split its producers said was done.
    #[error(
        "job `{job_id}`: its {} split ended (end_of_data): it takes no more rows until the job's client \
         reopens it (reopen_split, to feed lost shards again); push every row before end_of_data",
        .split.as_str()
    )]
    SplitEnded {
        /// The job.
        job_id: String,
        /// The split.
        split: Split,
    },
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
}

impl IngestError {
    /// Its gRPC code: the producer's input, but for a stream that broke on
    /// a message over the size cap (which keeps its code) and a row count
    /// that disagrees with what was committed (the job's state).
    pub fn code(&self) -> Code {
        match self {
            IngestError::PutStreamBroke(s) if s.code() == Code::ResourceExhausted => Code::ResourceExhausted,
            IngestError::RowCountMismatch { .. } | IngestError::SplitEnded { .. } => Code::FailedPrecondition,
            _ => Code::InvalidArgument,
        }
    }
}

//! What keeping a detached job's rows on the agent's disk, or taking them
//! back after a restart, fails with: [`KeptError`], carried whole in the
//! agent's error (`AgentError::Kept`).

use std::path::PathBuf;

use super::SpillError;

/// Why a job's rows could not be kept on this agent's disk, or read back.
#[derive(Debug, thiserror::Error)]
pub enum KeptError {
    /// The rows would take the agent's disk past its watermark or the free
    /// space its volume keeps: nothing is written.
    #[error(
        "keeping job `{job_id}`'s rows ({needed} bytes) on this agent's disk: {source}; the job is not \
         detached"
    )]
    Disk {
        /// The job.
        job_id: String,
        /// The bytes the rows take.
        needed: u64,
        /// The watermark's or the volume's refusal.
        #[source]
        source: SpillError,
    },
    /// Writing or reading a kept file.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, and where.
        context: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Encoding or decoding a kept batch.
    #[error("kept rows of job `{job_id}`: arrow: {source}")]
    Arrow {
        /// The job.
        job_id: String,
        /// The Arrow error.
        #[source]
        source: arrow::error::ArrowError,
    },
    /// The record of what was kept does not parse.
    #[error("kept rows {}: {source}", .dir.display())]
    Meta {
        /// The kept job's directory.
        dir: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A kept file whose length or digest differs from what the record
    /// says (a torn write, a full disk, bit rot): the copy is passed over.
    #[error("kept rows {}: {reason}", .place.display())]
    Corrupt {
        /// The file.
        place: PathBuf,
        /// What differs.
        reason: String,
    },
}

impl KeptError {
    /// Its gRPC code: a disk at its bounds is an exhausted resource, any
    /// other failure the agent's own.
    pub fn code(&self) -> tonic::Code {
        match self {
            KeptError::Disk { source, .. } => source.code(),
            _ => tonic::Code::Internal,
        }
    }
}

//! What storing a batch past the memory budget, or reading one back, fails
//! with: [`SpillError`], carried whole in the agent's error
//! (`AgentError::Spill`).

use std::path::PathBuf;

/// Why a spill file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    /// The spill directory's file system is full: the batch that needed the
    /// room is not stored (and whatever of it was written is removed).
    #[error(
        "spill directory {} is full: {needed} bytes needed for a batch past the memory budget ({source}); free space there, give the agent a larger volume (--work-dir) or a larger --memory-budget",
        .dir.display()
    )]
    Full {
        /// The spill directory.
        dir: PathBuf,
        /// The batch's Arrow size (what its file needed, give or take the IPC framing).
        needed: u64,
        /// The I/O error (`ENOSPC`, or a quota's `EDQUOT`).
        #[source]
        source: std::io::Error,
    },
    /// Creating, writing or opening a spill file.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, and where.
        context: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Encoding or decoding a spill file's batch.
    #[error("arrow: {0}")]
    Arrow(#[source] arrow::error::ArrowError),
    /// A spill file with no batch in it.
    #[error("spill file {} is empty", .0.display())]
    Empty(PathBuf),
}

impl SpillError {
    /// Its gRPC code: a full spill directory is an exhausted resource, any
    /// other failure the agent's own.
    pub fn code(&self) -> tonic::Code {
        match self {
            SpillError::Full { .. } => tonic::Code::ResourceExhausted,
            _ => tonic::Code::Internal,
        }
    }
}

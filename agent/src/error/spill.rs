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
    /// The batch would take the agent's spill files past the disk
    /// watermark: it is refused before it is written.
    #[error(
        "a batch of {needed} bytes past the memory budget would take this agent's spill files (all jobs) past \
         the disk watermark: they hold {held} bytes, the watermark is {watermark} (--disk-watermark, \
         KINDLING_DISK_WATERMARK): the batch is refused; finish or cancel jobs, or raise the watermark"
    )]
    Watermark {
        /// The batch's Arrow size.
        needed: u64,
        /// What the spill files hold.
        held: u64,
        /// The watermark.
        watermark: u64,
    },
    /// Spilling the batch would leave the work volume less free space than
    /// it must keep: it is refused before it is written.
    #[error(
        "spill directory {}: {free} bytes free, a batch of {needed} bytes would leave less than the {min_free} \
         the volume keeps free (--min-free-disk, KINDLING_MIN_FREE_DISK): the batch is refused",
        .dir.display()
    )]
    DiskLow {
        /// The spill directory.
        dir: PathBuf,
        /// Bytes free on its file system.
        free: u64,
        /// The batch's Arrow size.
        needed: u64,
        /// The free space kept.
        min_free: u64,
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
    /// Its gRPC code: a full spill directory, or one at its watermark, is
    /// an exhausted resource, any other failure the agent's own.
    pub fn code(&self) -> tonic::Code {
        match self {
            SpillError::Full { .. } | SpillError::Watermark { .. } | SpillError::DiskLow { .. } => {
                tonic::Code::ResourceExhausted
            }
            _ => tonic::Code::Internal,
        }
    }
}

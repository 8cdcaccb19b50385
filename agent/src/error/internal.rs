//! What fails inside the agent, with nothing the caller could change:
//! [`InternalError`] (a panicked task, local I/O, Arrow, encoding an
//! answer), carried whole in the agent's error (`AgentError::Internal`),
//! always INTERNAL.

/// Why the agent itself failed.
#[derive(Debug, thiserror::Error)]
pub enum InternalError {
    /// A task on a blocking thread panicked or was cancelled.
    #[error("{task} panicked: {source}")]
    Panicked {
        /// What ran there.
        task: &'static str,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
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
    /// A JSON response could not be encoded.
    #[error("encoding the response: {0}")]
    ResponseJson(#[source] serde_json::Error),
}

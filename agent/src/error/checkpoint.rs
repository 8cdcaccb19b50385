//! What writing, reading or receiving a checkpoint fails with:
//! [`CheckpointError`], carried whole in the agent's error
//! (`AgentError::Checkpoint`).

/// Why a checkpoint could not be written, read or received.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Writing or reading its files.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, and where.
        context: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Its metadata does not parse.
    #[error("model record: checkpoint {place}: {source}")]
    Meta {
        /// Where it was read from.
        place: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A checkpoint broadcast shorter than its lengths say.
    #[error("model record: truncated checkpoint broadcast: {part} takes {claimed} bytes, {left} are left")]
    Truncated {
        /// The part cut off: `the weights`, `the length of the metadata`…
        part: String,
        /// What it says (or, for a length, what it takes).
        claimed: u64,
        /// The bytes left of the broadcast.
        left: usize,
    },
    /// A file whose length or digest differs from what its metadata
    /// recorded (a torn write, a full disk, bit rot).
    #[error("model record: checkpoint {place}: {reason}")]
    Corrupt {
        /// The file.
        place: String,
        /// What differs.
        reason: String,
    },
}

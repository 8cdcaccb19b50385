//! [`FeedError`]: everything that can go wrong moving rows into agents.

use kindling_schemas::schema::SchemaError;

/// Everything that can go wrong moving rows into agents.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// The agent address is malformed.
    #[error("invalid agent address {addr}: {reason}")]
    Address {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The agent refused or failed a call.
    #[error("agent {agent}: {}: {}", .status.code(), .status.message())]
    Agent {
        /// The agent.
        agent: String,
        /// The gRPC status.
        #[source]
        status: Box<tonic::Status>,
    },
    /// The agent answered something that does not follow the contract.
    #[error("agent {agent} broke the protocol: {reason}")]
    Protocol {
        /// The agent.
        agent: String,
        /// What was wrong.
        reason: String,
    },
    /// Arrow encoding failed.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// Spark failed while the rows were read.
    #[error(transparent)]
    Spark(#[from] crate::spark::Error),
    /// The rows do not fit the job spec (nothing was trained).
    #[error("the data does not fit the job: {0}")]
    Data(#[from] SchemaError),
    /// Rows were lost or duplicated on the way to an agent.
    #[error("shard {shard}: sent {sent} rows but agent {agent} committed {committed}")]
    RowMismatch {
        /// Shard.
        shard: usize,
        /// Agent.
        agent: String,
        /// Rows sent.
        sent: u64,
        /// Rows committed.
        committed: u64,
    },
    /// One partition alone is more than the Spark Connect server lets a query return.
    #[error(
        "partition {partition} of the DataFrame holds {rows} rows ({bytes} bytes of Arrow), more than \
         a relayed slice may hold under the Spark Connect server's spark.driver.maxResultSize \
         ({limit} bytes, of which a slice uses three quarters): repartition the DataFrame into more \
         partitions, raise spark.driver.maxResultSize on the server, or feed with executor push \
         (Feed::ExecutorPush)"
    )]
    PartitionTooLarge {
        /// The partition.
        partition: i32,
        /// Its rows.
        rows: u64,
        /// Its Arrow bytes.
        bytes: u64,
        /// The server's limit in bytes.
        limit: u64,
    },
    /// The executors pushed a different number of rows than the DataFrame holds.
    #[error(
        "executor push of the {split} split: the DataFrame has {counted} rows but the partitions \
         pushed {pushed} ({partitions} partitions summarised)"
    )]
    PushedRows {
        /// Train or eval.
        split: &'static str,
        /// Rows the DataFrame counts.
        counted: u64,
        /// Rows the partitions' summaries report.
        pushed: u64,
        /// Partitions summarised.
        partitions: usize,
    },
    /// A partition was pushed to an agent that is not one of the job's.
    #[error(
        "executor push: partition {partition} went to agent `{agent_id}` ({address}), not one of the job's agents {job_agents:?}"
    )]
    PushedElsewhere {
        /// The partition.
        partition: u32,
        /// The agent that holds it.
        agent_id: String,
        /// The address the executor used.
        address: String,
        /// The job's agents.
        job_agents: Vec<String>,
    },
    /// Spark returned two summaries for one partition.
    #[error("executor push: partition {partition} was summarised twice (Spark returned two attempts)")]
    PartitionSummarisedTwice {
        /// The partition.
        partition: u32,
    },
    /// A partition's summary row does not follow `kindling_client.push.SUMMARY_DDL`.
    #[error("executor push: malformed summary: column `{column}`: {reason}")]
    MalformedSummary {
        /// The column.
        column: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The executors run another Python than the job is set for.
    #[error(
        "executor push: the executors run Python {} but the job is set for {configured}: set \
         ExecutorPush::python_version to theirs ({source})",
        .executors.as_deref().unwrap_or("of another version")
    )]
    PythonMismatch {
        /// The executors' version, when Spark names it.
        executors: Option<String>,
        /// The version the job is set for.
        configured: String,
        /// Spark's error.
        #[source]
        source: Box<crate::spark::Error>,
    },
}

impl FeedError {
    /// Whether a retry (or re-sending to another agent) can help.
    pub fn is_retryable(&self) -> bool {
        match self {
            FeedError::Agent { status, .. } => match status.code() {
                tonic::Code::Unavailable
                | tonic::Code::Aborted
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Unknown => true,
                // The connection closed under the call (a SIGKILLed agent):
                // CANCELLED from the transport, not the agent's own answer
                // (a cancelled job), which carries no transport error.
                tonic::Code::Cancelled => std::error::Error::source(status)
                    .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some()),
                _ => false,
            },
            FeedError::Spark(e) => e.is_retryable(),
            _ => false,
        }
    }

    /// The gRPC code, when the agent answered with one.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            FeedError::Agent { status, .. } => Some(status.code()),
            _ => None,
        }
    }
}

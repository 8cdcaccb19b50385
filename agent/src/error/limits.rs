//! What a call past one of the agent's caps or time bounds is refused with:
//! [`LimitError`], carried whole in the agent's error (`AgentError::Limit`).

use std::time::Duration;

use kindling_schemas::credential::Role;
use tonic::Code;

/// Which of the agent's bounds a call ran into.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
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
    /// A job's rows on this agent, committed and staged, hold its cap: the
    /// batch is refused.
    #[error(
        "job `{job_id}`: its rows on this agent hold {held} bytes (committed and staged), a batch of {needed} \
         would take them past the cap of {cap} (--max-job-bytes, KINDLING_MAX_JOB_BYTES): the batch is \
         refused, and the stream with it"
    )]
    JobFull {
        /// The job.
        job_id: String,
        /// Bytes its rows hold here.
        held: u64,
        /// The batch's Arrow size.
        needed: u64,
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
        role: Role,
        /// The cap.
        cap: usize,
    },
    /// As many model reads (`DoGet`, `GetFlightInfo`) are in flight as may be.
    #[error(
        "{whose} already have {cap} model reads (DoGet, GetFlightInfo) in flight on this agent, their cap \
         (--max-reads, KINDLING_MAX_READS; a job credential half of it): finish reading one first"
    )]
    TooManyReads {
        /// Whose reads: all callers', or one credential's.
        whose: String,
        /// The cap.
        cap: usize,
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
    /// A Flight message over the server's size limit (`message` is what
    /// tonic said of it).
    #[error(
        "a Flight message over this agent's cap (--max-message-bytes, KINDLING_MAX_MESSAGE_BYTES): {message}; send smaller record batches"
    )]
    MessageTooLarge {
        /// tonic's own message.
        message: String,
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
        idle: Duration,
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
        max_age: Duration,
        /// What else was lost, if anything.
        dropped: &'static str,
    },
}

impl LimitError {
    /// Its gRPC code: a cap is an exhausted resource, a time bound a deadline.
    pub fn code(&self) -> Code {
        match self {
            LimitError::StreamIdle { .. } | LimitError::StreamTooOld { .. } => Code::DeadlineExceeded,
            _ => Code::ResourceExhausted,
        }
    }
}

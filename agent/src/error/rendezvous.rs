//! What the agent's calls to a rendezvous fail with, and the job requests
//! that disagree with it: [`RendezvousError`], carried whole in the agent's
//! error (`AgentError::Rendezvous`).

use kindling_schemas::rendezvous::ClientError;
use tonic::Code;

/// Why a rendezvous could not be asked, or refused what was asked.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    /// The rendezvous refused or failed a call.
    #[error("rendezvous {url}: {source}")]
    Call {
        /// The rendezvous address.
        url: String,
        /// What the call failed with.
        #[source]
        source: Box<ClientError>,
    },
    /// The rendezvous did not answer in time.
    #[error("rendezvous {url}: timed out")]
    Timeout {
        /// The rendezvous address.
        url: String,
    },
    /// `create_job` named no rendezvous and the agent is registered with none.
    #[error("invalid input: create_job: this agent is registered with no rendezvous; pass `rendezvous`")]
    NoRendezvous,
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
    /// `start_job` with a spec whose `num_slots` contradicts the job the
    /// rendezvous holds, which was never resized.
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
}

impl RendezvousError {
    /// A failed call to the rendezvous at `url`.
    pub fn call(url: &str, source: ClientError) -> Self {
        RendezvousError::Call {
            url: url.to_owned(),
            source: Box::new(source),
        }
    }

    /// Its gRPC code. A call the rendezvous refused as the caller's own
    /// mistake (a job id that exists with other parameters, an unknown job)
    /// keeps the rendezvous' code, not the UNAVAILABLE a client would retry;
    /// an address or token that cannot work is the caller's input.
    pub fn code(&self) -> Code {
        match self {
            RendezvousError::Call { source, .. } => match &**source {
                ClientError::Rpc { source: status, .. }
                    if matches!(
                        status.code(),
                        Code::InvalidArgument
                            | Code::NotFound
                            | Code::AlreadyExists
                            | Code::FailedPrecondition
                    ) =>
                {
                    status.code()
                }
                ClientError::InvalidEndpoint { .. } | ClientError::InvalidToken(_) => Code::InvalidArgument,
                _ => Code::Unavailable,
            },
            RendezvousError::Timeout { .. } => Code::Unavailable,
            RendezvousError::NotAtRendezvous { .. } => Code::NotFound,
            RendezvousError::NoRendezvous | RendezvousError::WorldMismatch { .. } => Code::InvalidArgument,
        }
    }

    /// Whether asking again can help: a timeout, or a call its client error
    /// says is worth retrying.
    pub fn is_retryable(&self) -> bool {
        match self {
            RendezvousError::Call { source, .. } => source.is_retryable(),
            RendezvousError::Timeout { .. } => true,
            _ => false,
        }
    }
}

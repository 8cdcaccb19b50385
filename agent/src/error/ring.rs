//! What a ring operation fails with: [`RingError`], cloneable, so a broken
//! ring answers every later operation with its first failure whole (its
//! kind, peer and cause), and why this agent refuses a peer's inbound ring
//! connection ([`RingRefusal`]); the agent's error carries it as it is
//! (`AgentError::Ring`), its code and retry rule are its own.

use std::time::Duration;

use tonic::Code;

/// Why a ring operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// A ring rank outside the world.
    #[error("invalid input: rank {rank} outside a world of {world}")]
    RankOutsideWorld {
        /// The rank.
        rank: u32,
        /// The world size.
        world: u32,
    },
    /// The root of a broadcast has nothing to send.
    #[error("invalid input: broadcast root has no payload")]
    BroadcastWithoutPayload,
    /// The attempt the ring serves ended (cancelled, superseded, shutting down).
    #[error("attempt {attempt} of job `{job_id}` failed: {cause}")]
    AttemptFailed {
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
        /// Why.
        cause: String,
    },
    /// A peer could not be reached, broke the ring, or timed out.
    #[error("peer {peer} unavailable: {reason}")]
    PeerUnavailable {
        /// Address.
        peer: String,
        /// What happened.
        reason: String,
    },
    /// This agent refused a peer's inbound ring connection.
    #[error(transparent)]
    Refused(#[from] RingRefusal),
}

impl RingError {
    /// Its gRPC code: a rank or payload the caller got wrong, an attempt
    /// that ended, a peer that is gone, or the refusal's own.
    pub fn code(&self) -> Code {
        match self {
            RingError::RankOutsideWorld { .. } | RingError::BroadcastWithoutPayload => Code::InvalidArgument,
            RingError::AttemptFailed { .. } => Code::Aborted,
            RingError::PeerUnavailable { .. } => Code::Unavailable,
            RingError::Refused(refusal) => refusal.code(),
        }
    }

    /// Whether a new attempt can help: the attempt ended, or a peer failed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            RingError::AttemptFailed { .. } | RingError::PeerUnavailable { .. }
        )
    }
}

/// Why this agent refuses a peer's inbound ring connection (answered to the
/// sender as a status, through the agent's one map).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingRefusal {
    /// This agent is shutting down.
    #[error("ring connection for job `{job_id}` refused: the receiving agent is shutting down")]
    ShuttingDown {
        /// The job.
        job_id: String,
    },
    /// The connection is for an attempt older than the job's.
    #[error(
        "ring connection for attempt {attempt} of job `{job_id}` refused: the job is on attempt {current}"
    )]
    Fenced {
        /// The job.
        job_id: String,
        /// The connection's attempt.
        attempt: u32,
        /// The job's attempt on this agent.
        current: u32,
    },
    /// A job this agent is not in, past the cap on such connections.
    #[error(
        "ring connection for job `{job_id}` refused: this agent is not in that job and already holds \
         {held} connections for jobs it is not in (the cap is {cap}, each kept for {ttl:?})"
    )]
    TooManyUnjoined {
        /// The job.
        job_id: String,
        /// Connections held for jobs this agent is not in.
        held: usize,
        /// The cap.
        cap: usize,
        /// How long each is kept.
        ttl: Duration,
    },
    /// The same sender already has a connection open for this attempt.
    #[error("a ring connection from rank {from_rank} of job `{job_id}` attempt {attempt} is already open")]
    AlreadyOpen {
        /// The sender's rank.
        from_rank: u32,
        /// The job.
        job_id: String,
        /// The attempt.
        attempt: u32,
    },
    /// Over mutual TLS, a caller whose client certificate is not the
    /// agents' (a client's or an executor's, signed by the same CA).
    #[error(
        "ring connections are taken from agents only: the client certificate is not valid for `{agent_name}`, \
         the name agents check each other's certificates against"
    )]
    NotAnAgent {
        /// The agents' name (`--tls-server-name`, or the host the agent advertises).
        agent_name: String,
    },
    /// A job credential for a job that has not started on this agent.
    #[error("job `{job_id}` is not on this agent: its peer credentials are taken only once it started here")]
    JobNotHere {
        /// The job.
        job_id: String,
    },
}

impl RingRefusal {
    /// Its gRPC code.
    pub fn code(&self) -> Code {
        match self {
            RingRefusal::ShuttingDown { .. } => Code::Unavailable,
            RingRefusal::Fenced { .. } => Code::FailedPrecondition,
            RingRefusal::TooManyUnjoined { .. } => Code::ResourceExhausted,
            RingRefusal::AlreadyOpen { .. } => Code::AlreadyExists,
            RingRefusal::JobNotHere { .. } | RingRefusal::NotAnAgent { .. } => Code::PermissionDenied,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::AgentError;

    #[test]
    fn each_ring_error_keeps_its_message_code_and_retry_rule_in_the_agent_error() {
        let cases = [
            RingError::RankOutsideWorld { rank: 3, world: 2 },
            RingError::BroadcastWithoutPayload,
            RingError::AttemptFailed {
                job_id: "j".into(),
                attempt: 2,
                cause: "cancelled".into(),
            },
            RingError::PeerUnavailable {
                peer: "http://10.0.0.2:50051".into(),
                reason: "connection reset".into(),
            },
            RingError::Refused(RingRefusal::AlreadyOpen {
                from_rank: 1,
                job_id: "j".into(),
                attempt: 2,
            }),
        ];
        for ring in cases {
            let agent = AgentError::from(ring.clone());
            assert_eq!(agent.to_string(), ring.to_string());
            let retryable = matches!(
                ring,
                RingError::AttemptFailed { .. } | RingError::PeerUnavailable { .. }
            );
            assert_eq!(agent.is_retryable(), retryable, "{ring}");
            let code = match ring {
                RingError::RankOutsideWorld { .. } | RingError::BroadcastWithoutPayload => {
                    tonic::Code::InvalidArgument
                }
                RingError::AttemptFailed { .. } => tonic::Code::Aborted,
                RingError::PeerUnavailable { .. } => tonic::Code::Unavailable,
                RingError::Refused(_) => tonic::Code::AlreadyExists,
            };
            assert_eq!(tonic::Status::from(agent).code(), code, "{ring}");
        }
        let cancelled = RingError::AttemptFailed {
            job_id: "j".into(),
            attempt: 1,
            cause: "cancelled".into(),
        };
        assert!(AgentError::from(cancelled).is_cancellation());
    }
}
